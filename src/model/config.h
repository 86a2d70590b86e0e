/* config: a checkpoint's config.json and generation_config.json, for every family
 * Kapitsa runs, read into one struct.
 *
 * Matches transformers' configuration classes (Qwen3Config, Qwen3MoeConfig,
 * Qwen3NextConfig, Qwen3_5TextConfig, Qwen3_5MoeTextConfig, NemotronHConfig)
 * and its rope initialisation (modeling_rope_utils: default, linear, yarn), in
 * both layouts published checkpoints use: top-level rope_theta/rope_scaling
 * (transformers 4) and rope_parameters (transformers 5). Qwen3.5 checkpoints
 * saved as the multimodal wrapper keep the text model's fields in text_config
 * and its tensors under model.language_model.; only the text part is read. */
#ifndef KP_CONFIG_H
#define KP_CONFIG_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define CFG_MAX_LAYER 256
#define CFG_MAX_EOS 8

enum arch { ARCH_QWEN3, ARCH_QWEN3_MOE, ARCH_QWEN3_NEXT, ARCH_NEMOTRON_H };
/* What a layer mixes tokens with, and what follows it (Nemotron-H layers are
 * one of the four; Qwen layers are a mixer followed by an FFN). */
enum layer_mixer { MIX_NONE, MIX_ATTN, MIX_DELTA, MIX_MAMBA };
enum layer_ffn { FFN_NONE, FFN_DENSE, FFN_MOE };
enum rope_type { ROPE_DEFAULT, ROPE_LINEAR, ROPE_YARN };

struct model_config {
    enum arch arch;
    char model_type[32];
    char prefix[32];          /* tensor name prefix of the decoder: "model.", "model.language_model.", "backbone." */
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
    bool norm_plus_one;       /* qwen3_next / qwen3_5: RMSNorm scales by (1 + weight) */
    bool attn_out_gate;       /* q_proj also yields a per-head sigmoid gate on the attention output */
    bool relu2;               /* nemotron_h: MLPs are down(relu(up x)^2), not SwiGLU */
    uint8_t layer_mixer[CFG_MAX_LAYER]; /* [n_layer] enum layer_mixer */
    uint8_t layer_ffn[CFG_MAX_LAYER];   /* [n_layer] enum layer_ffn */
    int32_t n_attn_layer;     /* layers with a KV cache */
    int32_t n_rec_layer;      /* layers with a recurrent state (DeltaNet, Mamba2) */

    enum rope_type rope_type;
    float rope_theta;
    float rope_factor;        /* linear and yarn */
    int32_t rope_orig_max;    /* yarn: original_max_position_embeddings */
    float rope_attn_factor;   /* yarn: cos/sin scale (attention_factor or derived) */
    float rope_beta_fast, rope_beta_slow;
    bool rope_truncate;
    int32_t rope_dim;         /* rotated dims per head (partial rotary); 0: no rope (nemotron_h) */

    /* Gated DeltaNet (qwen3_next, qwen3_5) */
    bool delta_qkvz_fused;    /* qwen3_next: in_proj_qkvz / in_proj_ba grouped per key head */
    int32_t lin_n_k_head, lin_n_v_head, lin_k_dim, lin_v_dim;
    int32_t conv_kernel;      /* short causal conv width (both recurrent kinds) */

    /* Mamba2 (nemotron_h) */
    int32_t ssm_n_head, ssm_head_dim, ssm_n_group, ssm_state;
    int32_t ssm_chunk;        /* scan chunk of the reference */
    bool ssm_conv_bias;
    float ssm_dt_min;         /* dt = max(softplus(dt + dt_bias), time_step_min), as transformers' torch path */
    float ssm_dt_lo, ssm_dt_hi; /* time_step_limit */
    int64_t rec_conv_dim;     /* channels of the short conv of a recurrent layer */
    int64_t rec_state_dim;    /* floats of one recurrent layer's state: [heads][k_dim][v_dim] */

    /* mixture of experts (qwen3_moe) */
    int32_t n_expert;
    int32_t n_expert_used;
    int32_t moe_intermediate_size;
    bool norm_topk_prob;
    int32_t shared_intermediate_size; /* 0: no shared expert */
    bool shared_gate;         /* qwen: shared expert output scaled by sigmoid(x . w) */
    bool router_sigmoid;      /* nemotron: sigmoid scores, bias-corrected group-limited choice */
    int32_t n_group, topk_group;
    float routed_scale;
    bool route_spread;        /* kapitsa synth's checkpoints: MOE_SPREAD_ID's picks (backend.h says why) */

    /* quantization_config {"quant_method": "fp8", "weight_block_size": [rows, cols]}:
     * the block of one weight_scale_inv entry (fp8.h); 0 0 for an unquantised checkpoint */
    int32_t fp8_block[2];

    int32_t bos_id;           /* -1 if none */
    int32_t n_eos;
    int32_t eos_id[CFG_MAX_EOS];

    /* the sampling generation_config.json asks for, the server's defaults for
     * what a request leaves out (do_sample false: greedy); where it says
     * nothing: temperature 1, every filter off */
    float gen_temperature;
    float gen_top_p;          /* 1: off */
    int32_t gen_top_k;        /* 0: off */
    float gen_min_p;          /* 0: off */
    float gen_repeat_penalty; /* 1: off */
    bool gen_given;           /* the file names at least one of them (or do_sample) */
};

/* Reads DIR/config.json (required) and DIR/generation_config.json (optional: its
 * eos/bos ids win, its sampling fields fill gen_*). -1 with err_set() naming the
 * file and field on failure. */
int config_load(struct model_config *c, const char *dir);
/* The same from parsed objects: config (config.json's, named `what` in errors)
 * and gen (generation_config.json's, or NULL). Neither is kept. */
int config_parse(struct model_config *c, json_t *config, const char *what, json_t *gen, const char *gen_what);

/* Fills inv_freq[rope_dim/2] exactly as transformers computes it in fp32. */
void config_rope_inv_freq(const struct model_config *c, float *inv_freq);

#endif
