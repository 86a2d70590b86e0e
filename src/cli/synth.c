/* kapitsa synth: random-weight checkpoints with the exact shapes and config of
 * real models, for benchmarks without downloads. The shapes are those of the
 * published config.json of each model (Qwen3, Qwen3.5, Qwen3-Next, Nemotron-H,
 * Nemotron 3), written in the layout its checkpoints use; weights are uniform
 * with the models' initializer std (0.02), 1-D tensors (norms, A_log, dt_bias,
 * D, biases) are 1, all stored as BF16. A MoE preset's config asks for
 * spread routing (kapitsa_route_spread, see MOE_SPREAD_ID): a random router
 * sends nearly every token to the same few experts, which no trained model
 * does, and its batches would read a fraction of the experts' bytes.
 * Beside the weights go a greedy generation_config.json and the tokenizer
 * the repository has for the family (models/qwen3-tokenizer), so that run
 * and serve take the folder as it is. */
#include "../base/err.h"
#include "../base/path.h"
#include "../model/safetensors.h"
#include "cli.h"
#include "progress.h"

#include <assert.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum family { FAM_QWEN3, FAM_QWEN3_5, FAM_QWEN3_NEXT, FAM_NEMOTRON };

struct preset {
    const char *name;
    enum family fam;
    const char *model_type;
    int32_t vocab, hidden, n_layer, n_head, n_kv_head, head_dim, inter, max_pos;
    int tied;
    int32_t n_expert, n_expert_used, moe_inter, shared_inter;
    /* hybrids: Gated DeltaNet key/value heads and dims, or Mamba2 heads,
     * head dim, groups, state; the layer pattern (nemotron) */
    int32_t lin_k_heads, lin_v_heads, lin_dim;
    int32_t ssm_heads, ssm_head_dim, ssm_groups, ssm_state;
    const char *pattern;
};

/* Shapes of the published config.json of each model. */
#define QWEN3(nm, type, H, L, nh, nkv, I, tie, ...)                                                             \
    {.name = nm, .fam = FAM_QWEN3, .model_type = type, .vocab = 151936, .hidden = H, .n_layer = L, .n_head = nh,   \
     .n_kv_head = nkv, .head_dim = 128, .inter = I, .max_pos = 40960, .tied = tie, __VA_ARGS__}
#define QWEN35(nm, fam_, type, V, H, L, nh, nkv, I, tie, kh, vh, ...)                                               \
    {.name = nm, .fam = fam_, .model_type = type, .vocab = V, .hidden = H, .n_layer = L, .n_head = nh,             \
     .n_kv_head = nkv, .head_dim = 256, .inter = I, .max_pos = 262144, .tied = tie, .lin_k_heads = kh,            \
     .lin_v_heads = vh, .lin_dim = 128, __VA_ARGS__}
static const struct preset presets[] = {
    QWEN3("qwen3-0.6b", "qwen3", 1024, 28, 16, 8, 3072, 1),
    QWEN3("qwen3-1.7b", "qwen3", 2048, 28, 16, 8, 6144, 1),
    QWEN3("qwen3-4b", "qwen3", 2560, 36, 32, 8, 9728, 1),
    QWEN3("qwen3-8b", "qwen3", 4096, 36, 32, 8, 12288, 0),
    QWEN3("qwen3-14b", "qwen3", 5120, 40, 40, 8, 17408, 0),
    QWEN3("qwen3-32b", "qwen3", 5120, 64, 64, 8, 25600, 0),
    QWEN3("qwen3-30b-a3b", "qwen3_moe", 2048, 48, 32, 4, 6144, 0, .n_expert = 128, .n_expert_used = 8,
          .moe_inter = 768),
    QWEN35("qwen3.5-0.8b", FAM_QWEN3_5, "qwen3_5", 248320, 1024, 24, 8, 2, 3584, 1, 16, 16),
    QWEN35("qwen3.5-4b", FAM_QWEN3_5, "qwen3_5", 248320, 2560, 32, 16, 4, 9216, 1, 16, 32),
    QWEN35("qwen3.5-9b", FAM_QWEN3_5, "qwen3_5", 248320, 4096, 32, 16, 4, 12288, 0, 16, 32),
    QWEN35("qwen3.5-35b-a3b", FAM_QWEN3_5, "qwen3_5_moe", 248320, 2048, 40, 16, 2, 512, 0, 16, 32, .n_expert = 256,
           .n_expert_used = 8, .moe_inter = 512, .shared_inter = 512),
    QWEN35("qwen3-next-80b-a3b", FAM_QWEN3_NEXT, "qwen3_next", 151936, 2048, 48, 16, 2, 5120, 0, 16, 32,
           .n_expert = 512, .n_expert_used = 10, .moe_inter = 512, .shared_inter = 512),
    {.name = "nemotron-nano-9b-v2", .fam = FAM_NEMOTRON, .model_type = "nemotron_h", .vocab = 131072, .hidden = 4480,
     .n_layer = 56, .n_head = 40, .n_kv_head = 8, .head_dim = 128, .inter = 15680, .max_pos = 131072,
     .ssm_heads = 128, .ssm_head_dim = 80, .ssm_groups = 8, .ssm_state = 128,
     .pattern = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"},
    {.name = "nemotron-3-nano-30b-a3b", .fam = FAM_NEMOTRON, .model_type = "nemotron_h", .vocab = 131072,
     .hidden = 2688, .n_layer = 52, .n_head = 32, .n_kv_head = 2, .head_dim = 128, .inter = 1856, .max_pos = 262144,
     .n_expert = 128, .n_expert_used = 6, .moe_inter = 1856, .shared_inter = 3712, .ssm_heads = 64,
     .ssm_head_dim = 64, .ssm_groups = 8, .ssm_state = 128,
     .pattern = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"},
};
#undef QWEN3
#undef QWEN35
#define N_PRESETS (int32_t)(sizeof presets / sizeof presets[0])

/* Whether layer l of a qwen hybrid is full attention (every 4th). */
static int full_attn(int32_t l) { return (l + 1) % 4 == 0; }

struct synth_fill {
    const struct st_wtensor *t;
    uint64_t seed;
    struct progress pr;
    int64_t written; /* bytes of the tensors filled */
};

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void synth_fill(void *ctx, int32_t i, void *buf, size_t n_bytes)
{
    struct synth_fill *f = ctx;
    uint16_t *o = buf;
    size_t n = n_bytes / 2;
    progress_update(&f->pr, f->written, f->t[i].name); /* a large preset takes minutes */
    f->written += (int64_t)n_bytes;
    if (f->t[i].n_dim == 1) { /* norms, A_log, dt_bias, D, biases */
        for (size_t j = 0; j < n; j++)
            o[j] = f32_to_bf16(1.0f);
        return;
    }
    uint64_t s = f->seed + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
    const float a = 0.02f * sqrtf(3.0f); /* uniform(-a, a) has std 0.02 */
    for (size_t j = 0; j < n; j++) {
        float u = (float)(xorshift(&s) >> 40) * (1.0f / 16777216.0f);
        o[j] = f32_to_bf16((2 * u - 1) * a);
    }
}

static int write_json(const char *dir, const char *file, json_t *j)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int rc = json_dump_file(j, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (rc != 0)
        return err_set("synth: cannot write %s", path);
    return 0;
}

/* The tensors of a preset, in the names and layouts of its checkpoints. */
static int32_t synth_tensors(const struct preset *p, struct st_wtensor *t, char *names)
{
    int32_t k = 0;
#define ADD(rows, cols, ...)                                                                                      \
    do {                                                                                                          \
        if (t) {                                                                                                  \
            char *nm = names + (size_t)k * 96;                                                                    \
            snprintf(nm, 96, __VA_ARGS__);                                                                        \
            t[k] = (struct st_wtensor){nm, DT_BF16, (rows) != 0 ? 2 : 1, {(rows) != 0 ? (rows) : (cols), (cols)}};       \
        }                                                                                                         \
        k++;                                                                                                      \
    } while (0)
#define ADD3(d0, d1, d2, ...)                                                                                     \
    do {                                                                                                          \
        if (t) {                                                                                                  \
            char *nm = names + (size_t)k * 96;                                                                    \
            snprintf(nm, 96, __VA_ARGS__);                                                                        \
            t[k] = (struct st_wtensor){nm, DT_BF16, 3, {(d0), (d1), (d2)}};                                       \
        }                                                                                                         \
        k++;                                                                                                      \
    } while (0)
    const int32_t H = p->hidden, hd = p->head_dim, qd = p->n_head * hd, kd = p->n_kv_head * hd;
    const int nemo = p->fam == FAM_NEMOTRON;
    const char *pf = p->fam == FAM_QWEN3_5 ? "model.language_model." : nemo ? "backbone." : "model.";
    ADD(p->vocab, H, nemo ? "%sembeddings.weight" : "%sembed_tokens.weight", pf);
    ADD(0, H, nemo ? "%snorm_f.weight" : "%snorm.weight", pf);
    if (!p->tied)
        ADD(p->vocab, H, "lm_head.weight");
    for (int32_t l = 0; l < p->n_layer; l++) {
        const char kind = nemo ? p->pattern[l] : p->fam == FAM_QWEN3 || full_attn(l) ? '*' : 'L';
        const int moe = nemo ? kind == 'E' : p->n_expert > 0;
        if (nemo) {
            ADD(0, H, "%slayers.%d.norm.weight", pf, l);
        } else {
            ADD(0, H, "%slayers.%d.input_layernorm.weight", pf, l);
            ADD(0, H, "%slayers.%d.post_attention_layernorm.weight", pf, l);
        }
        if (kind == '*' && nemo) {
            ADD(qd, H, "%slayers.%d.mixer.q_proj.weight", pf, l);
            ADD(kd, H, "%slayers.%d.mixer.k_proj.weight", pf, l);
            ADD(kd, H, "%slayers.%d.mixer.v_proj.weight", pf, l);
            ADD(H, qd, "%slayers.%d.mixer.o_proj.weight", pf, l);
        } else if (kind == '*') {
            const int32_t q_rows = p->fam == FAM_QWEN3 ? qd : 2 * qd; /* the hybrids add an output gate */
            ADD(q_rows, H, "%slayers.%d.self_attn.q_proj.weight", pf, l);
            ADD(kd, H, "%slayers.%d.self_attn.k_proj.weight", pf, l);
            ADD(kd, H, "%slayers.%d.self_attn.v_proj.weight", pf, l);
            ADD(H, qd, "%slayers.%d.self_attn.o_proj.weight", pf, l);
            ADD(0, hd, "%slayers.%d.self_attn.q_norm.weight", pf, l);
            ADD(0, hd, "%slayers.%d.self_attn.k_norm.weight", pf, l);
        } else if (kind == 'L') {
            const int32_t kdim = p->lin_k_heads * p->lin_dim, vdim = p->lin_v_heads * p->lin_dim;
            const int32_t cd = 2 * kdim + vdim, Hv = p->lin_v_heads;
            if (p->fam == FAM_QWEN3_NEXT) {
                ADD(cd + vdim, H, "%slayers.%d.linear_attn.in_proj_qkvz.weight", pf, l);
                ADD(2 * Hv, H, "%slayers.%d.linear_attn.in_proj_ba.weight", pf, l);
            } else {
                ADD(cd, H, "%slayers.%d.linear_attn.in_proj_qkv.weight", pf, l);
                ADD(vdim, H, "%slayers.%d.linear_attn.in_proj_z.weight", pf, l);
                ADD(Hv, H, "%slayers.%d.linear_attn.in_proj_b.weight", pf, l);
                ADD(Hv, H, "%slayers.%d.linear_attn.in_proj_a.weight", pf, l);
            }
            ADD3(cd, 1, 4, "%slayers.%d.linear_attn.conv1d.weight", pf, l);
            ADD(0, Hv, "%slayers.%d.linear_attn.A_log", pf, l);
            ADD(0, Hv, "%slayers.%d.linear_attn.dt_bias", pf, l);
            ADD(0, p->lin_dim, "%slayers.%d.linear_attn.norm.weight", pf, l);
            ADD(H, vdim, "%slayers.%d.linear_attn.out_proj.weight", pf, l);
        } else if (kind == 'M') {
            const int32_t inner = p->ssm_heads * p->ssm_head_dim, cd = inner + 2 * p->ssm_groups * p->ssm_state;
            ADD(inner + cd + p->ssm_heads, H, "%slayers.%d.mixer.in_proj.weight", pf, l);
            ADD3(cd, 1, 4, "%slayers.%d.mixer.conv1d.weight", pf, l);
            ADD(0, cd, "%slayers.%d.mixer.conv1d.bias", pf, l);
            ADD(0, p->ssm_heads, "%slayers.%d.mixer.A_log", pf, l);
            ADD(0, p->ssm_heads, "%slayers.%d.mixer.D", pf, l);
            ADD(0, p->ssm_heads, "%slayers.%d.mixer.dt_bias", pf, l);
            ADD(0, inner, "%slayers.%d.mixer.norm.weight", pf, l);
            ADD(H, inner, "%slayers.%d.mixer.out_proj.weight", pf, l);
        }
        if (nemo && kind == '-') {
            ADD(p->inter, H, "%slayers.%d.mixer.up_proj.weight", pf, l);
            ADD(H, p->inter, "%slayers.%d.mixer.down_proj.weight", pf, l);
        } else if (nemo && kind == 'E') {
            ADD(p->n_expert, H, "%slayers.%d.mixer.gate.weight", pf, l);
            ADD(0, p->n_expert, "%slayers.%d.mixer.gate.e_score_correction_bias", pf, l);
            for (int32_t e = 0; e < p->n_expert; e++) {
                ADD(p->moe_inter, H, "%slayers.%d.mixer.experts.%d.up_proj.weight", pf, l, e);
                ADD(H, p->moe_inter, "%slayers.%d.mixer.experts.%d.down_proj.weight", pf, l, e);
            }
            ADD(p->shared_inter, H, "%slayers.%d.mixer.shared_experts.up_proj.weight", pf, l);
            ADD(H, p->shared_inter, "%slayers.%d.mixer.shared_experts.down_proj.weight", pf, l);
        } else if (!nemo && moe) {
            ADD(p->n_expert, H, "%slayers.%d.mlp.gate.weight", pf, l);
            for (int32_t e = 0; e < p->n_expert; e++) {
                ADD(p->moe_inter, H, "%slayers.%d.mlp.experts.%d.gate_proj.weight", pf, l, e);
                ADD(p->moe_inter, H, "%slayers.%d.mlp.experts.%d.up_proj.weight", pf, l, e);
                ADD(H, p->moe_inter, "%slayers.%d.mlp.experts.%d.down_proj.weight", pf, l, e);
            }
            if (p->shared_inter) {
                ADD(p->shared_inter, H, "%slayers.%d.mlp.shared_expert.gate_proj.weight", pf, l);
                ADD(p->shared_inter, H, "%slayers.%d.mlp.shared_expert.up_proj.weight", pf, l);
                ADD(H, p->shared_inter, "%slayers.%d.mlp.shared_expert.down_proj.weight", pf, l);
                ADD(1, H, "%slayers.%d.mlp.shared_expert_gate.weight", pf, l);
            }
        } else if (!nemo) {
            ADD(p->inter, H, "%slayers.%d.mlp.gate_proj.weight", pf, l);
            ADD(p->inter, H, "%slayers.%d.mlp.up_proj.weight", pf, l);
            ADD(H, p->inter, "%slayers.%d.mlp.down_proj.weight", pf, l);
        }
    }
#undef ADD
#undef ADD3
    return k;
}

/* config.json of a preset in the layout its checkpoints are published in. */
static json_t *synth_config(const struct preset *p)
{
    const int moe = p->n_expert > 0;
    json_t *c = json_pack("{s:b,s:i,s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:f,s:b,s:s}", "attention_bias", 0, "head_dim",
                          p->head_dim, "hidden_act", "silu", "hidden_size", p->hidden, "intermediate_size", p->inter,
                          "max_position_embeddings", p->max_pos, "num_attention_heads", p->n_head,
                          "num_hidden_layers", p->n_layer, "num_key_value_heads", p->n_kv_head, "vocab_size",
                          p->vocab, "rms_norm_eps", 1e-6, "tie_word_embeddings", p->tied, "torch_dtype", "bfloat16");
    if (!c)
        return NULL;
    if (p->fam == FAM_NEMOTRON) {
        json_object_del(c, "hidden_act");
        json_object_set_new(c, "model_type", json_string("nemotron_h"));
        json_object_set_new(c, "architectures", json_pack("[s]", "NemotronHForCausalLM"));
        json_object_set_new(c, "hybrid_override_pattern", json_string(p->pattern));
        json_object_set_new(c, "layer_norm_epsilon", json_real(1e-5));
        json_object_set_new(c, "mamba_num_heads", json_integer(p->ssm_heads));
        json_object_set_new(c, "mamba_head_dim", json_integer(p->ssm_head_dim));
        json_object_set_new(c, "n_groups", json_integer(p->ssm_groups));
        json_object_set_new(c, "ssm_state_size", json_integer(p->ssm_state));
        json_object_set_new(c, "conv_kernel", json_integer(4));
        json_object_set_new(c, "chunk_size", json_integer(128));
        json_object_set_new(c, "use_conv_bias", json_true());
        json_object_set_new(c, "mlp_hidden_act", json_string("relu2"));
        json_object_set_new(c, "mamba_hidden_act", json_string("silu"));
        json_object_set_new(c, "time_step_min", json_real(0.001));
        json_object_set_new(c, "bos_token_id", json_integer(1));
        json_object_set_new(c, "eos_token_id", json_integer(2));
        if (moe) {
            json_object_set_new(c, "n_routed_experts", json_integer(p->n_expert));
            json_object_set_new(c, "num_experts_per_tok", json_integer(p->n_expert_used));
            json_object_set_new(c, "moe_intermediate_size", json_integer(p->moe_inter));
            json_object_set_new(c, "moe_shared_expert_intermediate_size", json_integer(p->shared_inter));
            json_object_set_new(c, "n_shared_experts", json_integer(1));
            json_object_set_new(c, "n_group", json_integer(1));
            json_object_set_new(c, "topk_group", json_integer(1));
            json_object_set_new(c, "norm_topk_prob", json_true());
            json_object_set_new(c, "routed_scaling_factor", json_real(2.5));
        }
        return c;
    }
    json_object_set_new(c, "bos_token_id", json_integer(151643));
    json_object_set_new(c, "eos_token_id", json_integer(151645));
    if (moe) {
        json_object_set_new(c, "num_experts", json_integer(p->n_expert));
        json_object_set_new(c, "num_experts_per_tok", json_integer(p->n_expert_used));
        json_object_set_new(c, "moe_intermediate_size", json_integer(p->moe_inter));
        json_object_set_new(c, "norm_topk_prob", json_true());
        json_object_set_new(c, "decoder_sparse_step", json_integer(1));
        json_object_set_new(c, "mlp_only_layers", json_array());
        if (p->shared_inter)
            json_object_set_new(c, "shared_expert_intermediate_size", json_integer(p->shared_inter));
    }
    if (p->fam == FAM_QWEN3) {
        json_object_set_new(c, "model_type", json_string(p->model_type));
        json_object_set_new(c, "architectures", json_pack("[s]", moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"));
        json_object_set_new(c, "rope_theta", json_real(1000000.0));
        json_object_set_new(c, "rope_scaling", json_null());
        return c;
    }
    json_t *types = json_array();
    for (int32_t l = 0; l < p->n_layer; l++)
        json_array_append_new(types, json_string(full_attn(l) ? "full_attention" : "linear_attention"));
    json_object_set_new(c, "layer_types", types);
    json_object_set_new(c, "full_attention_interval", json_integer(4));
    json_object_set_new(c, "linear_num_key_heads", json_integer(p->lin_k_heads));
    json_object_set_new(c, "linear_num_value_heads", json_integer(p->lin_v_heads));
    json_object_set_new(c, "linear_key_head_dim", json_integer(p->lin_dim));
    json_object_set_new(c, "linear_value_head_dim", json_integer(p->lin_dim));
    json_object_set_new(c, "linear_conv_kernel_dim", json_integer(4));
    json_object_set_new(c, "attn_output_gate", json_true());
    json_object_set_new(c, "rope_parameters", json_pack("{s:s,s:f,s:f}", "rope_type", "default", "rope_theta",
                                                        10000000.0,
                                                        "partial_rotary_factor", 0.25));
    if (p->fam == FAM_QWEN3_NEXT) {
        json_object_set_new(c, "model_type", json_string("qwen3_next"));
        json_object_set_new(c, "architectures", json_pack("[s]", "Qwen3NextForCausalLM"));
        return c;
    }
    /* Qwen3.5 is published as the multimodal wrapper; its text model sits in text_config */
    json_object_set_new(c, "model_type", json_string(moe ? "qwen3_5_moe_text" : "qwen3_5_text"));
    return json_pack("{s:[s],s:s,s:o,s:b}", "architectures",
                     moe ? "Qwen3_5MoeForConditionalGeneration" : "Qwen3_5ForConditionalGeneration", "model_type",
                     p->model_type, "text_config", c, "tie_word_embeddings", p->tied);
}

/* dir/name, a copy of the data file rel (src/base/path.h). */
static int synth_copy(const char *rel, const char *dir, const char *name)
{
    char src[4096], dst[4096], buf[1 << 16];
    if (path_data(rel, src, sizeof src) != 0)
        return -1; /* its message names rel and the places looked in */
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    FILE *in = fopen(src, "rb"), *out = in ? fopen(dst, "wb") : NULL;
    size_t n = 0;
    int rc = -1;
    if (!in || !out) {
        err_set("synth: cannot %s %s: %s", in ? "write" : "read", in ? dst : src, strerror(errno));
        goto fail;
    }
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n)
            break;
    if (ferror(in) || n > 0) {
        err_set("synth: cannot copy %s to %s", src, dst);
        goto fail;
    }
    rc = 0;
fail:
    if (out && fclose(out) != 0 && rc == 0)
        rc = err_set("synth: cannot write %s: %s", dst, strerror(errno));
    if (in)
        fclose(in);
    return rc;
}

/* The tokenizer files the repository has for a preset's family, into dir; a
 * line on stdout says which, or why there is none. */
static int synth_tokenizer(const struct preset *p, const char *dir)
{
    if (p->fam == FAM_NEMOTRON) {
        printf("no tokenizer written: Nemotron's is not in kapitsa's data (bench runs without one; for run and "
               "serve, copy tokenizer.json and tokenizer_config.json from the published checkpoint)\n");
        return 0;
    }
    if (synth_copy("qwen3-tokenizer/tokenizer.json", dir, "tokenizer.json") != 0 ||
        synth_copy("qwen3-tokenizer/tokenizer_config.json", dir, "tokenizer_config.json") != 0)
        return -1;
    if (p->fam == FAM_QWEN3_5)
        printf("tokenizer: Qwen3's, as a stand-in (Qwen3.5's own, of %d tokens, is not in kapitsa's data; Qwen3's ids "
               "all fall in this vocabulary)\n", (int)p->vocab);
    else
        printf("tokenizer: Qwen3's (models/qwen3-tokenizer)\n");
    return 0;
}

static int synth_write(const struct preset *p, const char *dir)
{
    const int32_t n = synth_tensors(p, NULL, NULL);
    struct st_wtensor *t = calloc((size_t)n, sizeof *t);
    char *names = calloc((size_t)n, 96);
    int rc = -1;
    if (!t || !names) {
        err_set("synth: out of memory");
        goto done;
    }
    synth_tensors(p, t, names);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        err_set("synth: cannot create %s: %s", dir, strerror(errno));
        goto done;
    }
    json_t *cfg = synth_config(p);
    if (cfg && p->n_expert > 0)
        json_object_set_new(cfg, "kapitsa_route_spread", json_true());
    /* greedy: random weights' sampled text tells nothing, and greedy runs repeat */
    json_t *gen = p->fam == FAM_NEMOTRON
                      ? json_pack("{s:i,s:i,s:b}", "bos_token_id", 1, "eos_token_id", 2, "do_sample", 0)
                      : json_pack("{s:i,s:[i,i],s:b}", "bos_token_id", 151643, "eos_token_id", 151645, 151643,
                                  "do_sample", 0);
    if (!cfg || !gen || write_json(dir, "config.json", cfg) != 0 ||
        write_json(dir, "generation_config.json", gen) != 0 || synth_tokenizer(p, dir) != 0)
        goto done;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct synth_fill f = {t, 0x5eed, {0}, 0};
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t e = 1;
        for (int32_t d = 0; d < t[i].n_dim; d++)
            e *= t[i].shape[d];
        total += (int64_t)dtype_bytes(t[i].type, e);
    }
    progress_begin(&f.pr, stderr, "synth", total, "B");
    rc = st_write(path, n, t, synth_fill, &f);
    progress_update(&f.pr, f.written, NULL);
    progress_end(&f.pr);
done:
    free(t);
    free(names);
    return rc;
}

static void synth_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa synth --preset NAME --out DIR [--layers N]\n"
               "  --layers N  the preset's first N layers only (same shapes, quicker to write and load)\npresets:");
    for (int32_t i = 0; i < N_PRESETS; i++)
        fprintf(f, " %s", presets[i].name);
    fprintf(f, "\n");
}

int cli_synth(int argc, char **argv)
{
    const char *name = NULL, *out = NULL, *layers = NULL;
    for (int i = 0; i < argc; i++) {
        int f;
        if ((f = cli_flag(argc, argv, &i, "--preset", &name)) == 0 &&
            (f = cli_flag(argc, argv, &i, "--out", &out)) == 0 &&
            (f = cli_flag(argc, argv, &i, "--layers", &layers)) == 0)
            return cli_arg_reject(argv[i], synth_usage);
        if (f < 0) {
            synth_usage(stderr);
            return 2;
        }
    }
    if (!name || !out) {
        synth_usage(stderr);
        return 2;
    }
    for (int32_t i = 0; i < N_PRESETS; i++)
        if (strcmp(presets[i].name, name) == 0) {
            struct preset p = presets[i];
            char pattern[128];
            if (layers) {
                const int64_t n = cli_int(layers);
                if (n < 1 || n > p.n_layer) {
                    fprintf(stderr, "kapitsa synth: --layers takes 1 to %d for %s\n", (int)p.n_layer, name);
                    return 2;
                }
                p.n_layer = (int32_t)n;
                if (p.pattern) { /* nemotron: the pattern's first n layers */
                    assert(n < (int64_t)sizeof pattern);
                    snprintf(pattern, sizeof pattern, "%.*s", (int)n, p.pattern);
                    p.pattern = pattern;
                }
            }
            if (synth_write(&p, out) != 0) {
                fprintf(stderr, "kapitsa: %s\n", err_msg());
                return 1;
            }
            printf("wrote %s (%s)\n", out, name);
            return 0;
        }
    fprintf(stderr, "kapitsa synth: unknown preset '%s'\n", name);
    synth_usage(stderr);
    return 2;
}
