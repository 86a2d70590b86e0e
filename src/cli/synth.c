/* kapitsa synth: random-weight checkpoints with the exact shapes and config of
 * real models, for benchmarks without downloads. The shapes are those of the
 * published config.json of each Qwen3 model; weights are uniform with the
 * models' initializer std (0.02), norms are 1, all stored as BF16. */
#include "../base/err.h"
#include "../model/safetensors.h"
#include "cli.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct preset {
    const char *name;
    const char *model_type;
    int32_t hidden, n_layer, n_head, n_kv_head, head_dim, inter, max_pos;
    int tied;
    int32_t n_expert, n_expert_used, moe_inter;
};

static const struct preset presets[] = {
    {"qwen3-0.6b", "qwen3", 1024, 28, 16, 8, 128, 3072, 40960, 1, 0, 0, 0},
    {"qwen3-1.7b", "qwen3", 2048, 28, 16, 8, 128, 6144, 40960, 1, 0, 0, 0},
    {"qwen3-4b", "qwen3", 2560, 36, 32, 8, 128, 9728, 40960, 1, 0, 0, 0},
    {"qwen3-8b", "qwen3", 4096, 36, 32, 8, 128, 12288, 40960, 0, 0, 0, 0},
    {"qwen3-14b", "qwen3", 5120, 40, 40, 8, 128, 17408, 40960, 0, 0, 0, 0},
    {"qwen3-32b", "qwen3", 5120, 64, 64, 8, 128, 25600, 40960, 0, 0, 0, 0},
    {"qwen3-30b-a3b", "qwen3_moe", 2048, 48, 32, 4, 128, 6144, 40960, 0, 128, 8, 768},
};
#define N_PRESETS (int32_t)(sizeof presets / sizeof presets[0])
#define QWEN3_VOCAB 151936

struct synth_fill {
    const struct st_wtensor *t;
    uint64_t seed;
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
    const struct synth_fill *f = ctx;
    uint16_t *o = buf;
    size_t n = n_bytes / 2;
    if (f->t[i].n_dim == 1) { /* norm weights */
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

static int synth_write(const struct preset *p, const char *dir)
{
    const int moe = p->n_expert > 0;
    const int32_t n_per_layer = 9 + (moe ? 1 + 3 * p->n_expert : 3);
    const int32_t n = 3 + p->n_layer * n_per_layer;
    struct st_wtensor *t = calloc((size_t)n, sizeof *t);
    char *names = calloc((size_t)n, 96);
    int32_t k = 0;
    int rc = -1;
    if (!t || !names) {
        err_set("synth: out of memory");
        goto done;
    }
#define ADD(rows, cols, ...)                                                                                      \
    do {                                                                                                          \
        char *nm = names + (size_t)k * 96;                                                                        \
        snprintf(nm, 96, __VA_ARGS__);                                                                            \
        t[k] = (struct st_wtensor){nm, DT_BF16, (rows) ? 2 : 1, {(rows) ? (rows) : (cols), (cols)}};             \
        k++;                                                                                                      \
    } while (0)
    const int32_t H = p->hidden, qd = p->n_head * p->head_dim, kd = p->n_kv_head * p->head_dim;
    ADD(QWEN3_VOCAB, H, "model.embed_tokens.weight");
    ADD(0, H, "model.norm.weight");
    if (!p->tied)
        ADD(QWEN3_VOCAB, H, "lm_head.weight");
    for (int32_t l = 0; l < p->n_layer; l++) {
        ADD(0, H, "model.layers.%d.input_layernorm.weight", l);
        ADD(0, H, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(qd, H, "model.layers.%d.self_attn.q_proj.weight", l);
        ADD(kd, H, "model.layers.%d.self_attn.k_proj.weight", l);
        ADD(kd, H, "model.layers.%d.self_attn.v_proj.weight", l);
        ADD(H, qd, "model.layers.%d.self_attn.o_proj.weight", l);
        ADD(0, p->head_dim, "model.layers.%d.self_attn.q_norm.weight", l);
        ADD(0, p->head_dim, "model.layers.%d.self_attn.k_norm.weight", l);
        if (moe) {
            ADD(p->n_expert, H, "model.layers.%d.mlp.gate.weight", l);
            for (int32_t e = 0; e < p->n_expert; e++) {
                ADD(p->moe_inter, H, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
                ADD(p->moe_inter, H, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
                ADD(H, p->moe_inter, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
            }
        } else {
            ADD(p->inter, H, "model.layers.%d.mlp.gate_proj.weight", l);
            ADD(p->inter, H, "model.layers.%d.mlp.up_proj.weight", l);
            ADD(H, p->inter, "model.layers.%d.mlp.down_proj.weight", l);
        }
    }
#undef ADD
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        err_set("synth: cannot create %s: %s", dir, strerror(errno));
        goto done;
    }
    json_t *cfg = json_pack("{s:[s],s:b,s:f,s:i,s:i,s:i,s:s,s:i,s:i,s:s,s:i,s:i,s:i,s:i,s:i,s:f,s:f,s:n,s:b,s:s,s:i}",
                            "architectures", moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM", "attention_bias", 0,
                            "attention_dropout", 0.0, "bos_token_id", 151643, "eos_token_id", 151645, "head_dim",
                            p->head_dim, "hidden_act", "silu", "hidden_size", H, "intermediate_size", p->inter,
                            "model_type", p->model_type, "max_position_embeddings", p->max_pos,
                            "num_attention_heads", p->n_head, "num_hidden_layers", p->n_layer,
                            "num_key_value_heads", p->n_kv_head, "vocab_size", QWEN3_VOCAB, "rms_norm_eps", 1e-6,
                            "rope_theta", 1000000.0, "rope_scaling", "tie_word_embeddings", p->tied, "torch_dtype",
                            "bfloat16", "max_window_layers", p->n_layer);
    if (moe) {
        json_object_set_new(cfg, "num_experts", json_integer(p->n_expert));
        json_object_set_new(cfg, "num_experts_per_tok", json_integer(p->n_expert_used));
        json_object_set_new(cfg, "moe_intermediate_size", json_integer(p->moe_inter));
        json_object_set_new(cfg, "norm_topk_prob", json_true());
        json_object_set_new(cfg, "decoder_sparse_step", json_integer(1));
        json_object_set_new(cfg, "mlp_only_layers", json_array());
    }
    json_t *gen = json_pack("{s:i,s:[i,i],s:b}", "bos_token_id", 151643, "eos_token_id", 151645, 151643,
                            "do_sample", 1);
    if (!cfg || !gen || write_json(dir, "config.json", cfg) != 0 || write_json(dir, "generation_config.json", gen) != 0)
        goto done;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct synth_fill f = {t, 0x5eed};
    rc = st_write(path, k, t, synth_fill, &f);
done:
    free(t);
    free(names);
    return rc;
}

static void synth_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa synth --preset NAME --out DIR\npresets:");
    for (int32_t i = 0; i < N_PRESETS; i++)
        fprintf(f, " %s", presets[i].name);
    fprintf(f, "\n");
}

int cli_synth(int argc, char **argv)
{
    const char *name = NULL, *out = NULL;
    for (int i = 0; i < argc; i++) {
        int f;
        if (strcmp(argv[i], "--help") == 0) {
            synth_usage(stdout);
            return 0;
        }
        if ((f = cli_flag(argc, argv, &i, "--preset", &name)) == 0)
            f = cli_flag(argc, argv, &i, "--out", &out);
        if (f <= 0) {
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
            if (synth_write(&presets[i], out) != 0) {
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
