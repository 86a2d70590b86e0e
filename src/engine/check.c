/* check: prefill and greedy-decode comparison with golden.safetensors (see check.h). */
#include "check.h"

#include "../base/err.h"
#include "../model/model.h"
#include "engine.h"
#include "sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct st_tensor *golden_get(const struct safetensors *g, const char *name, enum dtype type,
                                          int64_t d0, int64_t d1)
{
    const struct st_tensor *t = st_find(g, name);
    if (!t) {
        err_set("check: %s: missing tensor '%s'", g->n_files ? g->files[0].path : "?", name);
        return NULL;
    }
    if (t->type != type || t->n_dim != (d1 ? 2 : 1) || (d0 && t->shape[0] != d0) || (d1 && t->shape[1] != d1)) {
        err_set("check: %s: tensor '%s' has the wrong dtype or shape", t->file, name);
        return NULL;
    }
    return t;
}

static float max_abs_diff(const float *a, const float *b, int64_t n)
{
    float m = 0;
    for (int64_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m)) /* NaN counts as infinitely wrong */
            m = isnan(d) ? INFINITY : d;
    }
    return m;
}

struct check_bufs {
    float *logits, **hidden;
    int32_t *pos, *seq, *parent;
    uint8_t *want;
};

static int check_prefill(struct engine *e, const struct check_opts *o, const int32_t *ids, int32_t L,
                         struct check_bufs *b, const struct model_trace *trace)
{
    const int32_t V = e->m->cfg.vocab_size;
    int32_t seq = engine_seq_new(e);
    if (seq < 0)
        return -1;
    for (int32_t done = 0, c = 0; done < L; c++) {
        int32_t n = o->n_chunks ? o->chunk[c % o->n_chunks] : L;
        if (n > L - done)
            n = L - done;
        for (int32_t i = 0; i < n; i++) {
            b->pos[i] = done + i;
            b->seq[i] = seq;
            b->parent[i] = i - 1;
            b->want[i] = 1;
        }
        struct batch bt = {n, ids + done, b->pos, b->seq, b->parent, b->want};
        if (engine_forward(e, &bt, b->logits + (int64_t)done * V, trace) < 0 || engine_commit_all(e) != 0)
            return -1;
        done += n;
    }
    engine_seq_free(e, seq);
    return 0;
}

static int check_greedy(struct engine *e, const int32_t *prompt, int32_t n_prompt, const int32_t *want,
                        int32_t n_gen, struct check_bufs *b, struct check_result *r)
{
    const int32_t V = e->m->cfg.vocab_size;
    int32_t seq = engine_seq_new(e);
    if (seq < 0)
        return -1;
    for (int32_t i = 0; i < n_prompt; i++) {
        b->pos[i] = i;
        b->seq[i] = seq;
        b->parent[i] = i - 1;
        b->want[i] = i == n_prompt - 1;
    }
    struct batch bt = {n_prompt, prompt, b->pos, b->seq, b->parent, b->want};
    if (engine_forward(e, &bt, b->logits, NULL) < 0 || engine_commit_all(e) != 0)
        return -1;
    r->n_greedy = n_gen;
    r->greedy_match = 0;
    r->greedy_first_bad = -1;
    for (int32_t g = 0; g < n_gen; g++) {
        int32_t tok = sampler_argmax(b->logits, V);
        if (tok != want[g]) {
            r->greedy_first_bad = g;
            r->greedy_got = tok;
            r->greedy_want = want[g];
            break;
        }
        r->greedy_match++;
        /* feed the reference id so a mismatch is reported once, at its step */
        int32_t pos = n_prompt + g, par = -1;
        uint8_t one = 1;
        struct batch d = {1, &want[g], &pos, &seq, &par, &one};
        if (engine_forward(e, &d, b->logits, NULL) < 0 || engine_commit_all(e) != 0)
            return -1;
    }
    engine_seq_free(e, seq);
    return 0;
}

int check_run(const char *dir, struct backend *be, const struct check_opts *o, struct check_result *r)
{
    char path[4096];
    struct safetensors g = {0};
    struct model m = {0};
    struct engine e = {0};
    struct check_bufs b = {0};
    int rc = -1, loaded = 0, engine_up = 0;
    memset(r, 0, sizeof *r);
    if (o->golden)
        snprintf(path, sizeof path, "%s", o->golden);
    else
        snprintf(path, sizeof path, "%s/golden.safetensors", dir);
    if (st_open_file(&g, path) != 0)
        goto done;
    struct model_opts mo = {.rope_freq_stored_dtype = !o->rope_freq_f32};
    if (model_load(&m, dir, be, &mo) != 0)
        goto done;
    loaded = 1;
    const struct model_config *c = &m.cfg;
    const struct st_tensor *ids = golden_get(&g, "prefill_ids", DT_I32, 0, 0);
    if (!ids)
        goto done;
    const int32_t L = (int32_t)ids->shape[0], V = c->vocab_size, H = c->hidden_size;
    const struct st_tensor *want_logits = golden_get(&g, "prefill_logits", DT_F32, L, V);
    const struct st_tensor *prompt = golden_get(&g, "prompt_ids", DT_I32, 0, 0);
    const struct st_tensor *greedy = want_logits && prompt ? golden_get(&g, "greedy_ids", DT_I32, 0, 0) : NULL;
    if (!greedy)
        goto done;
    const int32_t n_prompt = (int32_t)prompt->shape[0], n_gen = (int32_t)greedy->shape[0];
    if (L < 1 || n_prompt < 1 || c->n_layer + 1 > CHECK_MAX_LAYER) {
        err_set("check: %s: empty inputs", path);
        goto done;
    }
    const int32_t max_tok = L > n_prompt ? L : n_prompt;
    if (engine_init(&e, &m, L + n_prompt + n_gen + 16, 2, max_tok, max_tok, 0, o->kv_type) != 0)
        goto done;
    engine_up = 1;
    b.logits = malloc((size_t)L * V * sizeof(float));
    b.hidden = calloc((size_t)c->n_layer + 1, sizeof *b.hidden);
    b.pos = malloc((size_t)max_tok * sizeof(int32_t));
    b.seq = malloc((size_t)max_tok * sizeof(int32_t));
    b.parent = malloc((size_t)max_tok * sizeof(int32_t));
    b.want = malloc((size_t)max_tok);
    if (!b.logits || !b.hidden || !b.pos || !b.seq || !b.parent || !b.want) {
        err_set("check: out of memory");
        goto done;
    }
    struct model_trace trace = {b.hidden};
    /* long fixtures may leave the per-layer states out */
    r->has_hidden = !o->n_chunks && st_find(&g, "hidden.0") != NULL;
    if (r->has_hidden)
        for (int32_t l = 0; l <= c->n_layer; l++)
            if (!(b.hidden[l] = malloc((size_t)L * H * sizeof(float)))) {
                err_set("check: out of memory");
                goto done;
            }
    if (check_prefill(&e, o, ids->data, L, &b, r->has_hidden ? &trace : NULL) != 0)
        goto done;
    r->n_prefill = L;
    r->n_layer = c->n_layer;
    r->max_logit_err = max_abs_diff(b.logits, want_logits->data, (int64_t)L * V);
    for (int32_t l = 0; r->has_hidden && l <= c->n_layer; l++) {
        snprintf(path, sizeof path, "hidden.%d", l);
        const struct st_tensor *h = golden_get(&g, path, DT_F32, L, H);
        if (!h)
            goto done;
        r->hidden_err[l] = max_abs_diff(b.hidden[l], h->data, (int64_t)L * H);
    }
    for (int32_t i = 0; i < n_prompt + n_gen; i++) {
        int32_t t = i < n_prompt ? ((const int32_t *)prompt->data)[i] : ((const int32_t *)greedy->data)[i - n_prompt];
        if (t < 0 || t >= V) {
            err_set("check: golden token id %d outside the vocabulary", t);
            goto done;
        }
    }
    if (check_greedy(&e, prompt->data, n_prompt, greedy->data, n_gen, &b, r) != 0)
        goto done;
    rc = 0;
done:
    if (b.hidden)
        for (int32_t l = 0; l <= m.cfg.n_layer; l++)
            free(b.hidden[l]);
    free(b.hidden);
    free(b.logits);
    free(b.pos);
    free(b.seq);
    free(b.parent);
    free(b.want);
    if (engine_up)
        engine_free(&e);
    if (loaded)
        model_free(&m);
    st_close(&g);
    return rc;
}
