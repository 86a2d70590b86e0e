/* generate: the command line's generation (see generate.h). */
#define _GNU_SOURCE
#include "generate.h"
#include "progress.h"

#include "../base/err.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* prompts this long show their prefill on a terminal */
#define GEN_PROGRESS_MIN 512

int cli_gen_init(struct cli_gen *g, struct model *m, struct model *dm, const struct tokenizer *tok,
                 const struct sampler_params *sp, const struct spec_params *kp, int32_t ctx, enum dtype kv_type)
{
    memset(g, 0, sizeof *g);
    g->tok = tok;
    g->sp = *sp;
    g->vocab = m->cfg.vocab_size;
    g->ctx = ctx;
    g->spec_on = kp->mode != SPEC_OFF;
    /* one request at a time, its prompt in chunks as large as a speculative
     * step's batch (a tree's rows, a draft's catch-up) */
    const int32_t batch = spec_engine_batch(m->be->ops->prefill_chunk);
    if (!(g->s = sched_new(m, ctx, 1, batch, batch, kv_type, dm, kp)))
        return -1;
    sched_quiet(g->s);
    return 0;
}

void cli_gen_free(struct cli_gen *g)
{
    sched_free(g->s);
    memset(g, 0, sizeof *g);
}

/* Appends k bytes to a growing string (text NULL: nothing kept). */
static int append(char **text, size_t *len, size_t *cap, const char *s, size_t k)
{
    if (!*text)
        return 0;
    while (*len + k + 1 > *cap) {
        char *p = realloc(*text, *cap *= 2);
        if (!p)
            return err_set("generate: out of memory");
        *text = p;
    }
    memcpy(*text + *len, s, k);
    *len += k;
    return 0;
}

/* Writes decoded text, dimming the reasoning block on a terminal (the think
 * tags are single added tokens, so each arrives whole in one piece). */
static void emit(struct cli_gen *g, FILE *out, const char *s, size_t k)
{
    if (g->dim_reasoning && !g->in_think && memmem(s, k, "<think>", 7)) {
        fputs("\033[2m", out);
        g->in_think = true;
    }
    fwrite(s, 1, k, out);
    if (g->dim_reasoning && g->in_think && memmem(s, k, "</think>", 8)) {
        fputs("\033[0m", out);
        g->in_think = false;
    }
    fflush(out);
}

int cli_gen_turn(struct cli_gen *g, const int32_t *ids, int32_t n, int64_t max_tokens, FILE *out, char **reply,
                 const volatile sig_atomic_t *stop)
{
    if (n < 1 || (int64_t)n + max_tokens + 1 > g->ctx)
        return err_set("generate: %d prompt tokens and %lld to generate exceed the context of %d", n,
                       (long long)max_tokens, g->ctx);
    struct sched_req *r = sched_req_new(ids, n, &g->sp, (int32_t)max_tokens, g->vocab);
    if (!r)
        return -1;
    if (g->rng_kept)
        memcpy(sched_req_sampler(r)->rng, g->rng, sizeof g->rng);
    struct sched_stats st0, st1;
    sched_get_stats(g->s, &st0);
    size_t cap = 256, len = 0;
    char *text = reply ? malloc(cap) : NULL, buf[4096];
    int rc = -1;
    if (reply && !text) {
        err_set("generate: out of memory");
        goto done;
    }
    if (sched_submit(g->s, r) != 0)
        goto done;
    struct tok_stream ts = {0};
    struct sched_progress p;
    int32_t seen = 0;
    bool stopped = false;
    /* a long prompt's prefill shows its progress on a terminal until the first token */
    struct progress pg = {0};
    const bool show = n >= GEN_PROGRESS_MIN && isatty(2);
    if (show)
        progress_begin(&pg, stderr, "prompt", n, "tokens");
    do {
        /* with a stop flag or a prefill to show, wake now and then to look (a signal does not end the wait) */
        sched_req_poll(r, seen, stop || (show && seen == 0) ? 0.05 : -1, &p);
        if (show && pg.open) {
            progress_update(&pg, p.n_prefilled, NULL);
            if (p.n_out > 0 || p.finish != SCHED_RUNNING)
                progress_end(&pg);
        }
        if (stop && *stop && !stopped) {
            sched_req_cancel(r);
            stopped = true;
        }
        for (; seen < p.n_out; seen++) {
            int32_t k = tok_stream_push(g->tok, &ts, sched_req_out(r)[seen], true, buf, sizeof buf);
            if (k > 0) {
                emit(g, out, buf, (size_t)k);
                if (append(&text, &len, &cap, buf, (size_t)k) != 0)
                    goto done;
            }
        }
    } while (p.finish == SCHED_RUNNING);
    if (p.finish != SCHED_STOP && p.finish != SCHED_LENGTH && !(stopped && p.finish == SCHED_CANCELLED)) {
        err_set("%s", sched_req_error(r));
        goto done;
    }
    int32_t k = tok_stream_flush(&ts, buf, sizeof buf);
    emit(g, out, buf, (size_t)k);
    if (g->in_think) { /* the turn ended inside its reasoning */
        fputs("\033[0m", out);
        g->in_think = false;
    }
    if (append(&text, &len, &cap, buf, (size_t)k) != 0)
        goto done;
    memcpy(g->rng, sched_req_sampler(r)->rng, sizeof g->rng);
    g->rng_kept = true;
    sched_get_stats(g->s, &st1);
    g->last = (struct cli_gen_stats){n, p.n_cached, p.n_out, p.t_prefill, p.t_decode,
                                     st1.spec_tokens - st0.spec_tokens, st1.spec_passes - st0.spec_passes};
    g->spec_tokens += g->last.spec_tokens;
    g->spec_steps += g->last.spec_steps;
    rc = stopped && p.finish == SCHED_CANCELLED;
done:
    sched_req_cancel(r); /* a no-op when it finished */
    sched_req_release(r);
    if (reply && rc >= 0) {
        text[len] = 0;
        *reply = text;
    } else {
        free(text);
    }
    return rc;
}

void cli_gen_stats_print(const struct cli_gen *g, double load_s, FILE *f)
{
    const struct cli_gen_stats *st = &g->last;
    const int32_t fed = st->n_prompt - st->n_cached;
    if (load_s >= 0)
        fprintf(f, "load duration:        %.3f s\n", load_s);
    fprintf(f, "prompt eval count:    %d token(s), %d of them from the cache\n", st->n_prompt, st->n_cached);
    fprintf(f, "prompt eval duration: %.3f s\n", st->t_prefill);
    fprintf(f, "prompt eval rate:     %.2f tokens/s\n", st->t_prefill > 0 ? fed / st->t_prefill : 0.0);
    fprintf(f, "eval count:           %d token(s)\n", st->n_gen);
    fprintf(f, "eval duration:        %.3f s\n", st->t_decode);
    /* the first token comes out of the prompt's pass: the decode time covers the rest */
    fprintf(f, "eval rate:            %.2f tokens/s\n",
            st->t_decode > 0 && st->n_gen > 1 ? (st->n_gen - 1) / st->t_decode : 0.0);
    if (g->spec_on && st->spec_steps > 0)
        fprintf(f, "KFlash:               %.2f tokens per target pass\n", (double)st->spec_tokens / st->spec_steps);
}
