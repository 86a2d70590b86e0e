/* spec: KFlash tree speculative decoding (see spec.h).
 * References for the acceptance rule: speculative sampling (Leviathan et al.,
 * Chen et al. 2023) and its multi-candidate form for deterministic drafts
 * (SpecInfer, Miao et al. 2023): querying candidates one by one against the
 * residual target distribution draws exactly from the target. */
#define _POSIX_C_SOURCE 200809L
#include "spec.h"

#include "../base/clock.h"
#include "../base/err.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct spec_params spec_defaults(void)
{
    return (struct spec_params){
        .mode = SPEC_TREE, .n_nodes = 24, .depth = 8, .top_k = 4, .ngram = true, .ngram_min = 3, .accept_bias = 1.0,
    };
}

int spec_init(struct spec *s, struct engine *tgt, int32_t tseq, struct engine *dft, int32_t dseq,
              const struct spec_params *p, int32_t n_ctx)
{
    memset(s, 0, sizeof *s);
    const int32_t V = tgt->m->cfg.vocab_size;
    if (dft && dft->m->cfg.vocab_size != V)
        return err_set("spec: the draft's vocabulary (%d) differs from the target's (%d)", dft->m->cfg.vocab_size, V);
    if (p->n_nodes < 0 || p->n_nodes > SPEC_MAX_NODES || p->depth < 0 || p->depth > SPEC_MAX_DEPTH ||
        p->top_k < 1 || p->top_k > 16 || p->ngram_min < 1)
        return err_set("spec: tree of %d nodes, depth %d, %d children: out of range (nodes <= %d, depth <= %d)",
                       p->n_nodes, p->depth, p->top_k, SPEC_MAX_NODES, SPEC_MAX_DEPTH);
    if (tgt->max_tokens < p->n_nodes + 1 || (dft && dft->max_tokens < p->n_nodes + 1))
        return err_set("spec: the engines take batches of %d and %d tokens, a tree needs %d", tgt->max_tokens,
                       dft ? dft->max_tokens : 0, p->n_nodes + 1);
    s->tgt = tgt;
    s->dft = dft;
    s->tseq = tseq;
    s->dseq = dseq;
    s->d_len = dft && dseq >= 0 ? engine_seq_len(dft, dseq) : 0;
    s->p = *p;
    s->tun = &s->tu;
    s->dfw = &s->dfw_count;
    s->max_nodes = p->n_nodes;
    s->vocab = V;
    s->draft_top = V < SPEC_DRAFT_TOP ? V : SPEC_DRAFT_TOP;
    s->cap_ctx = n_ctx;
    /* tuner shapes: none (a plain step: where speculation does not pay, as
     * for several requests at once on a few cores), then chain-like to bushy,
     * within the budget the engines were sized for; the last skips the draft
     * when prompt lookup proposes enough (only with lookup on) */
    static const int32_t shapes[SPEC_TUNE_SHAPES][3] = {{0, 0, 0},  {3, 3, 0},  {6, 3, 0},  {8, 4, 0},
                                                        {12, 6, 0}, {16, 6, 0}, {24, 8, 0}, {16, 4, 1}};
    for (int i = 0; i < SPEC_TUNE_SHAPES; i++)
        if (shapes[i][0] <= p->n_nodes && (!shapes[i][2] || (p->ngram && dft))) {
            s->tu.nodes[s->tu.n_shape] = shapes[i][0];
            s->tu.lookup_first[s->tu.n_shape] = shapes[i][2];
            s->tu.depth[s->tu.n_shape++] = shapes[i][1] < p->depth ? shapes[i][1] : p->depth;
        }
    if (s->tu.n_shape == 0)
        s->p.tune = false;
    const size_t nb = (size_t)(dft && dft->max_tokens > tgt->max_tokens ? dft->max_tokens : tgt->max_tokens);
    s->cap_heap = SPEC_MAX_NODES * p->top_k + 1;
    s->tok = malloc(nb * sizeof(int32_t));
    s->pos = malloc(nb * sizeof(int32_t));
    s->seq = malloc(nb * sizeof(int32_t));
    s->par = malloc(nb * sizeof(int32_t));
    s->rows = malloc(2 * nb * sizeof(int32_t));
    s->want = malloc(nb);
    s->tlogits = malloc((size_t)(p->n_nodes + 2) * (size_t)V * sizeof(float));
    s->dids = malloc((size_t)(p->n_nodes + 1) * SPEC_DRAFT_TOP * sizeof(int32_t));
    s->dvals = malloc((size_t)(p->n_nodes + 1) * SPEC_DRAFT_TOP * sizeof(float));
    s->tids = malloc((size_t)(p->n_nodes + 1) * TOP_K_MAX * sizeof(int32_t));
    s->tvals = malloc((size_t)(p->n_nodes + 1) * TOP_K_MAX * sizeof(float));
    s->path = malloc((size_t)n_ctx * sizeof(int32_t));
    s->res = calloc((size_t)V, sizeof(double));
    s->heap = malloc((size_t)s->cap_heap * sizeof *s->heap);
    if (!s->tok || !s->pos || !s->seq || !s->par || !s->rows || !s->want || !s->tlogits || !s->dids || !s->dvals ||
        !s->tids || !s->tvals || !s->path || !s->res || !s->heap) {
        spec_free(s);
        return err_set("spec: out of memory");
    }
    return 0;
}

void spec_init_lane(struct spec *lane, struct spec *main, int32_t tseq, int32_t dseq)
{
    *lane = *main;
    lane->tun = main->tun;
    lane->dfw = main->dfw;
    lane->lane = true;
    lane->st = (struct spec_stats){0};
    spec_reset(lane, tseq, dseq);
}

void spec_reset(struct spec *s, int32_t tseq, int32_t dseq)
{
    s->tseq = tseq;
    s->dseq = dseq;
    s->d_len = s->dft && dseq >= 0 ? engine_seq_len(s->dft, dseq) : 0;
}

void spec_free(struct spec *s)
{
    if (s->lane) {
        memset(s, 0, sizeof *s);
        return;
    }
    free(s->tok);
    free(s->pos);
    free(s->seq);
    free(s->par);
    free(s->rows);
    free(s->want);
    free(s->tlogits);
    free(s->dids);
    free(s->dvals);
    free(s->tids);
    free(s->tvals);
    free(s->path);
    free(s->res);
    free(s->heap);
    memset(s, 0, sizeof *s);
}

static int32_t add_node(struct spec *s, int32_t token, int32_t parent, float logq, bool ngram)
{
    struct spec_node *n = &s->node[s->n_node];
    *n = (struct spec_node){token, parent, parent < 0 ? 0 : s->node[parent].depth + 1, logq, ngram, -1};
    return s->n_node++;
}

static int32_t find_child(const struct spec *s, int32_t parent, int32_t token)
{
    for (int32_t i = 1; i < s->n_node; i++)
        if (s->node[i].parent == parent && s->node[i].token == token)
            return i;
    return -1;
}

/* Prompt lookup: the tokens that followed the most recent earlier occurrence of
 * the context's last g tokens (longest g first), as a chain under the root. */
static void add_ngram_chain(struct spec *s, const int32_t *hist, int32_t n_hist, int32_t max_depth)
{
    for (int32_t g = n_hist - 1 < 8 ? n_hist - 1 : 8; g >= s->p.ngram_min; g--) {
        const int32_t *suf = hist + n_hist - g;
        for (int32_t j = n_hist - g - 1; j >= 0; j--) {
            if (memcmp(hist + j, suf, sizeof(int32_t) * (size_t)g) != 0)
                continue;
            int32_t parent = 0;
            for (int32_t t = j + g; t < n_hist && s->node[parent].depth < max_depth && s->n_node <= s->cap; t++)
                parent = add_node(s, hist[t], parent, 0.0f, true);
            return;
        }
    }
}

static void heap_push(struct spec *s, float lq, int32_t parent, int32_t token)
{
    if (s->n_heap < s->cap_heap)
        s->heap[s->n_heap++] = (struct spec_cand){lq, parent, token};
}

/* The best candidate (highest cumulative log-probability; ties: earliest), removed. */
static int heap_pop(struct spec *s, float *lq, int32_t *parent, int32_t *token)
{
    if (s->n_heap == 0)
        return 0;
    int32_t b = 0;
    for (int32_t i = 1; i < s->n_heap; i++)
        if (s->heap[i].lq > s->heap[b].lq)
            b = i;
    *lq = s->heap[b].lq;
    *parent = s->heap[b].parent;
    *token = s->heap[b].token;
    s->heap[b] = s->heap[--s->n_heap];
    return 1;
}

/* Feeds the draft's catch-up tokens hist[d_len .. n_hist-1) as a chain followed
 * by the whole tree; logits wanted for the nodes in expand. Returns the number
 * of catch-up rows, or -1. */
static int32_t draft_forward(struct spec *s, const int32_t *hist, int32_t n_hist, const uint8_t *expand)
{
    const int32_t C = n_hist - 1 - s->d_len, base = s->d_len;
    int32_t n = 0;
    for (int32_t i = 0; i < C; i++, n++) {
        s->tok[n] = hist[base + i];
        s->pos[n] = base + i;
        s->seq[n] = s->dseq;
        s->par[n] = n - 1;
        s->want[n] = 0;
    }
    for (int32_t i = 0; i < s->n_node; i++, n++) {
        const struct spec_node *v = &s->node[i];
        s->tok[n] = v->token;
        s->pos[n] = n_hist - 1 + v->depth;
        s->seq[n] = s->dseq;
        s->par[n] = v->parent < 0 ? C - 1 : C + v->parent;
        s->want[n] = expand[i];
        s->node[i].drow = n;
    }
    struct batch b = {n, s->tok, s->pos, s->seq, s->par, s->want};
    double t0 = clock_now_s();
    int32_t r = engine_forward(s->dft, &b, NULL, NULL);
    if (r >= 0 && engine_out_top(s->dft, s->draft_top, s->dids, s->dvals) != 0)
        r = -1;
    s->dfw_mine = ++*s->dfw;
    s->st.t_draft += clock_now_s() - t0;
    return r < 0 ? -1 : C;
}

/* Builds the tree below the root hist[n_hist-1]; returns the catch-up rows of
 * the last draft forward (0 if there was none), or -1. */
static int32_t build_tree(struct spec *s, const int32_t *hist, int32_t n_hist, int32_t max_depth)
{
    const struct spec_params *p = &s->p;
    s->n_node = 0;
    s->n_heap = 0;
    add_node(s, hist[n_hist - 1], -1, 0.0f, false);
    if (p->mode == SPEC_OFF || max_depth == 0 || s->cap == 0)
        return 0;
    if (p->ngram)
        add_ngram_chain(s, hist, n_hist, max_depth);
    if (!s->dft || (p->lookup_first && s->n_node - 1 >= SPEC_LOOKUP_MIN))
        return 0; /* prompt lookup alone */
    const int32_t budget = s->cap, top_k = p->mode == SPEC_CHAIN ? 1 : p->top_k;
    const int32_t depth = p->mode == SPEC_CHAIN ? budget : p->depth;
    const int32_t width = p->mode == SPEC_CHAIN ? 1 : (budget + depth - 1) / depth;
    uint8_t expand[SPEC_MAX_NODES + 1] = {1};
    int32_t n_expand = 1, C = 0;
    for (int32_t i = 0; i < s->n_node; i++)
        s->node[i].drow = -1;
    while (s->n_node - 1 < budget && n_expand > 0) {
        if ((C = draft_forward(s, hist, n_hist, expand)) < 0)
            return -1;
        for (int32_t i = 0, j = 0; i < s->n_node; i++) {
            if (!expand[i])
                continue;
            /* the draft_top largest logits, in order, ranked where they are */
            const int32_t *best = s->dids + (size_t)j * (size_t)s->draft_top;
            const float *val = s->dvals + (size_t)j++ * (size_t)s->draft_top;
            const int32_t nb = s->draft_top;
            /* log-probabilities normalised over those: they only order the
             * tree (exactness does not depend on them), and a full softmax over a
             * large vocabulary would cost more than the draft's forward */
            double z = 0;
            for (int32_t q = 0; q < nb; q++)
                z += exp((double)(val[q] - val[0]));
            const float lz = val[0] + (float)log(z);
            for (int32_t q = 0; q < top_k && q < nb; q++)
                if (find_child(s, i, best[q]) < 0)
                    heap_push(s, s->node[i].logq + val[q] - lz, i, best[q]);
            expand[i] = 0;
        }
        n_expand = 0;
        float lq;
        int32_t parent, token;
        while (n_expand < width && s->n_node - 1 < budget && heap_pop(s, &lq, &parent, &token)) {
            if (s->node[parent].depth + 1 > (depth < max_depth ? depth : max_depth))
                continue;
            int32_t v = add_node(s, token, parent, lq, false);
            expand[v] = 1;
            n_expand++;
        }
    }
    return C;
}

#define TUNE_TRIES 4 /* steps each shape is tried before the tuner settles */

/* The tuner's fastest shape (spec_tuned_shape's). */
static int32_t tune_best(const struct spec_tuner *t)
{
    int32_t b = 0;
    for (int32_t i = 1; i < t->n_shape; i++)
        if (t->tok_s[i] > t->tok_s[b])
            b = i;
    return b;
}

bool spec_tuner_settled(const struct spec_tuner *t)
{
    for (int32_t i = 0; i < t->n_shape; i++)
        if (t->tries[i] < TUNE_TRIES)
            return false;
    return t->n_shape > 0;
}

/* key's line of an open file: its fields after the key, or NULL. */
static const char *tune_line(const char *line, const char *key)
{
    const size_t n = strlen(key);
    return strncmp(line, key, n) == 0 && line[n] == '\t' ? line + n + 1 : NULL;
}

bool spec_tuner_load(struct spec_tuner *t, const char *path, const char *key)
{
    char line[8192];
    FILE *f = fopen(path, "r");
    const char *v = NULL;
    while (f && !v && fgets(line, sizeof line, f))
        v = tune_line(line, key);
    if (f)
        fclose(f);
    /* one field a shape: nodes,depth,lookup_first,tries,tokens per second */
    bool found = false;
    for (const char *p = v; p;) {
        int nodes, depth, lookup, tries;
        double tps;
        if (sscanf(p, "%d,%d,%d,%d,%lf", &nodes, &depth, &lookup, &tries, &tps) == 5 && tries >= 0 && tps >= 0)
            for (int32_t i = 0; i < t->n_shape; i++)
                if (t->nodes[i] == nodes && t->depth[i] == depth && t->lookup_first[i] == (lookup != 0)) {
                    t->tries[i] = tries;
                    t->tok_s[i] = tps;
                    found = true;
                }
        if ((p = strchr(p, '\t')))
            p++;
    }
    return found;
}

/* mkdir -p of path's folder. */
static int tune_mkdir(const char *path)
{
    char dir[4096];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
        return err_set("spec: the tuning file's path is too long");
    char *end = strrchr(dir, '/');
    if (!end || end == dir)
        return 0;
    *end = 0;
    for (char *p = dir + 1;; p++)
        if (*p == '/' || *p == 0) {
            const char c = *p;
            *p = 0;
            if (mkdir(dir, 0755) != 0 && errno != EEXIST)
                return err_set("spec: cannot make %s: %s", dir, strerror(errno));
            *p = c;
            if (!c)
                return 0;
        }
}

int spec_tuner_save(const struct spec_tuner *t, const char *path, const char *key)
{
    char tmp[4200], line[8192];
    if (t->n_shape == 0)
        return 0;
    if (tune_mkdir(path) != 0)
        return -1;
    snprintf(tmp, sizeof tmp, "%s.%d", path, (int)getpid());
    FILE *in = fopen(path, "r"), *out = fopen(tmp, "w");
    if (!out) {
        if (in)
            fclose(in);
        return err_set("spec: cannot write %s: %s", tmp, strerror(errno));
    }
    while (in && fgets(line, sizeof line, in))
        if (!tune_line(line, key))
            fputs(line, out);
    if (in)
        fclose(in);
    fputs(key, out);
    for (int32_t i = 0; i < t->n_shape; i++)
        fprintf(out, "\t%d,%d,%d,%d,%.3f", t->nodes[i], t->depth[i], t->lookup_first[i] ? 1 : 0, t->tries[i],
                t->tok_s[i]);
    fputc('\n', out);
    if (fclose(out) != 0 || rename(tmp, path) != 0) {
        remove(tmp);
        return err_set("spec: cannot write %s", path);
    }
    return 0;
}

void spec_tuned_shape(const struct spec *s, int32_t *nodes, int32_t *depth, bool *lookup_first)
{
    const struct spec_tuner *t = s->tun;
    const int32_t b = tune_best(t);
    *nodes = s->p.tune ? t->nodes[b] : s->p.n_nodes;
    *depth = s->p.tune ? t->depth[b] : s->p.depth;
    if (lookup_first)
        *lookup_first = s->p.tune ? t->lookup_first[b] : s->p.lookup_first;
}

/* Picks the shape for the next step: each tried TUNE_TRIES times first, then
 * the best, with every 32nd step on the least-tried other shape. */
static void tune_pick(struct spec *s)
{
    struct spec_tuner *t = s->tun;
    int32_t pick = -1;
    for (int32_t i = 0; i < t->n_shape && pick < 0; i++)
        if (t->tries[i] < TUNE_TRIES)
            pick = i;
    if (pick < 0) {
        pick = tune_best(t);
        if (t->step % 32 == 31) {
            int32_t other = -1;
            for (int32_t i = 0; i < t->n_shape; i++)
                if (i != pick && (other < 0 || t->tries[i] < t->tries[other]))
                    other = i;
            pick = other >= 0 ? other : pick;
        }
    }
    s->tcur = pick;
    s->p.n_nodes = t->nodes[pick];
    s->p.depth = t->depth[pick];
    s->p.lookup_first = t->lookup_first[pick];
}

static void tune_record(struct spec *s, int32_t k, double seconds)
{
    struct spec_tuner *t = s->tun;
    const int32_t c = s->tcur;
    const double v = seconds > 0 ? k / seconds : 0;
    t->tok_s[c] = t->tok_s[c] > 0 ? 0.8 * t->tok_s[c] + 0.2 * v : v; /* 0: not measured (or loaded without it) */
    t->tries[c]++;
    t->step++;
}

int32_t spec_propose(struct spec *s, const int32_t *hist, int32_t n_hist, int32_t max_out, int32_t cap)
{
    s->t_step = clock_now_s();
    if (s->p.tune && s->p.mode == SPEC_TREE)
        tune_pick(s);
    s->cap = cap < s->p.n_nodes ? cap : s->p.n_nodes;
    if (s->cap < 0)
        s->cap = 0;
    if (n_hist < 1 || max_out < 1 || n_hist + max_out > s->cap_ctx)
        return err_set("spec: step past the context (%d + %d of %d)", n_hist, max_out, s->cap_ctx);
    /* a draft lagging by more than a batch (or any, for a lane that will not
     * commit its tree forward's rows) catches up on its own first */
    while (s->dft && n_hist - 1 > s->d_len &&
           (s->catchup_first || n_hist - 1 - s->d_len + s->cap + 1 > s->dft->max_tokens)) {
        int32_t n = n_hist - 1 - s->d_len;
        if (n > s->dft->max_tokens)
            n = s->dft->max_tokens;
        for (int32_t i = 0; i < n; i++) {
            s->pos[i] = s->d_len + i;
            s->seq[i] = s->dseq;
            s->par[i] = i - 1;
            s->want[i] = 0;
        }
        struct batch b = {n, hist + s->d_len, s->pos, s->seq, s->par, s->want};
        if (engine_forward(s->dft, &b, NULL, NULL) < 0 || engine_commit_all(s->dft) != 0)
            return -1;
        ++*s->dfw;
        s->d_len += n;
    }
    s->n_catchup = build_tree(s, hist, n_hist, max_out - 1);
    return s->n_catchup < 0 ? -1 : s->n_node;
}

int32_t spec_fill(struct spec *s, int32_t n_hist, int32_t row0, int32_t *tok, int32_t *pos, int32_t *seq,
                  int32_t *par, uint8_t *want)
{
    s->row0 = row0;
    for (int32_t i = 0; i < s->n_node; i++) {
        tok[row0 + i] = s->node[i].token;
        pos[row0 + i] = n_hist - 1 + s->node[i].depth;
        seq[row0 + i] = s->tseq;
        par[row0 + i] = s->node[i].parent < 0 ? -1 : row0 + s->node[i].parent;
        want[row0 + i] = 0;
        s->lrow[i] = -1;
    }
    /* logits in the verify pass for the path the walk most likely takes (from
     * the root, each node's most probable child, prompt-lookup nodes first);
     * other nodes get theirs on demand if the walk reaches them */
    s->n_pred = 0;
    for (int32_t v = 0; v >= 0;) {
        want[row0 + v] = 1;
        int32_t best = -1;
        for (int32_t c = v + 1; c < s->n_node; c++)
            if (s->node[c].parent == v && (best < 0 || s->node[c].logq > s->node[best].logq))
                best = c;
        v = best;
    }
    for (int32_t i = 0; i < s->n_node; i++)
        if (want[row0 + i])
            s->lrow[i] = s->n_pred++;
    return s->n_pred;
}

int32_t spec_top_need(const struct sampler *sm)
{
    const int32_t k = sampler_top_need(sm);
    return k <= TOP_K_MAX ? k : 0;
}

/* Greedy acceptance from the root on the target's argmax per node (what the
 * walk below does with a one-candidate distribution): follow the child that
 * equals it; the argmax where none does is the bonus token. */
static int32_t accept_greedy(struct spec *s, int32_t *out, const struct spec_rows *in, int32_t *n_path)
{
    int32_t v = 0, k = 0;
    for (;;) {
        int32_t tok;
        if (s->lrow[v] >= 0)
            tok = in->ids[(size_t)s->lrow[v] * (size_t)in->k];
        else if (engine_row_top(s->tgt, s->row0 + v, 1, &tok, NULL) != 0)
            return -1;
        out[k++] = tok;
        int32_t next = -1;
        for (int32_t c = v + 1; c < s->n_node && next < 0; c++)
            if (s->node[c].parent == v && s->node[c].token == tok)
                next = c;
        if (next < 0)
            return k;
        s->st.ngram_accepted += s->node[next].ngram;
        s->rows[(*n_path)++] = next;
        v = next;
    }
}

/* The sampler's distribution at node v (sm->idx / sm->w, returns their
 * count): from its logit row or its top list, either from the verify pass or,
 * for a row it did not return, asked for now. */
static int32_t node_dist(struct spec *s, struct sampler *sm, const struct spec_rows *in, int32_t v, int32_t plen)
{
    const int32_t r = s->lrow[v];
    if (in->logits) {
        float *spare = s->tlogits + (size_t)(s->max_nodes + 1) * (size_t)s->vocab;
        if (r < 0 && engine_row_logits(s->tgt, s->row0 + v, spare) != 0)
            return -1;
        return sampler_dist(sm, r >= 0 ? in->logits + (size_t)r * (size_t)s->vocab : spare, s->path, plen);
    }
    if (r >= 0)
        return sampler_dist_top(sm, in->ids + (size_t)r * (size_t)in->k,
                                in->vals ? in->vals + (size_t)r * (size_t)in->k : NULL, in->k);
    if (engine_row_top(s->tgt, s->row0 + v, in->k, s->sids, s->svals) != 0)
        return -1;
    return sampler_dist_top(sm, s->sids, s->svals, in->k);
}

/* The lossless multi-candidate walk from the root on the sampler's
 * distribution per node: returns the tokens written to out, or -1. */
static int32_t accept_sampled(struct spec *s, struct sampler *sm, const int32_t *hist, int32_t n_hist, int32_t *out,
                              const struct spec_rows *in, int32_t *n_path)
{
    memcpy(s->path, hist, sizeof(int32_t) * (size_t)n_hist);
    int32_t plen = n_hist, v = 0, k = 0;
    for (;;) {
        const int32_t n = node_dist(s, sm, in, v, plen);
        if (n < 0)
            return -1;
        double sum = 0;
        for (int32_t i = 0; i < n; i++) {
            s->res[sm->idx[i]] = sm->w[i];
            sum += sm->w[i];
        }
        const double total = sum;
        int32_t next = -1;
        for (int32_t c = 1; c < s->n_node && next < 0; c++) {
            if (s->node[c].parent != v)
                continue;
            const double pc = s->res[s->node[c].token];
            if (pc <= 0)
                continue;
            if (sampler_uniform(sm) * sum < pc * s->p.accept_bias)
                next = c;
            else {
                sum -= pc;
                s->res[s->node[c].token] = 0;
            }
        }
        int32_t tok;
        if (next >= 0) {
            tok = s->node[next].token;
        } else {
            /* nothing accepted: draw from the residual (or, if a biased test rule
             * rejected all the mass, from the whole distribution) */
            const int use_all = !(sum > 0);
            double r = sampler_uniform(sm) * (use_all ? total : sum);
            tok = sm->idx[0];
            for (int32_t i = 0; i < n; i++) {
                double w = use_all ? sm->w[i] : s->res[sm->idx[i]];
                if (w <= 0)
                    continue;
                tok = sm->idx[i];
                if ((r -= w) < 0)
                    break;
            }
        }
        for (int32_t i = 0; i < n; i++)
            s->res[sm->idx[i]] = 0;
        out[k++] = tok;
        s->path[plen++] = tok;
        if (next < 0)
            break;
        s->st.ngram_accepted += s->node[next].ngram;
        s->rows[(*n_path)++] = next;
        v = next;
    }
    return k;
}

int32_t spec_accept(struct spec *s, struct sampler *sm, const int32_t *hist, int32_t n_hist, int32_t *out,
                    const struct spec_rows *in)
{
    assert(in->logits || (in->ids && in->k >= spec_top_need(sm) && spec_top_need(sm) > 0 &&
                          (in->vals || sampler_greedy(sm))));
    const double t0 = clock_now_s();
    int32_t n_path = 1;
    s->rows[0] = 0;
    /* the greedy walk is the sampled one's with a one-candidate distribution;
     * a biased rule (tests) must go through the sampled one */
    const int32_t k = !in->logits && sampler_greedy(sm) && s->p.accept_bias == 1.0
                          ? accept_greedy(s, out, in, &n_path)
                          : accept_sampled(s, sm, hist, n_hist, out, in, &n_path);
    if (k < 0)
        return -1;
    s->st.t_verify += clock_now_s() - t0;
    s->st.steps++;
    s->st.tokens += k;
    for (int32_t d = 0; d < k - 1 && d <= SPEC_MAX_DEPTH; d++)
        s->st.accepted[d]++;
    int32_t trows[SPEC_MAX_NODES + 1];
    for (int32_t i = 0; i < n_path; i++)
        trows[i] = s->row0 + s->rows[i];
    if (engine_commit(s->tgt, s->tseq, trows, n_path) != 0)
        return -1;
    /* the draft keeps its catch-up rows and the accepted nodes it has seen,
     * if its last forward was this step's (otherwise it catches up next time) */
    if (s->n_node > 1 && s->node[0].drow >= 0 && s->dfw_mine == *s->dfw) {
        int32_t m = 0;
        for (int32_t i = 0; i < s->n_catchup; i++)
            s->rows[n_path + m++] = i;
        for (int32_t i = 0; i < n_path && s->node[s->rows[i]].drow >= 0; i++)
            s->rows[n_path + m++] = s->node[s->rows[i]].drow;
        if (engine_commit(s->dft, s->dseq, s->rows + n_path, m) != 0)
            return -1;
        s->d_len += m;
    }
    if (s->p.tune && s->p.mode == SPEC_TREE)
        tune_record(s, k, clock_now_s() - s->t_step);
    return k;
}

int32_t spec_step(struct spec *s, struct sampler *sm, const int32_t *hist, int32_t n_hist, int32_t *out,
                  int32_t max_out)
{
    if (spec_propose(s, hist, n_hist, max_out, s->max_nodes) < 0)
        return -1;
    spec_fill(s, n_hist, 0, s->tok, s->pos, s->seq, s->par, s->want);
    struct batch b = {s->n_node, s->tok, s->pos, s->seq, s->par, s->want};
    const double t0 = clock_now_s();
    const int32_t k = spec_top_need(sm);
    if (engine_forward(s->tgt, &b, k ? NULL : s->tlogits, NULL) < 0 ||
        (k && engine_out_top(s->tgt, k, s->tids, s->tvals) != 0))
        return -1;
    s->st.t_verify += clock_now_s() - t0;
    const struct spec_rows in = {k ? NULL : s->tlogits, s->tids, s->tvals, k};
    return spec_accept(s, sm, hist, n_hist, out, &in);
}

int spec_prefill(struct spec *s, const int32_t *toks, int32_t n, float *logits)
{
    struct engine *es[2] = {s->tgt, s->dft};
    const int32_t seqs[2] = {s->tseq, s->dseq};
    for (int e = 0; e < (s->dft ? 2 : 1); e++) {
        const int32_t len0 = engine_seq_len(es[e], seqs[e]);
        for (int32_t done = len0; done < n;) {
            int32_t k = n - done < es[e]->max_tokens ? n - done : es[e]->max_tokens;
            for (int32_t i = 0; i < k; i++) {
                s->pos[i] = done + i;
                s->seq[i] = seqs[e];
                s->par[i] = i - 1;
                s->want[i] = e == 0 && done + i == n - 1;
            }
            struct batch b = {k, toks + done, s->pos, s->seq, s->par, s->want};
            if (engine_forward(es[e], &b, e == 0 ? logits : NULL, NULL) < 0 || engine_commit_all(es[e]) != 0)
                return -1;
            done += k;
        }
    }
    s->d_len = n;
    return 0;
}
