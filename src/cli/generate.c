/* generate: the command line's generation loop (see generate.h). */
#define _GNU_SOURCE
#include "generate.h"

#include "../base/err.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static int is_eos(const struct model_config *c, int32_t t)
{
    for (int32_t i = 0; i < c->n_eos; i++)
        if (c->eos_id[i] == t)
            return 1;
    return 0;
}

int cli_gen_init(struct cli_gen *g, struct model *m, struct model *dm, const struct tokenizer *tok,
                 const struct sampler_params *sp, const struct spec_params *kp, int32_t ctx, enum dtype kv_type)
{
    memset(g, 0, sizeof *g);
    g->m = m;
    g->tok = tok;
    g->ctx = ctx + kp->n_nodes + 2; /* a tree is written beyond the committed tokens */
    const int32_t keep = kp->mode == SPEC_OFF ? 0 : kp->n_nodes + 1;
    const int32_t batch = spec_engine_batch(m->be->ops->prefill_chunk), n_out = spec_engine_out(batch);
    if (engine_init(&g->e, m, g->ctx, 1, batch, n_out, keep, kv_type) != 0)
        return -1;
    if (dm && engine_init(&g->de, dm, g->ctx, 1, batch, n_out, 256, kv_type) != 0)
        goto fail;
    g->has_draft = dm != NULL;
    g->hist = malloc(sizeof(int32_t) * (size_t)(g->ctx + 1));
    if (!g->hist) {
        err_set("generate: out of memory");
        goto fail;
    }
    if (sampler_init(&g->s, sp, m->cfg.vocab_size) != 0)
        goto fail;
    if (spec_init(&g->k, &g->e, engine_seq_new(&g->e), dm ? &g->de : NULL, dm ? engine_seq_new(&g->de) : -1, kp,
                  g->ctx) != 0)
        goto fail;
    return 0;
fail:
    cli_gen_free(g);
    return -1;
}

void cli_gen_free(struct cli_gen *g)
{
    spec_free(&g->k);
    sampler_free(&g->s);
    free(g->hist);
    if (g->has_draft)
        engine_free(&g->de);
    if (g->e.m)
        engine_free(&g->e);
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

/* Cuts a sequence back to its first len tokens; on a model that cannot, a new one. */
static int32_t seq_cut(struct engine *e, int32_t seq, int32_t len)
{
    if (e->kv.len[seq] <= len)
        return seq;
    if (engine_seq_truncate(e, seq, len) == 0)
        return seq;
    engine_seq_free(e, seq);
    return engine_seq_new(e);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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

int cli_gen_turn(struct cli_gen *g, const int32_t *ids, int32_t n, int64_t max_tokens, FILE *out, char **reply)
{
    if (n < 1 || (int64_t)n + max_tokens + 1 > g->ctx - g->k.p.n_nodes - 2)
        return err_set("generate: %d prompt tokens and %lld to generate exceed the context of %d", n,
                       (long long)max_tokens, g->ctx - g->k.p.n_nodes - 2);
    /* keep what the sequences hold of ids, but at least the last token to feed */
    int32_t c = 0;
    while (c < n - 1 && c < g->n_hist && g->hist[c] == ids[c])
        c++;
    int32_t ts = seq_cut(&g->e, g->k.tseq, c), ds = g->has_draft ? seq_cut(&g->de, g->k.dseq, c) : -1;
    if (ts < 0 || (g->has_draft && ds < 0))
        return -1;
    spec_reset(&g->k, ts, ds);
    const double t0 = now_s();
    const int64_t tok0 = g->k.st.tokens, steps0 = g->k.st.steps;
    g->last = (struct cli_gen_stats){.n_prompt = n, .n_cached = c};
    float *logits = malloc(sizeof(float) * (size_t)g->m->cfg.vocab_size);
    size_t cap = 256, len = 0;
    char *text = reply ? malloc(cap) : NULL, buf[4096];
    int rc = -1;
    if (!logits || (reply && !text)) {
        err_set("generate: out of memory");
        goto done;
    }
    if (spec_prefill(&g->k, ids, n, logits) != 0)
        goto done;
    memcpy(g->hist, ids, sizeof(int32_t) * (size_t)n);
    g->n_hist = n;
    const double t1 = now_s();
    g->last.t_prefill = t1 - t0;
    int32_t n_new = 1;
    g->hist[n] = sampler_sample(&g->s, logits, g->hist, n);
    struct tok_stream st = {0};
    int64_t made = 0;
    for (;;) {
        /* hist[n_hist .. n_hist+n_new) are new: print them up to an end of sequence */
        int stop = 0;
        for (int32_t j = 0; j < n_new && made < max_tokens && !stop; j++, made++) {
            int32_t t = g->hist[g->n_hist];
            if ((stop = is_eos(&g->m->cfg, t)))
                break;
            g->n_hist++;
            int32_t k = tok_stream_push(g->tok, &st, t, true, buf, sizeof buf);
            if (k > 0) {
                emit(g, out, buf, (size_t)k);
                if (append(&text, &len, &cap, buf, (size_t)k) != 0)
                    goto done;
            }
        }
        if (stop || made >= max_tokens)
            break;
        /* hist[n_hist-1] is pending: one step writes the next tokens after it */
        n_new = spec_step(&g->k, &g->s, g->hist, g->n_hist, g->hist + g->n_hist, (int32_t)(max_tokens - made));
        if (n_new < 1)
            goto done;
    }
    g->last.n_gen = (int32_t)made;
    int32_t k = tok_stream_flush(&st, buf, sizeof buf);
    emit(g, out, buf, (size_t)k);
    if (g->in_think) { /* the turn ended inside its reasoning */
        fputs("\033[0m", out);
        g->in_think = false;
    }
    g->last.t_decode = now_s() - t1;
    g->last.spec_tokens = g->k.st.tokens - tok0;
    g->last.spec_steps = g->k.st.steps - steps0;
    if (append(&text, &len, &cap, buf, (size_t)k) != 0)
        goto done;
    /* the sequence holds the tokens fed; the last printed one was never fed */
    g->n_hist = g->e.kv.len[g->k.tseq];
    rc = 0;
done:
    free(logits);
    if (reply && rc == 0) {
        text[len] = 0;
        *reply = text;
    } else {
        free(text);
    }
    return rc;
}
