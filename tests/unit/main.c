#define _GNU_SOURCE
/* Unit test runner: runs every registered test (or those whose name contains
 * argv[1]) and ends with "unit: N passed, N failed, N skipped". */
#include "test.h"

#include "../../src/backend/device.h"

#include <stdlib.h>
#include <string.h>

int test_failures;
static int test_skipped;

void test_skip(const char *why)
{
    printf("  skipped: %s\n", why);
    test_skipped = 1;
}

#define TESTS(X)                                                                                               \
    X(test_pool)                                                                                               \
    X(test_kern_matmul)                                                                                        \
    X(test_kern_bf16)                                                                                          \
    X(test_kern_vector)                                                                                        \
    X(test_kern_attention)                                                                                     \
    X(test_dtype_conversions)                                                                                  \
    X(test_quant_known_answers)                                                                                \
    X(test_quant_dequant_tables)                                                                               \
    X(test_quant_roundtrip_error)                                                                              \
    X(test_quant_cpu_matmul)                                                                                   \
    X(test_quant_q8)                                                                                           \
    X(test_fp8_e4m3_codes)                                                                                     \
    X(test_fp8_logits)                                                                                         \
    X(test_fp8_device)                                                                                         \
    X(test_fp8_quantize)                                                                                       \
    X(test_fp8_errors)                                                                                         \
    X(test_gguf_model_golden)                                                                                  \
    X(test_gguf_model_dequant_equal)                                                                           \
    X(test_gguf_model_q8)                                                                                      \
    X(test_gguf_model_device)                                                                                  \
    X(test_gguf_model_recipes)                                                                                 \
    X(test_gguf_model_errors)                                                                                  \
    X(test_gguf_model_llama_files)                                                                             \
    X(test_gguf_model_llama_archs)                                                                             \
    X(test_imatrix_collect)                                                                                    \
    X(test_imatrix_llama)                                                                                      \
    X(test_imatrix_moe)                                                                                        \
    X(test_imatrix_quantize)                                                                                   \
    X(test_imatrix_broken)                                                                                     \
    X(test_ops_rmsnorm_rope)                                                                                   \
    X(test_ops_attention_paged_tree)                                                                           \
    X(test_ops_attention_long)                                                                                 \
    X(test_ops_attention_tree_run)                                                                             \
    X(test_ops_moe)                                                                                            \
    X(test_ops_top_k)                                                                                          \
    X(test_moe_sort)                                                                                           \
    X(test_cuda_top_k)                                                                                         \
    X(test_cuda_matmul)                                                                                        \
    X(test_cuda_matmul_fused)                                                                                  \
    X(test_cuda_matmul_q)                                                                                      \
    X(test_cuda_attention)                                                                                     \
    X(test_cuda_rowwise)                                                                                       \
    X(test_cuda_moe)                                                                                           \
    X(test_cuda_recurrent)                                                                                     \
    X(test_cuda_prompt_scans)                                                                                  \
    X(test_cuda_tree_invariance)                                                                               \
    X(test_safetensors_roundtrip)                                                                              \
    X(test_catalog_entries)                                                                                    \
    X(test_catalog_fit)                                                                                        \
    X(test_path_data)                                                                                          \
    X(test_safetensors_broken)                                                                                 \
    X(test_safetensors_unaligned)                                                                              \
    X(test_safetensors_sharded)                                                                                \
    X(test_gguf_roundtrip)                                                                                     \
    X(test_gguf_writer_errors)                                                                                 \
    X(test_gguf_split)                                                                                         \
    X(test_gguf_broken)                                                                                        \
    X(test_config_layouts)                                                                                     \
    X(test_config_errors)                                                                                      \
    X(test_kv_cache_blocks)                                                                                    \
    X(test_kv_cache_bf16)                                                                                      \
    X(test_sampler_basic)                                                                                      \
    X(test_sampler_distribution)                                                                               \
    X(test_sampler_candidates)                                                                                 \
    X(test_sampler_top)                                                                                        \
    X(test_json_guard_grammar)                                                                                 \
    X(test_grammar_segments)                                                                                   \
    X(test_grammar_sample)                                                                                     \
    X(test_grammar_sample_call)                                                                                \
    X(test_tool_grammar_formats)                                                                               \
    X(test_tool_grammar_schema)                                                                                \
    X(test_tool_grammar_lazy)                                                                                  \
    X(test_tool_grammar_end)                                                                                   \
    X(test_tool_grammar_tokens)                                                                                \
    X(test_json_schema_grammar)                                                                                \
    X(test_json_schema_bounds)                                                                                 \
    X(test_tokenizer_goldens)                                                                                  \
    X(test_tokenizer_corpus)                                                                                   \
    X(test_tokenizer_features)                                                                                 \
    X(test_tokenizer_added_normalized)                                                                         \
    X(test_tokenizer_edges)                                                                                    \
    X(test_tokenizer_split_literal)                                                                            \
    X(test_tokenizer_long_runs)                                                                                \
    X(test_gguf_vocab_qwen3)                                                                                   \
    X(test_gguf_vocab_tiny)                                                                                    \
    X(test_chat_template_goldens)                                                                              \
    X(test_chat_openai_arguments)                                                                              \
    X(test_chat_anthropic_thinking)                                                                            \
    X(test_jinja_semantics)                                                                                    \
    X(test_jinja_bad_templates)                                                                                \
    X(test_parser_table)                                                                                       \
    X(test_model_golden)                                                                                       \
    X(test_model_threads_and_kernels)                                                                          \
    X(test_model_chunked)                                                                                      \
    X(test_model_tied_head)                                                                                    \
    X(test_model_unaligned)                                                                                    \
    X(test_model_two_sequences)                                                                                \
    X(test_model_fork_truncate)                                                                                \
    X(test_model_tree)                                                                                         \
    X(test_model_kv_bf16)                                                                                      \
    X(test_model_bf16)                                                                                         \
    X(test_model_out_top)                                                                                      \
    X(test_model_bad_batch)                                                                                    \
    X(test_model_hybrid_state)                                                                                 \
    X(test_model_hybrid_no_keep)                                                                               \
    X(test_resp_store)                                                                                         \
    X(test_sched_hybrid)                                                                                       \
    X(test_sched_hybrid_traffic)                                                                               \
    X(test_sched_spec)                                                                                         \
    X(test_sched_spec_persist)                                                                                 \
    X(test_sched_stop)                                                                                         \
    X(test_sched_top_k)                                                                                        \
    X(test_sched_prefill_chunks)                                                                               \
    X(test_sched_cache_full)                                                                                   \
    X(test_sched_resident)                                                                                     \
    X(test_spec_greedy_fixtures)                                                                               \
    X(test_spec_greedy_tiny)                                                                                   \
    X(test_spec_top)                                                                                           \
    X(test_spec_sampling)

#define DECLARE(name) void name(void);
TESTS(DECLARE)

struct test_entry {
    const char *name;
    void (*fn)(void);
};
#define ENTRY(name) {#name, name},
static const struct test_entry tests[] = {TESTS(ENTRY)};

const char *test_fixtures(void)
{
    const char *d = getenv("KAPITSA_FIXTURES");
    return d && *d ? d : "tests/fixtures";
}

struct backend *test_backend(void)
{
    const char *d = getenv("KAPITSA_TEST_DEVICE");
    return device_open(d && *d ? d : "cpu", 2, true);
}

const char *test_tmpdir(void)
{
    static char dir[256];
    if (!dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/kapitsa-test-XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            abort();
        }
    }
    return dir;
}

int main(int argc, char **argv)
{
    int passed = 0, failed = 0, skipped = 0;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        if (argc > 1 && !strstr(tests[i].name, argv[1]))
            continue;
        test_failures = 0;
        test_skipped = 0;
        tests[i].fn();
        if (test_failures) {
            printf("not ok - %s (%d failed checks)\n", tests[i].name, test_failures);
            failed++;
        } else if (test_skipped) {
            printf("ok - %s # skip\n", tests[i].name);
            skipped++;
        } else {
            printf("ok - %s\n", tests[i].name);
            passed++;
        }
        fflush(stdout);
    }
    printf("unit: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
