/* generate: the command line's generation loop (run, chat): a model, an
 * optional draft for KFlash, one sequence kept across turns, and text streamed
 * as it is decoded.
 *
 * Ownership: struct cli_gen borrows the models and the tokenizer (which must
 * outlive it) and owns its engines, sampler and buffers. */
#ifndef KP_CLI_GENERATE_H
#define KP_CLI_GENERATE_H

#include "../chat/template.h"
#include "../engine/spec.h"
#include "../runtime/runtime.h"
#include "../tokenizer/tokenizer.h"

#include <stdio.h>

struct cli_gen {
    struct model *m;
    const struct tokenizer *tok;
    struct engine e, de;
    bool has_draft;
    struct spec k;
    struct sampler s;
    int32_t *hist; /* [ctx] the sequence's tokens (prompts and replies) */
    int32_t n_hist, ctx;
    bool dim_reasoning; /* print <think>...</think> dimmed (ANSI), for a terminal */
    bool in_think;
    struct cli_gen_stats {
        int32_t n_prompt, n_cached, n_gen;
        double t_prefill, t_decode;
        int64_t spec_tokens, spec_steps; /* KFlash, over the turn */
    } last; /* the last turn */
};


/* dm may be NULL (no draft). ctx: tokens over all turns; kv_type: the KV
 * caches' dtype (engine_init). -1 with err_set(). */
int cli_gen_init(struct cli_gen *g, struct model *m, struct model *dm, const struct tokenizer *tok,
                 const struct sampler_params *sp, const struct spec_params *kp, int32_t ctx, enum dtype kv_type);
void cli_gen_free(struct cli_gen *g);

/* One turn: the sequence becomes ids[0..n) (what it already holds of them is
 * reused; a model with recurrent layers starts over unless ids extend it), then
 * up to max_tokens are generated and streamed to out as text (and kept in
 * *reply if reply is not NULL, malloc'd). Stops at an end-of-sequence token.
 * -1 with err_set(). */
int cli_gen_turn(struct cli_gen *g, const int32_t *ids, int32_t n, int64_t max_tokens, FILE *out, char **reply);

#endif
