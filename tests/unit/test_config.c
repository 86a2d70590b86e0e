/* Tests of config.json reading: both rope layouts, rope types, MoE fields,
 * eos lists, generation_config overrides, and clear errors for bad configs. */
#include "../../src/base/err.h"
#include "../../src/model/config.h"
#include "test.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static const char *write_cfg(const char *name, const char *cfg, const char *gen)
{
    static char dir[512];
    char path[600];
    snprintf(dir, sizeof dir, "%s/cfg_%s", test_tmpdir(), name);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs(cfg, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (gen) {
        f = fopen(path, "w");
        fputs(gen, f);
        fclose(f);
    } else {
        remove(path);
    }
    return dir;
}

#define BASE "\"vocab_size\":512,\"hidden_size\":64,\"num_hidden_layers\":4,\"num_attention_heads\":4,\"intermediate_size\":128"

void test_config_layouts(void)
{
    struct model_config c;
    /* transformers 4 layout, head_dim derived, eos list in generation_config */
    const char *d = write_cfg("old", "{\"model_type\":\"qwen3\"," BASE ",\"rope_theta\":5000.0,\"rope_scaling\":null,"
                                     "\"eos_token_id\":1,\"tie_word_embeddings\":true}",
                              "{\"eos_token_id\":[7,9],\"bos_token_id\":3}");
    CHECK(config_load(&c, d) == 0, "%s", err_msg());
    CHECK(c.arch == ARCH_QWEN3 && c.head_dim == 16 && c.n_kv_head == 4 && c.tie_embeddings, "fields");
    CHECK(c.rope_type == ROPE_DEFAULT && c.rope_theta == 5000.0f && c.rope_dim == 16, "rope");
    CHECK(c.n_eos == 2 && c.eos_id[0] == 7 && c.eos_id[1] == 9 && c.bos_id == 3, "eos from generation_config");
    CHECK(c.gen_temperature == 1.0f && c.gen_top_p == 1.0f && c.gen_top_k == 0 && c.gen_min_p == 0.0f &&
              c.gen_repeat_penalty == 1.0f && !c.gen_given,
          "no sampling fields: temperature 1, filters off");
    float inv[16];
    config_rope_inv_freq(&c, inv);
    CHECK(fabsf(inv[0] - 1.0f) < 1e-7f && fabsf(inv[1] - powf(5000.0f, -2.0f / 16)) < 1e-7f, "inv_freq");
    /* Qwen3's sampling; then do_sample false: greedy */
    d = write_cfg("gen", "{\"model_type\":\"qwen3\"," BASE "}",
                  "{\"do_sample\":true,\"temperature\":0.6,\"top_k\":20,\"top_p\":0.95,\"min_p\":0.05,"
                  "\"repetition_penalty\":1.1}");
    CHECK(config_load(&c, d) == 0, "%s", err_msg());
    CHECK(c.gen_temperature == 0.6f && c.gen_top_k == 20 && c.gen_top_p == 0.95f && c.gen_min_p == 0.05f &&
              c.gen_repeat_penalty == 1.1f && c.gen_given,
          "sampling from generation_config");
    d = write_cfg("greedy", "{\"model_type\":\"qwen3\"," BASE "}", "{\"do_sample\":false,\"temperature\":0.6}");
    CHECK(config_load(&c, d) == 0 && c.gen_temperature == 0.0f, "do_sample false: greedy");

    /* transformers 5 layout with linear scaling */
    d = write_cfg("lin", "{\"model_type\":\"qwen3\"," BASE ",\"head_dim\":32,\"num_key_value_heads\":2,"
                         "\"rope_parameters\":{\"rope_type\":\"linear\",\"factor\":2.0,\"rope_theta\":10000.0}}", NULL);
    CHECK(config_load(&c, d) == 0, "%s", err_msg());
    CHECK(c.rope_type == ROPE_LINEAR && c.rope_factor == 2.0f && c.head_dim == 32 && c.n_kv_head == 2, "linear");
    config_rope_inv_freq(&c, inv);
    CHECK(fabsf(inv[0] - 0.5f) < 1e-7f, "linear divides by factor: %g", inv[0]);

    /* YaRN in the old layout: attention factor 0.1 ln(4) + 1, ramp between the
     * correction dims (dim 32, base 10000, original 2048: 4.03 and 10.05, so 4 and 11 after truncation) */
    d = write_cfg("yarn", "{\"model_type\":\"qwen3\"," BASE ",\"head_dim\":32,\"max_position_embeddings\":8192,"
                          "\"rope_theta\":10000.0,\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0,"
                          "\"original_max_position_embeddings\":2048}}", NULL);
    CHECK(config_load(&c, d) == 0, "%s", err_msg());
    CHECK(c.rope_type == ROPE_YARN && fabsf(c.rope_attn_factor - (float)(0.1 * log(4.0) + 1)) < 1e-6f, "yarn mscale");
    float yi[16];
    config_rope_inv_freq(&c, yi);
    for (int i = 0; i < 16; i++) {
        double base = pow(10000.0, -2.0 * i / 32), ramp = (i - 4) / 7.0;
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double want = base / 4 * ramp + base * (1 - ramp);
        CHECK(fabs(yi[i] - want) <= 1e-6 * want, "yarn inv_freq[%d] %g want %g", i, yi[i], want);
    }

    /* qwen3_moe with mlp_only_layers and decoder_sparse_step */
    d = write_cfg("moe", "{\"model_type\":\"qwen3_moe\"," BASE ",\"num_experts\":8,\"num_experts_per_tok\":2,"
                         "\"moe_intermediate_size\":32,\"decoder_sparse_step\":2,\"mlp_only_layers\":[3],"
                         "\"norm_topk_prob\":true,\"eos_token_id\":[1,2]}", NULL);
    CHECK(config_load(&c, d) == 0, "%s", err_msg());
    CHECK(c.n_expert == 8 && c.n_expert_used == 2 && c.norm_topk_prob, "moe fields");
    CHECK(c.layer_ffn[0] == FFN_DENSE && c.layer_ffn[1] == FFN_MOE && c.layer_ffn[2] == FFN_DENSE &&
              c.layer_ffn[3] == FFN_DENSE,
          "sparse layers");
    CHECK(c.n_eos == 2 && c.eos_id[1] == 2, "eos list");
}

void test_config_errors(void)
{
    struct {
        const char *cfg;
        const char *want;
    } cases[] = {
        {"{\"model_type\":\"llama\"," BASE "}", "model_type 'llama' is not supported"},
        {"{" BASE "}", "missing field 'model_type'"},
        {"{\"model_type\":\"qwen3\",\"vocab_size\":512}", "missing field 'hidden_size'"},
        {"{\"model_type\":\"qwen3\"," BASE ",\"num_key_value_heads\":3}", "not a multiple"},
        {"{\"model_type\":\"qwen3\"," BASE ",\"rms_norm_eps\":\"small\"}", "'rms_norm_eps' must be a number"},
        {"{\"model_type\":\"qwen3\"," BASE ",\"rope_scaling\":{\"rope_type\":\"longrope\"}}", "rope_type 'longrope'"},
        {"{\"model_type\":\"qwen3\"," BASE ",\"eos_token_id\":\"x\"}", "eos_token_id"},
        {"{\"model_type\":\"qwen3\"," BASE ",\"tie_word_embeddings\":1}", "true or false"},
        {"{\"model_type\":\"qwen3_moe\"," BASE ",\"num_experts\":4,\"num_experts_per_tok\":8,"
         "\"moe_intermediate_size\":4}", "num_experts_per_tok"},
        {"{\"model_type\":\"qwen3_moe\"," BASE ",\"num_experts\":4,\"num_experts_per_tok\":2}",
         "missing field 'moe_intermediate_size'"},
        {"{\"model_type\":\"qwen3\"," BASE ",\"num_hidden_layers\":-1}", "'num_hidden_layers' must be an integer"},
        {"{\"model_type\":\"qwen3\"," BASE, "config.json"},
        {"[]", "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[16];
        snprintf(name, sizeof name, "bad%zu", i);
        const char *d = write_cfg(name, cases[i].cfg, NULL);
        struct model_config c;
        CHECK(config_load(&c, d) != 0, "case %zu loaded", i);
        CHECK(strstr(err_msg(), cases[i].want) && strstr(err_msg(), "config.json"), "case %zu: '%s' lacks '%s'", i,
              err_msg(), cases[i].want);
    }
    const char *d = write_cfg("badgen", "{\"model_type\":\"qwen3\"," BASE "}", "{\"eos_token_id\":[1,\"a\"]}");
    struct model_config c;
    CHECK(config_load(&c, d) != 0 && strstr(err_msg(), "generation_config.json"), "%s", err_msg());
    const char *badgen[][2] = {{"{\"top_p\":0}", "'top_p' is out of range"},
                               {"{\"temperature\":-1}", "'temperature' is out of range"},
                               {"{\"top_k\":-5}", "'top_k' must be an integer"},
                               {"{\"min_p\":2}", "'min_p' is out of range"},
                               {"{\"repetition_penalty\":0}", "'repetition_penalty' is out of range"},
                               {"{\"do_sample\":\"yes\"}", "true or false"}};
    for (size_t i = 0; i < sizeof badgen / sizeof badgen[0]; i++) {
        d = write_cfg("badsamp", "{\"model_type\":\"qwen3\"," BASE "}", badgen[i][0]);
        CHECK(config_load(&c, d) != 0 && strstr(err_msg(), badgen[i][1]) && strstr(err_msg(), "generation_config.json"),
              "%s: '%s'", badgen[i][0], err_msg());
    }
}
