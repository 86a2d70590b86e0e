/* generate: the command line's generation (run, chat): a scheduler over the
 * model (and an optional draft for KFlash) decodes one request a turn, and its
 * text streams out as it is decoded. The conversation stays in the
 * scheduler's cache between turns, so a turn feeds only what extends it.
 *
 * Ownership: struct cli_gen borrows the models and the tokenizer (which must
 * outlive it) and owns its scheduler. */
#ifndef KP_CLI_GENERATE_H
#define KP_CLI_GENERATE_H

#include "../chat/template.h"
#include "../engine/sched.h"
#include "../runtime/runtime.h"
#include "../tokenizer/tokenizer.h"

#include <signal.h>
#include <stdio.h>

struct cli_gen {
    struct sched *s;
    const struct tokenizer *tok;
    struct sampler_params sp;
    int32_t vocab, ctx;
    uint64_t rng[4]; /* the sampler's random state where the last turn stopped */
    bool rng_kept;
    bool spec_on;
    bool dim_reasoning; /* print <think>...</think> dimmed (ANSI), for a terminal */
    bool in_think;
    struct cli_gen_stats {
        int32_t n_prompt, n_cached, n_gen;
        double t_prefill, t_decode;
        int64_t spec_tokens, spec_steps; /* KFlash, over the turn */
    } last; /* the last turn */
    int64_t spec_tokens, spec_steps; /* KFlash, over all turns */
};


/* dm may be NULL (no draft). ctx: tokens over all turns; kv_type: the KV
 * caches' dtype (engine_init). -1 with err_set(). */
int cli_gen_init(struct cli_gen *g, struct model *m, struct model *dm, const struct tokenizer *tok,
                 const struct sampler_params *sp, const struct spec_params *kp, int32_t ctx, enum dtype kv_type);
void cli_gen_free(struct cli_gen *g);

/* One turn: the prompt ids[0..n) (what the cache holds of it from earlier
 * turns is reused), then up to max_tokens generated and streamed to out as
 * text (and kept in *reply if reply is not NULL, malloc'd). Stops at an
 * end-of-sequence token, or once *stop (may be NULL; a signal handler sets it)
 * is non-zero: the turn then ends with what it has, 1 returned instead of 0.
 * -1 with err_set(). */
int cli_gen_turn(struct cli_gen *g, const int32_t *ids, int32_t n, int64_t max_tokens, FILE *out, char **reply,
                 const volatile sig_atomic_t *stop);
/* The last turn's timings to f, as `ollama run --verbose` gives them: load_s
 * (the model's load; < 0: not shown), the prompt's tokens and rate, the
 * generated tokens and rate, KFlash's tokens per pass when it ran. */
void cli_gen_stats_print(const struct cli_gen *g, double load_s, FILE *f);

#endif
