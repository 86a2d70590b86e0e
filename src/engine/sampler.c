/* sampler: logit processing and seeded sampling (see sampler.h). */
#include "sampler.h"

#include "../base/err.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Weights under e^-SAMPLER_CUT of the largest (2e-22) sum, over any vocabulary
 * under 500k tokens, to less than half an ulp of a total that is at least 1:
 * leaving those tokens out changes no draw a double can tell apart, and spares
 * exp() over the tail of the vocabulary. */
#define SAMPLER_CUT 50.0f

struct sampler_params sampler_defaults(void)
{
    struct sampler_params p;
    memset(&p, 0, sizeof p);
    p.top_p = 1.0f;
    p.repeat_penalty = 1.0f;
    p.penalty_last_n = 64;
    return p;
}

void sampler_params_from_config(struct sampler_params *p, const struct model_config *c)
{
    p->temperature = c->gen_temperature;
    p->top_p = c->gen_top_p;
    p->top_k = c->gen_top_k;
    p->min_p = c->gen_min_p;
    p->repeat_penalty = c->gen_repeat_penalty;
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t *s)
{
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

double sampler_uniform(struct sampler *s) { return (double)(xoshiro_next(s->rng) >> 11) * 0x1.0p-53; }

int sampler_init(struct sampler *s, const struct sampler_params *p, int32_t n_vocab)
{
    memset(s, 0, sizeof *s);
    if (p->temperature < 0 || p->top_k < 0 || !(p->top_p > 0 && p->top_p <= 1) || p->min_p < 0 || p->min_p > 1 ||
        !(p->repeat_penalty > 0) || p->n_bias < 0 || p->n_bias > SAMPLER_MAX_BIAS)
        return err_set("sampler: parameter out of range");
    for (int32_t i = 0; i < p->n_bias; i++)
        if (p->bias_id[i] < 0 || p->bias_id[i] >= n_vocab)
            return err_set("sampler: logit_bias token %d outside the vocabulary", p->bias_id[i]);
    s->p = *p;
    s->n_vocab = n_vocab;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&x);
    s->logits = malloc((size_t)n_vocab * sizeof *s->logits);
    s->idx = malloc((size_t)n_vocab * sizeof *s->idx);
    s->w = malloc((size_t)n_vocab * sizeof *s->w);
    s->count = calloc((size_t)n_vocab, sizeof *s->count);
    if (!s->logits || !s->idx || !s->w || !s->count) {
        sampler_free(s);
        return err_set("sampler: out of memory");
    }
    return 0;
}

void sampler_free(struct sampler *s)
{
    free(s->logits);
    free(s->idx);
    free(s->w);
    free(s->count);
    memset(s, 0, sizeof *s);
}

int32_t sampler_argmax(const float *logits, int32_t n)
{
    /* the largest value in four independent running maxima (a loop that
     * compared with logits[best] would wait on that load every step), then
     * its first index; NaNs are never larger, so never chosen after index 0 */
    float m[4] = {logits[0], logits[0], logits[0], logits[0]};
    int32_t i = 1;
    for (; i + 4 <= n; i += 4)
        for (int32_t u = 0; u < 4; u++)
            m[u] = logits[i + u] > m[u] ? logits[i + u] : m[u];
    for (; i < n; i++)
        m[0] = logits[i] > m[0] ? logits[i] : m[0];
    float mx = m[0];
    for (int32_t u = 1; u < 4; u++)
        mx = m[u] > mx ? m[u] : mx;
    for (i = 0; i < n; i++)
        if (logits[i] == mx)
            return i;
    return 0; /* logits[0] is NaN and nothing is larger */
}

static void apply_penalties(struct sampler *s, const int32_t *hist, int32_t n_hist)
{
    const struct sampler_params *p = &s->p;
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0 && p->frequency_penalty == 0)
        return;
    int32_t from = p->penalty_last_n < 0 || p->penalty_last_n > n_hist ? 0 : n_hist - p->penalty_last_n;
    for (int32_t i = from; i < n_hist; i++)
        if (hist[i] >= 0 && hist[i] < s->n_vocab)
            s->count[hist[i]]++;
    for (int32_t i = from; i < n_hist; i++) {
        int32_t t = hist[i];
        if (t < 0 || t >= s->n_vocab || s->count[t] == 0)
            continue;
        float *l = &s->logits[t];
        *l = *l > 0 ? *l / p->repeat_penalty : *l * p->repeat_penalty;
        *l -= p->presence_penalty + p->frequency_penalty * (float)s->count[t];
        s->count[t] = 0; /* each distinct token once */
    }
}

/* Whether token a ranks before token b: the larger logit, then the lower id. */
static bool ranks_before(const float *lg, int32_t a, int32_t b) { return lg[a] > lg[b] || (lg[a] == lg[b] && a < b); }

/* The k best of lg[0..n) by ranks_before into idx[0..k), in one pass through a
 * min-heap of the k best so far (its root the worst of them): most tokens are
 * one comparison with the root. */
static void heap_top(const float *lg, int32_t n, int32_t k, int32_t *idx)
{
    float root = 0; /* lg[idx[0]] once the heap is full: a later id must be larger to rank before it */
    for (int32_t i = 0; i < n; i++) {
        int32_t j;
        if (i < k) { /* sift up */
            for (j = i; j > 0 && ranks_before(lg, idx[(j - 1) / 2], i); j = (j - 1) / 2)
                idx[j] = idx[(j - 1) / 2];
        } else if (lg[i] > root) { /* replace the root, sift down */
            for (j = 0;;) {
                int32_t c = 2 * j + 1;
                if (c >= k)
                    break;
                if (c + 1 < k && ranks_before(lg, idx[c], idx[c + 1]))
                    c++;
                if (!ranks_before(lg, i, idx[c]))
                    break;
                idx[j] = idx[c];
                j = c;
            }
        } else {
            continue;
        }
        idx[j] = i;
        if (i >= k - 1)
            root = lg[idx[0]];
    }
}

static _Thread_local const float *cmp_base;
static int cmp_desc(const void *a, const void *b)
{
    float x = cmp_base[*(const int32_t *)a], y = cmp_base[*(const int32_t *)b];
    if (x != y)
        return x < y ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

static void sort_desc(const float *lg, int32_t *idx, int32_t n)
{
    cmp_base = lg;
    qsort(idx, (size_t)n, sizeof *idx, cmp_desc);
}

/* top-p and min-p over the n candidates in s->idx (sorted by rank when
 * `sorted`, else the tokens that pass the floor) of the adjusted logits lg
 * whose largest is mx; their weights to s->w. Returns the candidates kept. */
static int32_t dist_filter(struct sampler *s, const float *lg, float mx, int32_t n, bool sorted)
{
    const struct sampler_params *p = &s->p;
    const double inv_t = 1.0 / p->temperature;
    if (p->top_p < 1) {
        /* sort just enough of the head: grow the sorted prefix until it covers top_p */
        double total = 0;
        for (int32_t i = 0; i < n; i++)
            total += exp((lg[s->idx[i]] - mx) * inv_t);
        for (int32_t m = n < 64 ? n : 64;; m = m * 4 < n ? m * 4 : n) {
            if (!sorted) { /* the m best of the vocabulary, all candidates since n >= m pass the floor */
                heap_top(lg, s->n_vocab, m, s->idx);
                sort_desc(lg, s->idx, m);
            }
            double cum = 0;
            int32_t keep = 0;
            while (keep < m && cum < p->top_p * total)
                cum += exp((lg[s->idx[keep++]] - mx) * inv_t);
            if (cum >= p->top_p * total || m == n) {
                n = keep;
                break;
            }
        }
    }
    /* min-p: drop tokens below min_p times the most likely one (weight 1) */
    for (int32_t i = 0; i < n; i++) {
        double w = exp((lg[s->idx[i]] - mx) * inv_t);
        s->w[i] = w >= p->min_p ? w : 0;
    }
    return n;
}

int32_t sampler_dist(struct sampler *s, const float *logits, const int32_t *history, int32_t n_history)
{
    const struct sampler_params *p = &s->p;
    const int32_t V = s->n_vocab;
    float *lg = s->logits;
    memcpy(lg, logits, (size_t)V * sizeof *lg);
    for (int32_t i = 0; i < p->n_bias; i++)
        lg[p->bias_id[i]] += p->bias[i];
    apply_penalties(s, history, n_history);
    if (p->temperature == 0) {
        s->idx[0] = sampler_argmax(lg, V);
        s->w[0] = 1.0;
        return 1;
    }
    const float mx = lg[sampler_argmax(lg, V)]; /* always among the candidates */
    int32_t n = 0;
    const bool sorted = p->top_k > 0 && p->top_k < V;
    if (sorted) {
        heap_top(lg, V, p->top_k, s->idx);
        n = p->top_k;
        sort_desc(lg, s->idx, n);
    } else {
        const float floor_lg = mx - SAMPLER_CUT * p->temperature;
        for (int32_t i = 0; i < V; i++)
            if (lg[i] >= floor_lg)
                s->idx[n++] = i;
    }
    return dist_filter(s, lg, mx, n, sorted);
}

/* The banned tokens when every bias is a ban (-inf, as ignore_eos sets:
 * such a token is never drawn, whatever its logit) and no penalty applies,
 * so that the draw is the raw logits' with those ids left out; else -1.
 * 0: nothing changes the logits before the filters. */
static int32_t n_bans(const struct sampler_params *p)
{
    if (p->repeat_penalty != 1.0f || p->presence_penalty != 0 || p->frequency_penalty != 0)
        return -1;
    for (int32_t i = 0; i < p->n_bias; i++)
        if (!(isinf(p->bias[i]) && p->bias[i] < 0))
            return -1;
    return p->n_bias;
}

static bool is_banned(const struct sampler_params *p, int32_t id)
{
    for (int32_t i = 0; i < p->n_bias; i++)
        if (p->bias_id[i] == id)
            return true;
    return false;
}

bool sampler_greedy(const struct sampler *s) { return s->p.temperature == 0 && n_bans(&s->p) == 0; }

int32_t sampler_top_need(const struct sampler *s)
{
    const struct sampler_params *p = &s->p;
    const int32_t bans = n_bans(p);
    const int32_t need = p->temperature == 0 ? 1 : p->top_k > 0 && p->top_k < s->n_vocab ? p->top_k : 0;
    return bans < 0 || need == 0 ? 0 : need + bans;
}

/* A seeded draw from the n weighted candidates of the last dist. */
static int32_t draw(struct sampler *s, int32_t n)
{
    double sum = 0;
    for (int32_t i = 0; i < n; i++)
        sum += s->w[i];
    double r = sampler_uniform(s) * sum;
    int32_t last = s->idx[0];
    for (int32_t i = 0; i < n; i++) {
        if (s->w[i] == 0)
            continue;
        last = s->idx[i];
        if ((r -= s->w[i]) < 0)
            break;
    }
    return last;
}

int32_t sampler_sample(struct sampler *s, const float *logits, const int32_t *history, int32_t n_history)
{
    const int32_t n = sampler_dist(s, logits, history, n_history);
    return s->p.temperature == 0 ? s->idx[0] : draw(s, n);
}

int32_t sampler_dist_top(struct sampler *s, const int32_t *ids, const float *vals, int32_t k)
{
    const int32_t need = sampler_top_need(s), n = need - n_bans(&s->p);
    assert(need >= 1 && k >= need && (vals || s->p.temperature == 0));
    /* the n largest logits of tokens not banned, where sampler_dist's top-k
     * pass puts them (k >= need leaves at least n of them) */
    int32_t m = 0;
    for (int32_t i = 0; i < k && m < n; i++) {
        if (is_banned(&s->p, ids[i]))
            continue;
        s->idx[m++] = ids[i];
        if (vals)
            s->logits[ids[i]] = vals[i];
    }
    assert(m == n);
    if (s->p.temperature == 0) {
        s->w[0] = 1.0;
        return 1;
    }
    return dist_filter(s, s->logits, s->logits[s->idx[0]], n, true);
}

int32_t sampler_sample_top(struct sampler *s, const int32_t *ids, const float *vals, int32_t k)
{
    const int32_t n = sampler_dist_top(s, ids, vals, k);
    return s->p.temperature == 0 ? s->idx[0] : draw(s, n);
}

/* A draw from weights w[0..n) (some 0) with the sampler's stream; -1 if all are 0. */
static int32_t guarded_draw(struct sampler *s, const double *w, int32_t n)
{
    double sum = 0;
    for (int32_t i = 0; i < n; i++)
        sum += w[i];
    if (!(sum > 0))
        return -1;
    double r = sampler_uniform(s) * sum;
    int32_t k = -1;
    for (int32_t i = 0; i < n; i++) {
        if (w[i] == 0)
            continue;
        k = i;
        if ((r -= w[i]) < 0)
            break;
    }
    return k;
}

/* The allowed token with the largest logit (lowest id on ties), or -1. */
static int32_t best_allowed(const struct guard *gd, const struct vocab_bytes *vb, const float *lg, int32_t n_vocab)
{
    int32_t best = -1;
    for (int32_t i = 0; i < n_vocab; i++)
        if (lg[i] > -INFINITY && (best < 0 || lg[i] > lg[best]) && guard_allows(gd, vb, i))
            best = i;
    return best;
}

#define GUARD_TRIES 8 /* draws (or argmax picks) tried before every candidate is checked */

int32_t sampler_sample_guarded(struct sampler *s, struct guard *gd, const struct vocab_bytes *vb, const float *logits,
                               const int32_t *history, int32_t n_history)
{
    const int32_t n = sampler_dist(s, logits, history, n_history);
    float *lg = s->logits; /* the adjusted logits: a working copy */
    int32_t pick = -1;
    if (s->p.temperature == 0) {
        /* the best few by logit first (the usual case), then a full pass */
        for (int32_t t = 0; t < GUARD_TRIES && pick < 0; t++) {
            const int32_t k = sampler_argmax(lg, s->n_vocab);
            if (lg[k] == -INFINITY)
                break;
            if (guard_allows(gd, vb, k))
                pick = k;
            else
                lg[k] = -INFINITY;
        }
    } else {
        /* rejection: a draw that cannot continue is taken out and the draw
         * repeated; after a few, every candidate is checked at once */
        for (int32_t t = 0; t < GUARD_TRIES && pick < 0; t++) {
            const int32_t k = guarded_draw(s, s->w, n);
            if (k < 0)
                break;
            if (guard_allows(gd, vb, s->idx[k]))
                pick = s->idx[k];
            else
                s->w[k] = 0;
        }
        if (pick < 0) {
            for (int32_t i = 0; i < n; i++)
                if (s->w[i] > 0 && !guard_allows(gd, vb, s->idx[i]))
                    s->w[i] = 0;
            const int32_t k = guarded_draw(s, s->w, n);
            pick = k >= 0 ? s->idx[k] : -1;
        }
    }
    if (pick < 0) /* no candidate is allowed: the best allowed token of all */
        pick = best_allowed(gd, vb, lg, s->n_vocab);
    if (pick >= 0 && !(vb->end && vb->end[pick]))
        guard_feed(gd, vb->data + vb->off[pick], vb->off[pick + 1] - vb->off[pick]);
    return pick;
}
