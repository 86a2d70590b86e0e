/* config: a checkpoint's config.json and generation_config.json, for every family
 * Kapitsa runs, read into one struct.
 *
 * Matches transformers' configuration classes (Qwen3Config, Qwen3MoeConfig) and
 * its rope initialisation (modeling_rope_utils: default, linear, yarn), in both
 * layouts published checkpoints use: top-level rope_theta/rope_scaling
 * (transformers 4) and rope_parameters (transformers 5). */
#ifndef KP_CONFIG_H
#define KP_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#define CFG_MAX_LAYER 256
#define CFG_MAX_EOS 8

enum arch { ARCH_QWEN3, ARCH_QWEN3_MOE };
enum rope_type { ROPE_DEFAULT, ROPE_LINEAR, ROPE_YARN };

struct model_config {
    enum arch arch;
    char model_type[32];
    int32_t vocab_size;
    int32_t hidden_size;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_kv_head;
    int32_t head_dim;
    int32_t intermediate_size;
    int32_t max_position;
    float rms_eps;
    bool tie_embeddings;

    enum rope_type rope_type;
    float rope_theta;
    float rope_factor;        /* linear and yarn */
    int32_t rope_orig_max;    /* yarn: original_max_position_embeddings */
    float rope_attn_factor;   /* yarn: cos/sin scale (attention_factor or derived) */
    float rope_beta_fast, rope_beta_slow;
    bool rope_truncate;
    int32_t rope_dim;         /* rotated dims per head (partial rotary) */

    /* mixture of experts (qwen3_moe) */
    int32_t n_expert;
    int32_t n_expert_used;
    int32_t moe_intermediate_size;
    bool norm_topk_prob;
    bool layer_moe[CFG_MAX_LAYER]; /* [n_layer] 1 = sparse MoE block, 0 = dense MLP */

    int32_t bos_id;           /* -1 if none */
    int32_t n_eos;
    int32_t eos_id[CFG_MAX_EOS];
};

/* Reads DIR/config.json (required) and DIR/generation_config.json (optional: its
 * eos/bos ids win). -1 with err_set() naming the file and field on failure. */
int config_load(struct model_config *c, const char *dir);

/* Fills inv_freq[rope_dim/2] exactly as transformers computes it in fp32. */
void config_rope_inv_freq(const struct model_config *c, float *inv_freq);

#endif
