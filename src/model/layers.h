/* layers: forward pieces every architecture shares: the residual-stream trace,
 * the SwiGLU / relu^2 MLP, the MoE block (routed experts plus an optional
 * shared expert) and the final norm + LM head. Each works on the first n rows
 * of the model scratch and allocates nothing. */
#ifndef KP_LAYERS_H
#define KP_LAYERS_H

#include "model.h"

/* trace->hidden[i] <- x (n rows), when asked for. */
void layers_trace(const struct model *m, const struct model_trace *trace, int32_t i, const struct tensor *x, int32_t n);
/* The residual stream of a forward of n tokens: the first n rows of the x
 * scratch, holding their embeddings (traced as layer 0's input). */
struct tensor layers_embed(const struct model *m, struct model_scratch *s, int32_t n, const struct model_trace *trace);
/* out[i] = (RMSNorm(x) * norm) w[i]^T for n_w <= MM_MAX_W weights: a mixer's
 * input products with its norm folded in; uses the h scratch. */
void layers_norm_in(const struct model *m, struct model_scratch *s, const struct tensor *norm, int32_t n_w,
                    struct tensor *const *out, const struct tensor *const *w, const struct tensor *x);
/* x += y w^T: a mixer's out-projection added to the residual; uses the h scratch. */
void layers_residual(const struct model *m, struct model_scratch *s, struct tensor *x, const struct tensor *y,
                     const struct tensor *w);
/* x += down(act(RMSNorm(x) * norm)), the layer's dense MLP (SwiGLU, or relu^2
 * for nemotron_h) with its norm and residual; uses the h, g, u, ffn scratch. */
void layers_mlp(const struct model *m, struct model_scratch *s, const struct layer_weights *L, const struct tensor *norm,
                struct tensor *x, int32_t n);
/* x += the routed experts of RMSNorm(x) * norm (+ the shared expert, gated
 * by sigmoid(h . w) on qwen); uses the h, router, ids, weights, moe_ws, and
 * with a shared expert the g, u, ffn, ffn2 scratch. */
void layers_moe(const struct model *m, struct model_scratch *s, const struct layer_weights *L, const struct tensor *norm,
                struct tensor *x, int32_t n);
/* Layer l's feed-forward block on x after RMSNorm by norm: the MoE block or
 * the dense MLP, as the config says. */
void layers_ffn(const struct model *m, struct model_scratch *s, int32_t l, const struct tensor *norm, struct tensor *x,
                int32_t n);
/* Final norm of x into the trace slot n_layer, then the logits of the batch's output rows. */
void layers_logits(const struct model *m, struct model_scratch *s, const struct tensor *x, int32_t n, int32_t n_out,
                   const struct model_trace *trace);

/* After a forward: the logits of batch row `row` (its final-norm hidden state is
 * still in the scratch) into the first row of the scratch logits, returned
 * (backend memory; valid until the next forward or call). */
struct tensor layers_logits_row(const struct model *m, struct model_scratch *s, int32_t row);

#endif
