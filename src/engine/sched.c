/* sched: continuous batching on one engine thread (see sched.h). */
#define _POSIX_C_SOURCE 200809L
#include "sched.h"

#include "../base/clock.h"
#include "../base/err.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct sched_req {
    /* set before sched_submit (sched_req_new, _logprobs, _guard), read-only afterwards */
    int32_t *prompt;         /* [n_prompt] */
    int32_t n_prompt;
    int32_t max_tokens;
    struct sampler sampler;  /* initialised by the submitter */
    /* shared, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t *out;            /* [n_out] generated tokens (eos excluded) */
    int32_t n_out, cap_out;
    /* log-probabilities (sched_req_logprobs): of each output token under the
     * model (log-softmax of its logits, before sampling's adjustments), and the
     * n_top most likely alternatives, best first; -1: not asked for */
    int32_t n_top;
    float *lp;               /* [cap_out] */
    int32_t *top_id;         /* [cap_out][n_top] */
    float *top_lp;           /* [cap_out][n_top] */
    /* constrained output (sched_req_guard): the vocabulary's bytes (NULL: free
     * text), the grammar (owned) and the guard over what was generated so far */
    const struct vocab_bytes *vb;
    struct grammar gm;
    struct guard guard;
    enum sched_finish finish;
    bool cancel;
    char error[256];
    int refs;
    int32_t n_cached;        /* prompt tokens reused from an earlier conversation (set at admission) */
    bool admitted;           /* it holds a slot: n_cached is final */
    double t_submit, t_first, t_done; /* seconds (monotonic): submitted, first token, finished */
    /* engine side */
    int32_t seq, n_fed;      /* prompt tokens already in the cache */
    int32_t n_prefilled;     /* n_fed as pollers see it (under mu): a long prompt's progress */
    bool ckpt_due;           /* recurrent models: keep a checkpoint after this step */
    int32_t ckpt_at;         /* recurrent models: a checkpoint to keep mid-prompt, where the prompt
                                leaves a cached conversation it shares a long prefix with; -1: none */
    int32_t ckpt_end;        /* recurrent models: the end-of-prompt checkpoint (sched_req_reply_at) */
    int32_t dseq;            /* its sequence in the draft engine (KFlash), -1 until it speculates */
    int32_t *hist;           /* prompt + output, for penalties */
    struct sched_req *next;
};

#define SCHED_CACHE_SLOTS 8 /* finished conversations kept for prefix reuse */
#define SCHED_CKPT_MIN 64   /* recurrent models: the fewest tokens a mid-prompt checkpoint must save */
#define SCHED_BRANCH_KEPT 2 /* mid-prompt checkpoints (the most recently used) evicted only after the rest */
#define SCHED_MAX_QUEUE 32  /* waiting requests beyond which the server says it is overloaded
                               (below the server's connections from one address, so that it can be reached) */

/* A finished sequence kept in the KV cache: a later request that starts with
 * the same tokens (the next turn of an agent's conversation) forks it. */
struct cached {
    int32_t seq;    /* -1: empty */
    int32_t *toks;  /* [n] tokens whose K/V the sequence holds */
    int32_t n;
    uint64_t used;  /* LRU clock */
    bool branch;    /* a mid-prompt checkpoint: where prompts part (a system prompt's end) */
};

struct sched {
    struct engine e;
    struct model *m;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct sched_req *queue;   /* submitted, not yet admitted */
    struct sched_req **active; /* [n_seq_max] */
    int32_t n_seq_max, max_batch, prefill_chunk, n_ctx;
    int32_t slack;     /* cache rows a request may take past its prompt and max_tokens: a speculative tree's */
    int32_t *fit_seq;  /* [n_seq_max + 1] scratch of sched_fits */
    struct cached cache[SCHED_CACHE_SLOTS];
    uint64_t clock;
    struct sched_stats stats; /* under mu */
    bool stop;
    bool quiet; /* no line on stderr per finished request */
    /* KFlash (spec_on): the draft's engine and the speculation state */
    bool spec_on;
    struct model *dm;
    struct engine de;
    struct spec k;     /* owns the buffers and the tuner */
    struct spec *lane; /* [n_seq_max]: each slot's tree, k's buffers */
    int32_t *lane_row; /* [n_seq_max]: a slot's first logit row in the verify pass, -1: none */
    /* [n_seq_max]: the tuner of steps with i+1 requests speculating (what pays
     * alone, a wide tree, may not with four at once) */
    struct spec_tuner *tuner;
    /* where the tuners are kept (sched_spec_persist): the file, the caller's
     * key, and whether tuner i was saved once it settled */
    char *tune_path, *tune_key;
    bool *tune_saved;
    /* step buffers [max_batch] */
    int32_t *tok, *pos, *seq, *par, *owner;
    uint8_t *want;
    int32_t max_out; /* rows a step wants logits for, at most: one a request, a tree's nodes when speculating */
    float *logits;   /* [max_out][vocab] */
    /* [max_out][k]: each output row's k largest logits, when every draw
     * needs only those (sampler_top_need; k = 1: every sampler greedy) */
    int32_t *top_ids; /* [max_out][TOP_K_MAX] */
    float *top_vals;  /* [max_out][TOP_K_MAX] */
};

struct sched_req *sched_req_new(const int32_t *prompt, int32_t n, const struct sampler_params *sp, int32_t max_tokens,
                                int32_t n_vocab)
{
    struct sched_req *r = calloc(1, sizeof *r);
    if (!r) {
        err_set("sched: out of memory");
        return NULL;
    }
    r->dseq = -1;
    r->ckpt_at = -1;
    r->ckpt_end = n - 1;
    r->n_top = -1;
    r->prompt = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    r->hist = malloc(sizeof(int32_t) * (size_t)(n + max_tokens + 1));
    r->cap_out = max_tokens > 0 ? max_tokens : 1;
    r->out = malloc(sizeof(int32_t) * (size_t)r->cap_out);
    if (!r->prompt || !r->hist || !r->out || sampler_init(&r->sampler, sp, n_vocab) != 0) {
        if (!r->prompt || !r->hist || !r->out)
            err_set("sched: out of memory");
        free(r->prompt);
        free(r->hist);
        free(r->out);
        free(r);
        return NULL;
    }
    memcpy(r->prompt, prompt, sizeof(int32_t) * (size_t)n);
    memcpy(r->hist, prompt, sizeof(int32_t) * (size_t)n);
    r->n_prompt = n;
    r->max_tokens = max_tokens;
    r->seq = -1;
    r->refs = 1;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    return r;
}

void sched_req_release(struct sched_req *r)
{
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left)
        return;
    sampler_free(&r->sampler);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->prompt);
    free(r->hist);
    free(r->out);
    free(r->lp);
    free(r->top_id);
    free(r->top_lp);
    grammar_free(&r->gm);
    free(r);
}

int sched_req_logprobs(struct sched_req *r, int32_t n_top)
{
    if (n_top < 0 || n_top > SCHED_MAX_TOP)
        return err_set("sched: top log-probabilities must be 0 to %d", SCHED_MAX_TOP);
    const size_t n = (size_t)r->cap_out;
    r->lp = malloc(sizeof(float) * n);
    r->top_id = malloc(sizeof(int32_t) * n * (size_t)(n_top ? n_top : 1));
    r->top_lp = malloc(sizeof(float) * n * (size_t)(n_top ? n_top : 1));
    if (!r->lp || !r->top_id || !r->top_lp)
        return err_set("sched: out of memory");
    r->n_top = n_top;
    return 0;
}

void sched_req_reply_at(struct sched_req *r, int32_t n)
{
    assert(n >= 1 && n < r->n_prompt);
    r->ckpt_end = n;
}

void sched_req_guard(struct sched_req *r, const struct vocab_bytes *vb, struct grammar *gm)
{
    r->vb = vb;
    grammar_move(&r->gm, gm);
    guard_init(&r->guard, &r->gm);
}

/* Log-probabilities of the token about to be output (index n_out) and its
 * alternatives, from the raw logits row. */
static void logprobs_fill(struct sched_req *r, const float *row, int32_t V, int32_t t)
{
    float mx = -INFINITY;
    for (int32_t v = 0; v < V; v++)
        mx = row[v] > mx ? row[v] : mx;
    double sum = 0;
    for (int32_t v = 0; v < V; v++)
        sum += exp((double)(row[v] - mx));
    const float lse = mx + (float)log(sum);
    const int32_t i = r->n_out, k = r->n_top;
    int32_t *id = r->top_id + (size_t)i * (size_t)k;
    float *lp = r->top_lp + (size_t)i * (size_t)k;
    for (int32_t j = 0; j < k; j++) /* insertion into the k best (ties: lower id first) */
        id[j] = -1;
    for (int32_t v = 0; v < V && k > 0; v++) {
        if (id[k - 1] >= 0 && row[v] <= row[id[k - 1]])
            continue;
        int32_t j = k - 1;
        while (j > 0 && (id[j - 1] < 0 || row[v] > row[id[j - 1]])) {
            id[j] = id[j - 1];
            j--;
        }
        id[j] = v;
    }
    for (int32_t j = 0; j < k; j++)
        lp[j] = row[id[j]] - lse;
    r->lp[i] = row[t] - lse;
}

int32_t sched_req_poll(struct sched_req *r, int32_t seen, double seconds, struct sched_progress *p)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until); /* the condition variable's clock */
    const double t = (double)until.tv_sec + 1e-9 * (double)until.tv_nsec + (seconds > 0 ? seconds : 0);
    until.tv_sec = (time_t)t;
    until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
    pthread_mutex_lock(&r->mu);
    int rc = 0;
    while (seconds != 0 && (seen < 0 ? !r->admitted : r->n_out <= seen) && r->finish == SCHED_RUNNING && rc == 0)
        rc = seconds < 0 ? pthread_cond_wait(&r->cv, &r->mu) : pthread_cond_timedwait(&r->cv, &r->mu, &until);
    /* t_first is written before the first token is published, t_done before the end */
    const double first = r->n_out > 0 ? r->t_first : 0, done = r->finish != SCHED_RUNNING ? r->t_done : 0;
    *p = (struct sched_progress){
        .n_out = r->n_out, .n_cached = r->n_cached, .n_prefilled = r->n_prefilled, .admitted = r->admitted,
        .finish = r->finish};
    pthread_mutex_unlock(&r->mu);
    p->t_prefill = first > 0 ? first - r->t_submit : done > 0 ? done - r->t_submit : 0;
    p->t_decode = first > 0 && done > 0 ? done - first : 0;
    return p->n_out;
}

const int32_t *sched_req_out(const struct sched_req *r) { return r->out; }
const char *sched_req_error(const struct sched_req *r) { return r->error; }
struct sampler *sched_req_sampler(struct sched_req *r) { return &r->sampler; }

int32_t sched_req_logprob(const struct sched_req *r, int32_t i, float *lp, const int32_t **top_id,
                          const float **top_lp)
{
    if (r->n_top < 0)
        return -1;
    *lp = r->lp[i];
    *top_id = r->top_id + (size_t)i * (size_t)r->n_top;
    *top_lp = r->top_lp + (size_t)i * (size_t)r->n_top;
    return r->n_top;
}

void sched_req_cancel(struct sched_req *r)
{
    pthread_mutex_lock(&r->mu);
    r->cancel = true;
    pthread_mutex_unlock(&r->mu);
}

static void cache_evict(struct sched *s, struct cached *c)
{
    engine_seq_free(&s->e, c->seq);
    free(c->toks);
    c->seq = -1;
    c->toks = NULL;
    c->n = 0;
}

/* The entry to evict, or NULL if the cache is empty: the least recently
 * used, except that the SCHED_BRANCH_KEPT most recently used mid-prompt
 * checkpoints go last. Each turn of a conversation adds two entries, so plain
 * LRU would evict the state at an agent's system prompt, which its next
 * session or sub-agent starts from, after a few turns. */
static struct cached *cache_lru(struct sched *s)
{
    struct cached *best = NULL;
    for (int pass = 0; pass < 2 && !best; pass++)
        for (int i = 0; i < SCHED_CACHE_SLOTS; i++) {
            const struct cached *c = &s->cache[i];
            if (c->seq < 0 || (best && c->used >= best->used))
                continue;
            int newer = 0; /* branch entries used more recently than c */
            for (int j = 0; j < SCHED_CACHE_SLOTS && c->branch; j++)
                newer += s->cache[j].seq >= 0 && s->cache[j].branch && s->cache[j].used > c->used;
            if (pass == 1 || !c->branch || newer >= SCHED_BRANCH_KEPT)
                best = &s->cache[i];
        }
    return best;
}

/* A free cache entry, evicting the least recently used one if none is. */
static struct cached *cache_slot(struct sched *s)
{
    for (int i = 0; i < SCHED_CACHE_SLOTS; i++)
        if (s->cache[i].seq < 0)
            return &s->cache[i];
    struct cached *slot = cache_lru(s);
    cache_evict(s, slot);
    return slot;
}

/* The cache's entries and tokens into the stats (s->mu held): the engine
 * thread owns the entries, the stats are what other threads read. */
static void cache_count(struct sched *s)
{
    s->stats.resident = 0;
    s->stats.resident_tokens = 0;
    for (int i = 0; i < SCHED_CACHE_SLOTS; i++)
        if (s->cache[i].seq >= 0) {
            s->stats.resident++;
            s->stats.resident_tokens += s->cache[i].n;
        }
}

/* Keeps a finished sequence (all of its tokens but the last sampled, which was
 * never fed) for prefix reuse, evicting the least recently used entry. */
static void cache_keep(struct sched *s, struct sched_req *r)
{
    int32_t n = engine_seq_len(&s->e, r->seq);
    struct cached *slot = cache_slot(s);
    slot->toks = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    if (!slot->toks || n < 1) {
        free(slot->toks);
        slot->toks = NULL;
        engine_seq_free(&s->e, r->seq);
        return;
    }
    memcpy(slot->toks, r->hist, sizeof(int32_t) * (size_t)n);
    slot->n = n;
    slot->seq = r->seq;
    slot->used = ++s->clock;
    slot->branch = false;
}

/* On a recurrent model, keeps the state after r's fed prompt tokens as a
 * cache entry of its own (a fork: KV blocks shared, state copied). Two places
 * are kept. One token short of the prompt's end, or where the reply starts
 * as the next turn renders it (sched_req_reply_at): a next turn renders the
 * reply differently often enough (thinking dropped, end tokens) that the
 * finished conversation alone would rarely be a prefix of it, and a repeat of
 * the same prompt must still feed its last token for logits. And where the
 * prompt leaves a cached conversation after a long shared prefix (an agent's
 * system prompt and tools, a new session or a sub-agent): the conversation's
 * state exists only at its end, so this prompt pays for the prefix again,
 * and the checkpoint spares the next one that starts with it. */
static void cache_checkpoint(struct sched *s, struct sched_req *r)
{
    struct cached *slot = cache_slot(s);
    const int32_t n = r->n_fed;
    slot->toks = malloc(sizeof(int32_t) * (size_t)n);
    slot->seq = slot->toks ? engine_seq_fork(&s->e, r->seq) : -1;
    if (slot->seq < 0) {
        free(slot->toks);
        slot->toks = NULL;
        slot->seq = -1;
        return;
    }
    memcpy(slot->toks, r->prompt, sizeof(int32_t) * (size_t)n);
    slot->n = n;
    slot->used = ++s->clock;
    slot->branch = n == r->ckpt_at;
}

static void req_finish(struct sched *s, struct sched_req *r, enum sched_finish f, const char *msg)
{
    r->t_done = clock_now_s();
    double pre = (r->t_first > 0 ? r->t_first : r->t_done) - r->t_submit, dec = r->t_first > 0 ? r->t_done - r->t_first : 0;
    const bool admitted = r->seq >= 0;
    static const char *const how[] = {"running", "stop", "length", "cancelled", "error"};
    if (!s->quiet)
        fprintf(stderr,
                "kapitsa: request %s: %d prompt tokens (%d cached), %d out; prefill %.3f s (%.0f tok/s), decode %.1f tok/s\n",
                how[f], r->n_prompt, r->n_cached, r->n_out, pre, pre > 0 ? (r->n_prompt - r->n_cached) / pre : 0.0,
                dec > 0 && r->n_out > 1 ? (r->n_out - 1) / dec : 0.0);
    if (r->dseq >= 0 && s->dm)
        engine_seq_free(&s->de, r->dseq);
    r->dseq = -1;
    if (r->seq >= 0) {
        if (f == SCHED_STOP || f == SCHED_LENGTH)
            cache_keep(s, r);
        else
            engine_seq_free(&s->e, r->seq);
    }
    r->seq = -1;
    /* counted once the cache holds the conversation, so that whoever sees r end sees it resident */
    pthread_mutex_lock(&s->mu);
    s->stats.active -= admitted;
    s->stats.prompt_tokens += r->n_prompt;
    s->stats.cached_tokens += r->n_cached;
    s->stats.generated_tokens += r->n_out;
    s->stats.cancelled += f == SCHED_CANCELLED;
    s->stats.failed += f == SCHED_ERROR;
    s->stats.prefill_seconds += pre;
    s->stats.decode_seconds += dec;
    cache_count(s);
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&r->mu);
    r->finish = f;
    if (msg)
        snprintf(r->error, sizeof r->error, "%s", msg);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    sched_req_release(r); /* the engine's reference */
}

static bool is_eos(const struct model_config *c, int32_t t)
{
    for (int32_t i = 0; i < c->n_eos; i++)
        if (c->eos_id[i] == t)
            return true;
    return false;
}

/* Frees cached conversations until `need` blocks are free (admission made
 * sure that evicting them all would be enough: sched_fits). */
static void sched_make_room(struct sched *s, int32_t need)
{
    struct cached *c;
    while (kv_cache_n_free(&s->e.kv) < need && (c = cache_lru(s)))
        cache_evict(s, c);
}

/* A sampled token for the request in slot a: an end of sequence or the token
 * limit finishes it. Returns false when it finished. */
static bool sched_emit(struct sched *s, int32_t a, int32_t t)
{
    struct sched_req *r = s->active[a];
    if (is_eos(&s->m->cfg, t)) {
        s->active[a] = NULL;
        req_finish(s, r, SCHED_STOP, NULL);
        return false;
    }
    int32_t len = r->n_prompt + r->n_out;
    r->hist[len] = t;
    if (r->n_out == 0)
        r->t_first = clock_now_s();
    pthread_mutex_lock(&r->mu);
    r->out[r->n_out++] = t;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (r->vb && guard_done(&r->guard)) { /* the grammar is complete: nothing may follow */
        s->active[a] = NULL;
        req_finish(s, r, SCHED_STOP, NULL);
        return false;
    }
    if (r->n_out >= r->max_tokens) {
        s->active[a] = NULL;
        req_finish(s, r, SCHED_LENGTH, NULL);
        return false;
    }
    return true;
}

static void sched_fail(struct sched *s, int32_t a, const char *msg)
{
    struct sched_req *r = s->active[a];
    s->active[a] = NULL;
    req_finish(s, r, SCHED_ERROR, msg);
}

/* Tuner i's line in the tuning file: the caller's key, the device, and how
 * many requests speculate at once. */
static void tune_key(const struct sched *s, int32_t i, char *key, size_t n)
{
    snprintf(key, n, "%s|%s|%d", s->tune_key, s->e.be->ops->name, (int)i + 1);
}

/* Keeps tuner i in the tuning file; a failure is reported, not fatal (the
 * next run tunes from nothing). */
static void tune_save(const struct sched *s, int32_t i)
{
    char key[8192];
    tune_key(s, i, key, sizeof key);
    if (spec_tuner_save(&s->tuner[i], s->tune_path, key) != 0 && !s->quiet)
        fprintf(stderr, "kapitsa: warning: the KFlash tuning is not kept: %s\n", err_msg());
}

int32_t sched_spec_persist(struct sched *s, const char *path, const char *key)
{
    if (!s->spec_on || !s->k.p.tune || s->tune_path)
        return 0;
    s->tune_path = strdup(path);
    s->tune_key = strdup(key);
    s->tune_saved = calloc((size_t)s->n_seq_max, sizeof *s->tune_saved);
    if (!s->tune_path || !s->tune_key || !s->tune_saved) {
        free(s->tune_path);
        free(s->tune_key);
        free(s->tune_saved);
        s->tune_path = s->tune_key = NULL;
        s->tune_saved = NULL;
        return 0;
    }
    int32_t n = 0;
    for (int32_t i = 0; i < s->n_seq_max; i++) {
        char k[8192];
        tune_key(s, i, k, sizeof k);
        n += spec_tuner_load(&s->tuner[i], path, k);
    }
    return n;
}

/* KFlash for the decoding requests in slots act[0..n_act): each proposes its
 * tree (the draft's forwards one request at a time), every tree is verified
 * in one target forward, then each request's tokens are emitted in order, as
 * if sampled one by one. The trees share the batch (and, on a recurrent
 * model, the states the engine keeps for tree rows): each gets an equal part. */
static void sched_spec_step(struct sched *s, const int32_t *act, int32_t n_act)
{
    char msg[256];
    int32_t cap = s->max_batch / n_act - 1;
    if (engine_is_recurrent(&s->e) && s->e.n_keep / n_act < cap)
        cap = s->e.n_keep / n_act;
    if (cap > s->k.max_nodes)
        cap = s->k.max_nodes;
    int32_t need = 0;
    for (int32_t i = 0; i < n_act; i++)
        need += kv_seq_need(&s->e.kv, s->active[act[i]]->seq, cap + 1);
    sched_make_room(s, need);
    int32_t n = 0, n_want = 0, n_live = 0;
    for (int32_t i = 0; i < n_act; i++) {
        const int32_t a = act[i];
        struct sched_req *r = s->active[a];
        struct spec *l = &s->lane[a];
        l->tun = &s->tuner[n_act - 1];
        l->catchup_first = i + 1 < n_act;
        s->lane_row[a] = -1;
        if (s->dm && r->dseq < 0 && (r->dseq = engine_seq_new(&s->de)) < 0) {
            sched_fail(s, a, err_msg());
            continue;
        }
        spec_reset(l, r->seq, r->dseq);
        const int32_t len = r->n_prompt + r->n_out;
        const int32_t rows = spec_propose(l, r->hist, len, r->max_tokens - r->n_out, cap);
        if (rows < 0) {
            snprintf(msg, sizeof msg, "%s", err_msg());
            sched_fail(s, a, msg);
            continue;
        }
        s->lane_row[a] = n_want;
        n_live++;
        n_want += spec_fill(l, len, n, s->tok, s->pos, s->seq, s->par, s->want);
        n += rows;
    }
    if (n_live == 0)
        return;
    /* every lane's acceptance needs only each node's top k (greedy: k = 1):
     * the target ranks on the device and the largest k any lane needs comes back */
    int32_t k_top = 1;
    for (int32_t i = 0; i < n_act; i++)
        if (s->lane_row[act[i]] >= 0) {
            const int32_t need = spec_top_need(&s->active[act[i]]->sampler);
            k_top = need == 0 || k_top == 0 ? 0 : need > k_top ? need : k_top;
        }
    struct batch b = {n, s->tok, s->pos, s->seq, s->par, s->want};
    if (engine_forward(&s->e, &b, k_top ? NULL : s->logits, NULL) < 0 ||
        (k_top && engine_out_top(&s->e, k_top, s->top_ids, s->top_vals) != 0)) {
        snprintf(msg, sizeof msg, "%s", err_msg());
        for (int32_t i = 0; i < n_act; i++)
            if (s->lane_row[act[i]] >= 0)
                sched_fail(s, act[i], msg);
        return;
    }
    pthread_mutex_lock(&s->mu);
    s->stats.spec_forwards++;
    pthread_mutex_unlock(&s->mu);
    const size_t V = (size_t)s->m->cfg.vocab_size;
    for (int32_t i = 0; i < n_act; i++) {
        const int32_t a = act[i];
        if (s->lane_row[a] < 0)
            continue;
        struct sched_req *r = s->active[a];
        const int32_t len = r->n_prompt + r->n_out;
        const size_t row = (size_t)s->lane_row[a];
        const struct spec_rows in = {k_top ? NULL : s->logits + row * V, s->top_ids + row * (size_t)k_top,
                                     s->top_vals + row * (size_t)k_top, k_top};
        const int32_t k = spec_accept(&s->lane[a], &r->sampler, r->hist, len, r->hist + len, &in);
        if (k < 1) {
            snprintf(msg, sizeof msg, "%s", err_msg());
            sched_fail(s, a, msg);
            continue;
        }
        pthread_mutex_lock(&s->mu);
        s->stats.spec_passes++;
        s->stats.spec_tokens += k;
        pthread_mutex_unlock(&s->mu);
        for (int32_t j = 0; j < k && sched_emit(s, a, r->hist[len + j]); j++)
            ;
    }
    if (s->tune_path && !s->tune_saved[n_act - 1] && spec_tuner_settled(&s->tuner[n_act - 1])) {
        s->tune_saved[n_act - 1] = true;
        tune_save(s, n_act - 1);
    }
}

/* One step over every active request; false when there was nothing to do. */
static bool sched_step(struct sched *s)
{
    /* the decoding requests' tokens are placed whatever the prompts take */
    int32_t n = 0, n_dec = 0, need = 0;
    for (int32_t a = 0; a < s->n_seq_max; a++) {
        struct sched_req *r = s->active[a];
        if (!r)
            continue;
        pthread_mutex_lock(&r->mu);
        bool cancel = r->cancel;
        pthread_mutex_unlock(&r->mu);
        if (cancel) {
            s->active[a] = NULL;
            req_finish(s, r, SCHED_CANCELLED, NULL);
            continue;
        }
        n_dec += r->n_fed >= r->n_prompt;
    }
    for (int32_t a = 0; a < s->n_seq_max; a++) {
        struct sched_req *r = s->active[a];
        if (!r)
            continue;
        if (r->n_fed < r->n_prompt) { /* a prefill chunk */
            int32_t k = r->n_prompt - r->n_fed, room = s->max_batch - n - n_dec;
            if (k > s->prefill_chunk)
                k = s->prefill_chunk;
            if (k > room)
                k = room;
            if (k < 1)
                continue;
            /* recurrent models: stop at the next checkpoint (mid-prompt, then
             * one short of the prompt's end) */
            const int32_t ck = r->ckpt_at > r->n_fed ? r->ckpt_at : r->ckpt_end;
            if (engine_is_recurrent(&s->e) && r->n_fed < ck && r->n_fed + k > ck)
                k = ck - r->n_fed;
            r->ckpt_due = engine_is_recurrent(&s->e) && ck > 0 && r->n_fed + k == ck;
            need += kv_seq_need(&s->e.kv, r->seq, k);
            for (int32_t i = 0; i < k; i++, n++) {
                s->tok[n] = r->prompt[r->n_fed + i];
                s->pos[n] = r->n_fed + i;
                s->seq[n] = r->seq;
                s->par[n] = i == 0 ? -1 : n - 1;
                s->want[n] = r->n_fed + i == r->n_prompt - 1;
                s->owner[n] = a;
            }
            r->n_fed += k;
            pthread_mutex_lock(&r->mu);
            r->n_prefilled = r->n_fed;
            pthread_mutex_unlock(&r->mu);
        } else { /* the last sampled token */
            int32_t len = r->n_prompt + r->n_out;
            n_dec--;
            s->tok[n] = r->hist[len - 1];
            s->pos[n] = len - 1;
            s->seq[n] = r->seq;
            s->par[n] = -1;
            s->want[n] = 1;
            s->owner[n] = a;
            n++;
            need += kv_seq_need(&s->e.kv, r->seq, 1);
        }
    }
    if (n == 0)
        return false;
    /* every request decoding: they speculate instead (not when one wants
     * log-probabilities or constrained output, which a speculative step lacks) */
    bool spec = s->spec_on;
    for (int32_t i = 0; i < n && spec; i++) {
        const struct sched_req *r = s->active[s->owner[i]];
        spec = s->par[i] == -1 && r->n_out > 0 && r->n_top < 0 && !r->vb;
    }
    if (spec) {
        sched_spec_step(s, s->owner, n);
        return true;
    }
    sched_make_room(s, need);
    /* requests whose draws need only the largest logits (greedy: the argmax;
     * top_k with nothing changing the logits first: those k) and nothing else
     * to report read k numbers per row, not the vocabulary (a GPU's copy, and
     * the host's pass over it) */
    int32_t k_top = 1;
    for (int32_t i = 0; i < n && k_top > 0; i++)
        if (s->want[i]) {
            const struct sched_req *r = s->active[s->owner[i]];
            const int32_t need = r->vb || r->n_top >= 0 ? 0 : sampler_top_need(&r->sampler);
            k_top = need < 1 || need > TOP_K_MAX ? 0 : need > k_top ? need : k_top;
        }
    struct batch b = {n, s->tok, s->pos, s->seq, s->par, s->want};
    int32_t n_out = engine_forward(&s->e, &b, k_top ? NULL : s->logits, NULL);
    if (n_out < 0 || (k_top && engine_out_top(&s->e, k_top, s->top_ids, s->top_vals) != 0) ||
        engine_commit_all(&s->e) != 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", err_msg());
        for (int32_t a = 0; a < s->n_seq_max; a++)
            if (s->active[a]) {
                req_finish(s, s->active[a], SCHED_ERROR, msg);
                s->active[a] = NULL;
            }
        return true;
    }
    for (int32_t a = 0; a < s->n_seq_max; a++)
        if (s->active[a] && s->active[a]->ckpt_due) {
            s->active[a]->ckpt_due = false;
            cache_checkpoint(s, s->active[a]);
        }
    const int32_t V = s->m->cfg.vocab_size;
    for (int32_t i = 0, j = 0; i < n; i++) {
        if (!s->want[i])
            continue;
        struct sched_req *r = s->active[s->owner[i]];
        int32_t len = r->n_prompt + r->n_out;
        const float *row = s->logits + (int64_t)j * V;
        const int32_t t = k_top ? sampler_sample_top(&r->sampler, s->top_ids + (int64_t)j * k_top,
                                                     s->top_vals + (int64_t)j * k_top, k_top)
                          : r->vb ? sampler_sample_guarded(&r->sampler, &r->guard, r->vb, row, r->hist, len)
                                  : sampler_sample(&r->sampler, row, r->hist, len);
        j++;
        if (t < 0) { /* the guard found no token that continues the output */
            s->active[s->owner[i]] = NULL;
            req_finish(s, r, SCHED_ERROR, "no token of the vocabulary can continue the constrained output");
            continue;
        }
        if (r->n_top >= 0 && r->n_out < r->cap_out)
            logprobs_fill(r, row, V, t);
        sched_emit(s, s->owner[i], t);
    }
    return true;
}

/* A sequence for r: a fork of the cached conversation sharing the longest
 * prefix with its prompt (at least one token is left to feed, for its logits),
 * else a new one; least recently used cache entries make room. -1 if none.
 * On a recurrent model an entry is usable only if the prompt extends all of
 * it (its state cannot be rewound); the prompt-end checkpoints that
 * sched_step keeps are what a next turn usually extends. A longer prefix
 * shared with an entry the prompt leaves becomes r's mid-prompt checkpoint. */
static int32_t sched_seq_for(struct sched *s, struct sched_req *r)
{
    struct cached *best = NULL;
    int32_t best_n = 0, share = 0;
    for (int i = 0; i < SCHED_CACHE_SLOTS; i++) {
        struct cached *c = &s->cache[i];
        int32_t n = 0, lim = c->n < r->n_prompt - 1 ? c->n : r->n_prompt - 1;
        if (c->seq < 0)
            continue;
        while (n < lim && c->toks[n] == r->prompt[n])
            n++;
        if (n > share)
            share = n;
        if (engine_is_recurrent(&s->e) && n != c->n)
            continue; /* a recurrent state exists only at the entry's end */
        if (n > best_n) {
            best_n = n;
            best = c;
        }
    }
    for (;;) {
        int32_t seq = best ? engine_seq_fork(&s->e, best->seq) : engine_seq_new(&s->e);
        if (seq >= 0) {
            if (best) {
                engine_seq_truncate(&s->e, seq, best_n);
                best->used = ++s->clock;
                r->n_fed = best_n;
                pthread_mutex_lock(&r->mu);
                r->n_cached = best_n;
                pthread_mutex_unlock(&r->mu);
            }
            if (engine_is_recurrent(&s->e) && share - r->n_fed >= SCHED_CKPT_MIN && share < r->ckpt_end)
                r->ckpt_at = share;
            return seq;
        }
        struct cached *victim = cache_lru(s);
        if (!victim)
            return -1;
        if (victim == best)
            best = NULL, best_n = 0;
        cache_evict(s, victim);
    }
}

/* Admission reserves what a request may hold at the longest: the blocks of
 * its prompt and max_tokens (and of a speculative tree past them). q (its
 * sequence just made by sched_seq_for) fits when the blocks the running
 * requests and q hold, plus what each may still take, fit the cache. Blocks
 * only cached conversations hold count as free: sched_make_room evicts them
 * as steps need the room. Reserving rather than admitting and pre-empting:
 * tokens go to the client as they come, and a recurrent model's state cannot
 * be cut back, so a pre-empted request would recompute its prompt and output
 * (and rewind its sampler, grammar and draft) to resume; reserving costs only
 * concurrency when requests stop well before max_tokens. The draft engine
 * (KFlash) holds a private sequence per request, counted the same way. */
static bool sched_fits(struct sched *s, struct sched_req *q)
{
    struct kv_cache *kv = &s->e.kv;
    const int32_t dbs = s->dm ? s->de.kv.block_size : 1;
    int32_t n = 0, need = 0, d_need = 0;
    for (int32_t a = 0; a <= s->n_seq_max; a++) {
        const struct sched_req *r = a < s->n_seq_max ? s->active[a] : q;
        if (!r)
            continue;
        const int32_t span = r->n_prompt + r->max_tokens + s->slack, len = kv->len[r->seq];
        s->fit_seq[n++] = r->seq;
        need += kv_seq_need(kv, r->seq, span > len ? span - len : 0);
        d_need += (span + dbs - 1) / dbs;
    }
    if (s->dm && d_need > s->de.kv.n_blocks)
        return false;
    return kv_cache_n_held(kv, s->fit_seq, n) + need <= kv->n_blocks;
}

/* Moves queued requests into free slots, in order, while they fit the cache
 * (sched_fits); the first that does not waits until running requests end. A
 * request alone always fits once the cached conversations are evicted (the
 * cache holds the context, sched_submit's limit, plus the slack). Queued
 * requests whose client left are unlinked and returned, for the caller to
 * finish once it has let go of s->mu. */
static struct sched_req *sched_admit(struct sched *s)
{
    struct sched_req *gone = NULL;
    for (struct sched_req **q = &s->queue; *q;) {
        struct sched_req *r = *q;
        pthread_mutex_lock(&r->mu);
        const bool cancel = r->cancel;
        pthread_mutex_unlock(&r->mu);
        if (!cancel) {
            q = &r->next;
            continue;
        }
        *q = r->next;
        r->next = gone;
        gone = r;
    }
    for (int32_t a = 0; a < s->n_seq_max && s->queue; a++) {
        if (s->active[a])
            continue;
        struct sched_req *r = s->queue;
        if ((r->seq = sched_seq_for(s, r)) < 0)
            break;
        bool alone = true, fits;
        for (int32_t i = 0; i < s->n_seq_max; i++)
            alone = alone && !s->active[i];
        struct cached *c;
        while (!(fits = sched_fits(s, r)) && alone && (c = cache_lru(s)))
            cache_evict(s, c);
        assert(fits || !alone);
        if (!fits) {
            engine_seq_free(&s->e, r->seq);
            r->seq = -1;
            r->n_fed = 0;
            r->ckpt_at = -1;
            pthread_mutex_lock(&r->mu);
            r->n_cached = 0;
            pthread_mutex_unlock(&r->mu);
            break;
        }
        s->queue = r->next;
        s->active[a] = r;
        s->stats.active++;
        pthread_mutex_lock(&r->mu);
        r->admitted = true;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
    return gone;
}

static void *sched_main(void *arg)
{
    struct sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        cache_count(s); /* what the last step's admissions and ends left */
        bool idle = true;
        for (int32_t a = 0; a < s->n_seq_max && idle; a++)
            idle = s->active[a] == NULL;
        while (!s->stop && idle && !s->queue)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->stop) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        struct sched_req *gone = sched_admit(s);
        pthread_mutex_unlock(&s->mu);
        while (gone) {
            struct sched_req *r = gone;
            gone = r->next;
            req_finish(s, r, SCHED_CANCELLED, NULL);
        }
        sched_step(s);
    }
    return NULL;
}

struct sched *sched_new(struct model *m, int32_t n_ctx, int32_t n_seq_max, int32_t max_batch, int32_t prefill_chunk,
                        enum dtype kv_type, struct model *draft, const struct spec_params *sp)
{
    if (prefill_chunk < 1 || prefill_chunk > max_batch || n_seq_max > max_batch) {
        err_set("sched: a prefill chunk of %d tokens and %d sequences need a batch of at least as many (%d)",
                prefill_chunk, n_seq_max, max_batch);
        return NULL;
    }
    struct sched *s = calloc(1, sizeof *s);
    if (!s) {
        err_set("sched: out of memory");
        return NULL;
    }
    s->m = m;
    s->n_seq_max = n_seq_max;
    s->max_batch = max_batch;
    s->prefill_chunk = prefill_chunk;
    s->n_ctx = n_ctx;
    for (int i = 0; i < SCHED_CACHE_SLOTS; i++)
        s->cache[i].seq = -1;
    s->spec_on = sp && sp->mode != SPEC_OFF;
    s->slack = s->spec_on ? sp->n_nodes + 1 : 0;
    s->dm = s->spec_on ? draft : NULL;
    const int64_t n_out = (int64_t)n_seq_max * (s->spec_on ? sp->n_nodes + 1 : 1);
    s->max_out = n_out < max_batch ? (int32_t)n_out : max_batch;
    /* the slack past the context: a request that fits the context fits alone with its tree */
    if (engine_init(&s->e, m, n_ctx + s->slack, n_seq_max + SCHED_CACHE_SLOTS, max_batch, s->max_out,
                    s->spec_on ? sp->n_nodes + 1 : 0, kv_type) != 0) {
        free(s);
        return NULL;
    }
    if (s->spec_on) {
        const int32_t d_batch = spec_engine_batch(prefill_chunk);
        if (s->dm && engine_init(&s->de, s->dm, n_ctx + s->slack, n_seq_max, d_batch, spec_engine_out(d_batch), 256, kv_type) != 0)
            goto fail_engine;
        if (spec_init(&s->k, &s->e, -1, s->dm ? &s->de : NULL, -1, sp, n_ctx) != 0)
            goto fail_draft;
        s->lane = calloc((size_t)n_seq_max, sizeof *s->lane);
        s->lane_row = calloc((size_t)n_seq_max, sizeof *s->lane_row);
        s->tuner = calloc((size_t)n_seq_max, sizeof *s->tuner);
        if (!s->lane || !s->lane_row || !s->tuner) {
            err_set("sched: out of memory");
            goto fail_spec;
        }
        for (int32_t a = 0; a < n_seq_max; a++) {
            spec_init_lane(&s->lane[a], &s->k, -1, -1);
            s->tuner[a] = s->k.tu;
        }
    }
    size_t n = (size_t)max_batch;
    s->active = calloc((size_t)n_seq_max, sizeof *s->active);
    s->fit_seq = malloc(((size_t)n_seq_max + 1) * sizeof(int32_t));
    s->tok = malloc(n * sizeof(int32_t));
    s->pos = malloc(n * sizeof(int32_t));
    s->seq = malloc(n * sizeof(int32_t));
    s->par = malloc(n * sizeof(int32_t));
    s->owner = malloc(n * sizeof(int32_t));
    s->want = malloc(n);
    s->logits = malloc((size_t)s->max_out * (size_t)m->cfg.vocab_size * sizeof(float));
    s->top_ids = malloc((size_t)s->max_out * TOP_K_MAX * sizeof(int32_t));
    s->top_vals = malloc((size_t)s->max_out * TOP_K_MAX * sizeof(float));
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (!s->active || !s->fit_seq || !s->tok || !s->pos || !s->seq || !s->par || !s->owner || !s->want || !s->logits || !s->top_ids || !s->top_vals ||
        pthread_create(&s->thread, NULL, sched_main, s) != 0) {
        err_set("sched: cannot start the engine thread");
        s->stop = true;
        sched_free(s);
        return NULL;
    }
    return s;
fail_spec:
    free(s->lane);
    free(s->lane_row);
    free(s->tuner);
    spec_free(&s->k);
fail_draft:
    if (s->de.m)
        engine_free(&s->de);
fail_engine:
    engine_free(&s->e);
    free(s);
    return NULL;
}

void sched_stop(struct sched *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    bool running = !s->stop;
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (running)
        pthread_join(s->thread, NULL);
    for (int32_t a = 0; s->active && a < s->n_seq_max; a++)
        if (s->active[a]) {
            req_finish(s, s->active[a], SCHED_CANCELLED, "server shutting down");
            s->active[a] = NULL;
        }
    pthread_mutex_lock(&s->mu);
    struct sched_req *q = s->queue;
    s->queue = NULL;
    pthread_mutex_unlock(&s->mu);
    while (q) {
        struct sched_req *r = q;
        q = r->next;
        req_finish(s, r, SCHED_CANCELLED, "server shutting down");
    }
}

void sched_free(struct sched *s)
{
    if (!s)
        return;
    sched_stop(s);
    for (int i = 0; i < SCHED_CACHE_SLOTS; i++)
        if (s->cache[i].seq >= 0)
            cache_evict(s, &s->cache[i]);
    if (s->spec_on) {
        /* what the tuners learnt since, settled or not (the next run goes on from there) */
        for (int32_t i = 0; s->tune_path && i < s->n_seq_max; i++)
            if (s->tuner[i].step > 0)
                tune_save(s, i);
        free(s->tune_path);
        free(s->tune_key);
        free(s->tune_saved);
        for (int32_t a = 0; s->lane && a < s->n_seq_max; a++)
            spec_free(&s->lane[a]);
        free(s->lane);
        free(s->lane_row);
        free(s->tuner);
        spec_free(&s->k);
        if (s->dm)
            engine_free(&s->de);
    }
    engine_free(&s->e);
    free(s->active);
    free(s->fit_seq);
    free(s->tok);
    free(s->pos);
    free(s->seq);
    free(s->par);
    free(s->owner);
    free(s->want);
    free(s->logits);
    free(s->top_ids);
    free(s->top_vals);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

int32_t sched_n_ctx(const struct sched *s) { return s->n_ctx; }
void sched_quiet(struct sched *s) { s->quiet = true; }

void sched_get_stats(struct sched *s, struct sched_stats *st)
{
    pthread_mutex_lock(&s->mu);
    *st = s->stats;
    st->queued = 0;
    for (struct sched_req *r = s->queue; r; r = r->next)
        st->queued++;
    pthread_mutex_unlock(&s->mu);
}

int sched_submit(struct sched *s, struct sched_req *r)
{
    if (r->n_prompt < 1)
        return err_set("sched: empty prompt");
    if (r->n_prompt + r->max_tokens > s->n_ctx)
        return err_set("sched: %d prompt tokens + %d to generate exceed the context of %d tokens", r->n_prompt,
                       r->max_tokens, s->n_ctx);
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
        pthread_mutex_unlock(&s->mu);
        err_set("sched: the server is shutting down");
        return -3;
    }
    int32_t queued = 0;
    struct sched_req **tail = &s->queue;
    while (*tail) {
        tail = &(*tail)->next;
        queued++;
    }
    if (queued >= SCHED_MAX_QUEUE) {
        pthread_mutex_unlock(&s->mu);
        err_set("sched: %d requests are already waiting; try again later", queued);
        return -2;
    }
    pthread_mutex_lock(&r->mu);
    r->refs++; /* the engine's */
    pthread_mutex_unlock(&r->mu);
    r->t_submit = clock_now_s();
    s->stats.requests++;
    *tail = r;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}
