/* The engine thread (sched) on hybrid models: greedy output equals a plain
 * engine run whether or not a request reuses a cached conversation, prefix
 * reuse happens only where a recurrent state exists (the end of an earlier
 * prompt or conversation, where a prompt left one it shared a long prefix
 * with, or where the reply starts as the next turn renders it), and
 * concurrent requests do not disturb each other. */
#include "../../src/backend/cpu/cpu.h"
#include "../../src/base/err.h"
#include "../../src/engine/engine.h"
#include "../../src/engine/sampler.h"
#include "../../src/engine/sched.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Greedy continuation of prompt by a fresh engine: the reference; lp (may be
 * NULL): each chosen token's log-probability. */
static void greedy_ref_lp(struct model *m, const int32_t *prompt, int32_t n, int32_t n_gen, int32_t *out, float *lp)
{
    struct engine e;
    CHECK(engine_init(&e, m, 1024, 1, 256, 256, 0, DT_F32) == 0, "%s", err_msg());
    const int32_t V = m->cfg.vocab_size;
    float *lg = malloc(sizeof(float) * (size_t)V);
    int32_t s = engine_seq_new(&e), pos[256], sq[256], par[256];
    uint8_t want[256];
    for (int32_t i = 0; i < n; i++)
        pos[i] = i, sq[i] = s, par[i] = i - 1, want[i] = i == n - 1;
    struct batch b = {n, prompt, pos, sq, par, want};
    CHECK(engine_forward(&e, &b, lg, NULL) == 1 && engine_commit_all(&e) == 0, "%s", err_msg());
    for (int32_t g = 0; g < n_gen; g++) {
        out[g] = sampler_argmax(lg, V);
        double sum = 0;
        for (int32_t v = 0; v < V && lp; v++)
            sum += exp((double)lg[v] - lg[out[g]]);
        if (lp)
            lp[g] = (float)-log(sum);
        int32_t p = n + g, pa = -1;
        uint8_t one = 1;
        struct batch d = {1, &out[g], &p, &s, &pa, &one};
        CHECK(engine_forward(&e, &d, lg, NULL) == 1 && engine_commit_all(&e) == 0, "%s", err_msg());
    }
    free(lg);
    engine_free(&e);
}

static void greedy_ref(struct model *m, const int32_t *prompt, int32_t n, int32_t n_gen, int32_t *out)
{
    greedy_ref_lp(m, prompt, n, n_gen, out, NULL);
}

static struct sched_req *submit(struct sched *s, const int32_t *prompt, int32_t n, int32_t n_gen, int32_t V)
{
    struct sampler_params sp = {.temperature = 0, .top_p = 1, .repeat_penalty = 1, .penalty_last_n = -1};
    struct sched_req *r = sched_req_new(prompt, n, &sp, n_gen, V);
    CHECK(r && sched_submit(s, r) == 0, "%s", err_msg());
    return r;
}

/* Waits until r has more than `seen` tokens or has ended; the token count. */
static int32_t wait_more(struct sched_req *r, int32_t seen)
{
    struct sched_progress p;
    return sched_req_poll(r, seen, -1, &p);
}

/* Waits until r has ended. */
static struct sched_progress wait_end(struct sched_req *r)
{
    struct sched_progress p;
    int32_t seen = 0;
    do
        seen = sched_req_poll(r, seen, -1, &p);
    while (p.finish == SCHED_RUNNING);
    return p;
}

/* Waits for r and compares its ids with the reference; returns its cached count. */
static int32_t finish(struct sched_req *r, const int32_t *want, int32_t n_gen, const char *what)
{
    const struct sched_progress p = wait_end(r);
    int same = p.n_out == n_gen && memcmp(sched_req_out(r), want, sizeof(int32_t) * (size_t)n_gen) == 0;
    CHECK(same, "%s: %d ids, differ from the plain engine run", what, p.n_out);
    sched_req_release(r);
    return p.n_cached;
}

void test_sched_hybrid(void)
{
    const char *archs[] = {"qwen3_5", "nemotron_h"};
    for (int a = 0; a < 2; a++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", test_fixtures(), archs[a]);
        struct backend *be = test_backend();
        struct model m;
        CHECK(model_load(&m, dir, be, NULL) == 0, "%s", err_msg());
        const int32_t V = m.cfg.vocab_size, G = 12;
        int32_t p1[80], p2[120], p3[70], w1[12], w2[12], w3[12];
        for (int i = 0; i < 80; i++)
            p1[i] = 2 + (i * 37 + 11) % (V - 2);
        for (int i = 0; i < 70; i++) /* shares only 30 tokens with p1 */
            p3[i] = i < 30 ? p1[i] : 2 + (i * 53 + 5) % (V - 2);
        greedy_ref(&m, p1, 80, G, w1);
        /* the next turn: p1, the reply, and new tokens */
        memcpy(p2, p1, sizeof p1);
        memcpy(p2 + 80, w1, sizeof w1);
        for (int i = 92; i < 120; i++)
            p2[i] = 2 + (i * 29 + 3) % (V - 2);
        greedy_ref(&m, p2, 120, G, w2);
        greedy_ref(&m, p3, 70, G, w3);

        struct sched *s = sched_new(&m, 2048, 2, 64, 64, DT_F32, NULL, NULL);
        CHECK(s != NULL, "%s", err_msg());
        CHECK(finish(submit(s, p1, 80, G, V), w1, G, "first turn") == 0, "nothing to reuse yet");
        int32_t c2 = finish(submit(s, p2, 120, G, V), w2, G, "second turn");
        CHECK(c2 >= 79, "%s: the second turn reused %d tokens (the first prompt is 80)", archs[a], c2);
        int32_t c3 = finish(submit(s, p3, 70, G, V), w3, G, "partial overlap");
        CHECK(c3 == 0, "%s: no state at token 30 exists, yet %d tokens were reused", archs[a], c3);
        /* two at once, in the same batches; the repeated prompts reuse all but their last token */
        struct sched_req *ra = submit(s, p3, 70, G, V), *rb = submit(s, p1, 80, G, V);
        CHECK(finish(ra, w3, G, "concurrent a") == 69, "%s: repeat of p3 reused all but one token", archs[a]);
        CHECK(finish(rb, w1, G, "concurrent b") == 79, "%s: repeat of p1 reused all but one token", archs[a]);
        /* three prompts sharing their first 100 tokens (a system prompt): the
         * second pays for them again but keeps the state where it leaves the
         * first; the third, after other conversations, starts there */
        int32_t q[3][200], wq[3][12];
        const int32_t nq[3] = {200, 180, 160};
        for (int j = 0; j < 3; j++) {
            for (int i = 0; i < nq[j]; i++)
                q[j][i] = 2 + (i < 100 ? i * 71 + 40 : i * (61 + 6 * j) + 7 * j) % (V - 2);
            greedy_ref(&m, q[j], nq[j], G, wq[j]);
        }
        CHECK(finish(submit(s, q[0], nq[0], G, V), wq[0], G, "shared prefix, first") == 0, "%s: a new prefix", archs[a]);
        int32_t cq = finish(submit(s, q[1], nq[1], G, V), wq[1], G, "shared prefix, second");
        CHECK(cq == 0, "%s: the first prompt's state exists only at its end, yet %d tokens were reused", archs[a], cq);
        /* four other conversations, two entries each: the cache's 8 fill up,
         * and the state where the prompts part is evicted last */
        for (int j = 0; j < 4; j++) {
            int32_t o[70], wo[12];
            for (int i = 0; i < 70; i++)
                o[i] = 2 + (i * (13 + 4 * j) + 17 * j + 1) % (V - 2);
            greedy_ref(&m, o, 70, G, wo);
            CHECK(finish(submit(s, o, 70, G, V), wo, G, "another conversation") == 0, "%s: nothing shared", archs[a]);
        }
        cq = finish(submit(s, q[2], nq[2], G, V), wq[2], G, "shared prefix, third");
        CHECK(cq == 100, "%s: the third prompt reused %d tokens, not the 100 it shares", archs[a], cq);
        /* a prompt ending in what the history drops (an empty reasoning
         * block, its last 4 tokens): the next turn, without them, finds the
         * state where the reply starts */
        int32_t t1[80], t2[110], wt1[12], wt2[12];
        for (int i = 0; i < 80; i++)
            t1[i] = 2 + (i * 43 + 19) % (V - 2);
        memcpy(t2, t1, sizeof(int32_t) * 76);
        for (int i = 76; i < 110; i++)
            t2[i] = 2 + (i * 31 + 9) % (V - 2);
        greedy_ref(&m, t1, 80, G, wt1);
        greedy_ref(&m, t2, 110, G, wt2);
        struct sampler_params sp = {.temperature = 0, .top_p = 1, .repeat_penalty = 1, .penalty_last_n = -1};
        struct sched_req *rt = sched_req_new(t1, 80, &sp, G, V);
        CHECK(rt != NULL, "%s", err_msg());
        sched_req_reply_at(rt, 76);
        CHECK(sched_submit(s, rt) == 0, "%s", err_msg());
        CHECK(finish(rt, wt1, G, "a prompt with a reply start") == 0, "%s: a new prompt", archs[a]);
        int32_t ct = finish(submit(s, t2, 110, G, V), wt2, G, "the turn after it");
        CHECK(ct == 76, "%s: the next turn reused %d tokens, not the 76 before the dropped block", archs[a], ct);
        sched_free(s);
        model_free(&m);
        be->ops->free(be);
    }
}

/* Agent-like traffic on a hybrid model: 16 requests, two at a time, each a
 * system prompt (one of three, 70 to 150 tokens, two sharing their first 90)
 * then its own question, or a next turn of an earlier request (its prompt,
 * its answer, a question), in chunks of 24 tokens so that checkpoints fall
 * inside chunks. Whatever the cache reuses, keeps or evicts, every answer is
 * the plain engine's, and prompts do reuse cached prefixes. */
void test_sched_hybrid_traffic(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/qwen3_5", test_fixtures());
    struct backend *be = test_backend();
    struct model m;
    CHECK(model_load(&m, dir, be, NULL) == 0, "%s", err_msg());
    const int32_t V = m.cfg.vocab_size, G = 6, NR = 16;
    const int32_t n_sys[3] = {150, 120, 70};
    int32_t sys[3][150], prompt[16][250], n_prompt[16], want[16][6];
    float want_lp[16][6];
    uint64_t rng = 7;
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < n_sys[k]; i++)
            sys[k][i] = 2 + ((k == 1 && i < 90 ? 0 : k) * 1000 + i * 37 + 5) % (V - 2);
    for (int q = 0; q < NR; q++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        const int32_t pick = (int32_t)(rng >> 33);
        int32_t n = 0;
        if (q >= 4 && pick % 3 == 0) { /* the next turn of request q - 2 or q - 4 */
            const int32_t p = q - 2 - 2 * (pick / 3 % 2);
            memcpy(prompt[q], prompt[p], sizeof(int32_t) * (size_t)n_prompt[p]);
            memcpy(prompt[q] + n_prompt[p], want[p], sizeof want[p]);
            n = n_prompt[p] + G;
        } else { /* a new session */
            const int32_t k = pick / 7 % 3;
            memcpy(prompt[q], sys[k], sizeof(int32_t) * (size_t)n_sys[k]);
            n = n_sys[k];
        }
        const int32_t extra = 5 + pick / 31 % 20;
        for (int i = 0; i < extra && n < 250; i++)
            prompt[q][n++] = 2 + (q * 7919 + i * 101) % (V - 2);
        n_prompt[q] = n;
        greedy_ref_lp(&m, prompt[q], n, G, want[q], want_lp[q]);
    }
    struct sched *s = sched_new(&m, 4096, 2, 64, 24, DT_F32, NULL, NULL);
    CHECK(s != NULL, "%s", err_msg());
    int32_t cached = 0;
    for (int q = 0; q < NR; q += 2) {
        struct sched_req *r[2];
        for (int j = 0; j < 2; j++) { /* with log-probabilities: a tiny model's ids alone move too little */
            struct sampler_params sp = {.temperature = 0, .top_p = 1, .repeat_penalty = 1, .penalty_last_n = -1};
            r[j] = sched_req_new(prompt[q + j], n_prompt[q + j], &sp, G, V);
            CHECK(r[j] && sched_req_logprobs(r[j], 0) == 0 && sched_submit(s, r[j]) == 0, "%s", err_msg());
        }
        for (int j = 0; j < 2; j++) {
            const struct sched_progress p = wait_end(r[j]);
            double d = 0;
            for (int g = 0; g < p.n_out && g < G; g++) {
                float lp;
                const int32_t *top_id;
                const float *top_lp;
                CHECK(sched_req_logprob(r[j], g, &lp, &top_id, &top_lp) == 0, "no alternatives were asked for");
                d = fmax(d, fabs((double)lp - want_lp[q + j][g]));
            }
            CHECK(d < 1e-4, "request %d: log-probabilities %.3g from the plain engine's", q + j, d);
            cached += finish(r[j], want[q + j], G, "traffic");
        }
    }
    CHECK(cached > 500, "prompts reused %d cached tokens in all", cached);
    sched_free(s);
    model_free(&m);
    be->ops->free(be);
}

/* KFlash in the engine thread: a request decoding alone speculates (with a
 * draft model, or prompt lookup alone), and so do two at once, their trees
 * verified in shared target forwards; every output equals plain greedy
 * decoding. Hybrid target (the trees share its kept states), plain draft. */
void test_sched_spec(void)
{
    char dir[512], ddir[512];
    snprintf(dir, sizeof dir, "%s/qwen3_5", test_fixtures());
    snprintf(ddir, sizeof ddir, "%s/qwen3", test_fixtures());
    struct backend *be = test_backend();
    struct model m, d;
    CHECK(model_load(&m, dir, be, NULL) == 0 && model_load(&d, ddir, be, NULL) == 0, "%s", err_msg());
    const int32_t V = m.cfg.vocab_size, G = 40;
    int32_t p1[60], p2[50], w1[40], w2[40];
    for (int i = 0; i < 60; i++) /* repeats itself: prompt lookup finds continuations */
        p1[i] = 2 + (i % 23) * 17 % (V - 2);
    for (int i = 0; i < 50; i++)
        p2[i] = 2 + (i * 41 + 9) % (V - 2);
    greedy_ref(&m, p1, 60, G, w1);
    greedy_ref(&m, p2, 50, G, w2);
    for (int with_draft = 0; with_draft < 2; with_draft++) {
        struct spec_params sp = spec_defaults();
        sp.n_nodes = 12;
        sp.depth = 6;
        struct sched *s = sched_new(&m, 4096, 2, 64, 64, DT_F32, with_draft ? &d : NULL, &sp);
        CHECK(s != NULL, "%s", err_msg());
        finish(submit(s, p1, 60, G, V), w1, G, with_draft ? "alone, draft" : "alone, lookup");
        struct sched_stats st0, st;
        sched_get_stats(s, &st0);
        CHECK(st0.spec_passes > 0 && st0.spec_forwards == st0.spec_passes && st0.spec_tokens >= st0.spec_passes,
              "alone: %lld passes in %lld forwards, %lld tokens", (long long)st0.spec_passes,
              (long long)st0.spec_forwards, (long long)st0.spec_tokens);
        struct sched_req *ra = submit(s, p1, 60, G, V), *rb = submit(s, p2, 50, G, V);
        finish(ra, w1, G, "together a");
        finish(rb, w2, G, "together b");
        sched_get_stats(s, &st);
        const int64_t passes = st.spec_passes - st0.spec_passes, fwd = st.spec_forwards - st0.spec_forwards;
        const int64_t toks = st.spec_tokens - st0.spec_tokens;
        /* all but each request's first token (and a step or two around the admissions)
         * speculated, both trees in one forward until the first request ends */
        CHECK(toks >= 2 * G - 6 && passes - fwd >= 3,
              "%s, together: %lld tokens from %lld passes in %lld forwards", with_draft ? "draft" : "lookup",
              (long long)toks, (long long)passes, (long long)fwd);
        /* sampled, two trees a forward: with top_k alone each node's top 20
         * come back; a bias of 0 (the same distribution) makes them read whole
         * rows; the same seeds give the same tokens */
        int32_t got[2][2][40], n_got[2][2];
        for (int rows = 0; rows < 2; rows++) {
            struct sched_req *rq[2];
            for (int q = 0; q < 2; q++) {
                struct sampler_params gp = sampler_defaults();
                gp.temperature = 0.8f;
                gp.top_k = 20;
                gp.seed = 5 + (uint64_t)q;
                gp.n_bias = rows;
                rq[q] = sched_req_new(q ? p2 : p1, q ? 50 : 60, &gp, G, V);
                CHECK(rq[q] && sched_submit(s, rq[q]) == 0, "%s", err_msg());
            }
            for (int q = 0; q < 2; q++) {
                n_got[rows][q] = wait_end(rq[q]).n_out; /* fewer than G if it drew the end of text */
                CHECK(n_got[rows][q] >= 1 && n_got[rows][q] <= G, "sampled %d: %d tokens", q, n_got[rows][q]);
                memcpy(got[rows][q], sched_req_out(rq[q]), sizeof(int32_t) * (size_t)n_got[rows][q]);
                sched_req_release(rq[q]);
            }
        }
        for (int q = 0; q < 2; q++)
            CHECK(n_got[0][q] == n_got[1][q] &&
                      memcmp(got[0][q], got[1][q], sizeof(int32_t) * (size_t)n_got[0][q]) == 0,
                  "%s, sampled request %d: top lists and whole rows give different tokens", with_draft ? "draft" : "lookup",
                  q);
        sched_free(s);
    }
    model_free(&d);
    model_free(&m);
    be->ops->free(be);
}

/* Whether the file at path has a line that starts with prefix. */
static bool file_has_line(const char *path, const char *prefix)
{
    char line[1024];
    bool found = false;
    FILE *f = fopen(path, "r");
    while (f && !found && fgets(line, sizeof line, f))
        found = strncmp(line, prefix, strlen(prefix)) == 0;
    if (f)
        fclose(f);
    return found;
}

/* The KFlash tuner kept between runs (sched_spec_persist): a first sched
 * finds nothing stored, tunes, and writes its choice once the tuner settles
 * (while it still runs), in a folder it makes, other keys' lines kept; a
 * second loads it. A third, given a stored plain step at a speed nothing
 * beats, starts from that choice: every step of its request verifies the
 * root alone (one token a pass), where a fresh tuner would try trees. Draft =
 * target, so a tree would be accepted whole. */
void test_sched_spec_persist(void)
{
    char dir[512], path[600], key[700];
    snprintf(dir, sizeof dir, "%s/qwen3", test_fixtures());
    snprintf(path, sizeof path, "%s/tune/kapitsa/kflash.tsv", test_tmpdir());
    struct backend *be = test_backend();
    struct model m;
    CHECK(model_load(&m, dir, be, NULL) == 0, "%s", err_msg());
    const int32_t V = m.cfg.vocab_size, G = 30;
    int32_t p1[60], w1[G];
    for (int i = 0; i < 60; i++)
        p1[i] = 2 + (i * 41 + 9) % (V - 2);
    greedy_ref(&m, p1, 60, G, w1);
    struct spec_params sp = spec_defaults();
    sp.n_nodes = 12;
    sp.depth = 6;
    sp.tune = true;
    snprintf(key, sizeof key, "k|%s|1\t", be->ops->name);
    struct sched *s = sched_new(&m, 4096, 1, 64, 64, DT_F32, &m, &sp);
    CHECK(s && sched_spec_persist(s, path, "k") == 0, "a first run loads nothing");
    bool saved = false;
    for (int i = 0; i < 25 && !saved; i++) { /* the tuner settles within 5 shapes x 4 steps */
        finish(submit(s, p1, 60, G, V), w1, G, "tuning");
        saved = file_has_line(path, key);
    }
    CHECK(saved, "no line for the settled tuner in %s", path);
    FILE *f = fopen(path, "a");
    CHECK(f != NULL, "%s", path);
    if (f) {
        fputs("other key\t3,3,0,4,5.000\n", f);
        fclose(f);
    }
    sched_free(s);
    CHECK(file_has_line(path, key) && file_has_line(path, "other key\t"), "sched_free's save lost a line");
    s = sched_new(&m, 4096, 1, 64, 64, DT_F32, &m, &sp);
    CHECK(s && sched_spec_persist(s, path, "k") == 1, "a second run starts from the stored choice");
    sched_free(s);
    f = fopen(path, "w"); /* the tuner's 5 shapes within 12 nodes, each tried, the plain step fastest */
    CHECK(f != NULL, "%s", path);
    if (f) {
        fprintf(f, "%s0,0,0,4,1e9\t3,3,0,4,1\t6,3,0,4,1\t8,4,0,4,1\t12,6,0,4,1\n", key);
        fclose(f);
    }
    s = sched_new(&m, 4096, 1, 64, 64, DT_F32, &m, &sp);
    CHECK(s && sched_spec_persist(s, path, "k") == 1, "the stored plain step is loaded");
    finish(submit(s, p1, 60, G, V), w1, G, "from the stored choice");
    struct sched_stats st;
    sched_get_stats(s, &st);
    CHECK(st.spec_passes > 0 && st.spec_tokens == st.spec_passes,
          "from a stored plain step: %lld tokens in %lld passes, wanted one a pass", (long long)st.spec_tokens,
          (long long)st.spec_passes);
    sched_free(s);
    model_free(&m);
    be->ops->free(be);
}

/* sched_stop: a request generating and one queued behind it both end
 * cancelled with the reason, and a later submission is refused as such (-3,
 * which the server answers with 503, not as the client's fault). */
void test_sched_stop(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/qwen3", test_fixtures());
    struct backend *be = test_backend();
    struct model m;
    CHECK(model_load(&m, dir, be, NULL) == 0, "%s", err_msg());
    const int32_t V = m.cfg.vocab_size;
    int32_t p[20];
    for (int i = 0; i < 20; i++)
        p[i] = 2 + (i * 29 + 3) % (V - 2);
    struct sched *s = sched_new(&m, 4096, 1, 64, 64, DT_F32, NULL, NULL);
    CHECK(s != NULL, "%s", err_msg());
    struct sched_req *run = submit(s, p, 20, 3000, V), *queued = submit(s, p, 20, 3000, V);
    CHECK(wait_more(run, 1) >= 1, "the first request generates");
    /* seen -1 waits for admission: the running request has it, the one behind it (one slot) not */
    struct sched_progress pa, pq;
    sched_req_poll(run, -1, -1, &pa);
    sched_req_poll(queued, -1, 0, &pq);
    CHECK(pa.admitted && !pq.admitted && pq.finish == SCHED_RUNNING, "admitted: running %d, queued %d",
          (int)pa.admitted, (int)pq.admitted);
    sched_stop(s);
    sched_req_poll(queued, -1, -1, &pq);
    CHECK(!pq.admitted && pq.finish == SCHED_CANCELLED, "a queued request ends cancelled without admission");
    struct sched_req *rs[2] = {run, queued};
    for (int i = 0; i < 2; i++) {
        struct sched_progress p;
        sched_req_poll(rs[i], 0, 0, &p);
        const enum sched_finish f = p.finish;
        const int32_t n = p.n_out;
        const bool said = strcmp(sched_req_error(rs[i]), "server shutting down") == 0;
        CHECK(f == SCHED_CANCELLED && said && n < 3000, "%s: finish %d after %d tokens, '%s'", i ? "queued" : "running",
              (int)f, n, sched_req_error(rs[i]));
        CHECK(i == 0 || n == 0, "the queued request generated %d tokens", n);
        sched_req_release(rs[i]);
    }
    struct sampler_params sp = {.temperature = 0, .top_p = 1, .repeat_penalty = 1, .penalty_last_n = -1};
    struct sched_req *late = sched_req_new(p, 20, &sp, 4, V);
    CHECK(late && sched_submit(s, late) == -3, "a submission after the stop is refused as stopping");
    sched_req_release(late);
    sched_free(s);
    model_free(&m);
    be->ops->free(be);
}

/* A request sampling with top_k (and one with top_k and top_p, beside a greedy
 * one in the same batches, and two with banned tokens, as ignore_eos bans the
 * end: greedy, and top_k) reads only each row's top logits from the engine
 * (sampler_sample_top) and draws the tokens a sampler over the whole rows
 * draws with the same seed. */
void test_sched_top_k(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/qwen3", test_fixtures());
    struct backend *be = test_backend();
    struct model m;
    CHECK(model_load(&m, dir, be, NULL) == 0, "%s", err_msg());
    const int32_t V = m.cfg.vocab_size, G = 24;
    int32_t p[30];
    for (int i = 0; i < 30; i++)
        p[i] = 2 + (i * 31 + 7) % (V - 2);
    enum { NQ = 5 };
    struct sampler_params sps[NQ];
    for (int q = 0; q < NQ; q++)
        sps[q] = sampler_defaults();
    sps[0].temperature = 1.2f, sps[0].top_k = 8, sps[0].seed = 11;
    sps[1].temperature = 0.9f, sps[1].top_k = 20, sps[1].top_p = 0.8f, sps[1].seed = 12;
    sps[2].temperature = 0.0f;
    sps[3].temperature = 0.0f;
    sps[4].temperature = 1.2f, sps[4].top_k = 8, sps[4].seed = 11;
    int32_t want[NQ][24];
    for (int q = 0; q < NQ; q++) { /* the reference: whole rows through sampler_sample */
        if (q >= 3) { /* banned: the greedy request's first two tokens */
            sps[q].n_bias = 2;
            sps[q].bias_id[0] = want[2][0], sps[q].bias[0] = -INFINITY;
            sps[q].bias_id[1] = want[2][1], sps[q].bias[1] = -INFINITY;
        }
        struct engine e;
        struct sampler sm;
        CHECK(engine_init(&e, &m, 1024, 1, 64, 64, 0, DT_F32) == 0 && sampler_init(&sm, &sps[q], V) == 0, "%s", err_msg());
        float *lg = malloc(sizeof(float) * (size_t)V);
        int32_t s = engine_seq_new(&e), pos[30], sq[30], par[30], hist[64];
        uint8_t w[30];
        for (int32_t i = 0; i < 30; i++)
            pos[i] = i, sq[i] = s, par[i] = i - 1, w[i] = i == 29, hist[i] = p[i];
        struct batch b = {30, p, pos, sq, par, w};
        CHECK(engine_forward(&e, &b, lg, NULL) == 1 && engine_commit_all(&e) == 0, "%s", err_msg());
        for (int32_t g = 0; g < G; g++) {
            want[q][g] = hist[30 + g] = sampler_sample(&sm, lg, hist, 30 + g);
            int32_t ps = 30 + g, pa = -1;
            uint8_t one = 1;
            struct batch d = {1, &want[q][g], &ps, &s, &pa, &one};
            CHECK(engine_forward(&e, &d, lg, NULL) == 1 && engine_commit_all(&e) == 0, "%s", err_msg());
        }
        free(lg);
        sampler_free(&sm);
        engine_free(&e);
    }
    CHECK(want[3][0] != want[2][0], "the ban changes the greedy output");
    struct sched *sc = sched_new(&m, 4096, NQ, 64, 64, DT_F32, NULL, NULL);
    CHECK(sc != NULL, "%s", err_msg());
    struct sched_req *rs[NQ];
    for (int q = 0; q < NQ; q++) {
        rs[q] = sched_req_new(p, 30, &sps[q], G, V);
        CHECK(rs[q] && sched_submit(sc, rs[q]) == 0, "%s", err_msg());
    }
    const char *what[NQ] = {"top_k 8", "top_k 20, top_p 0.8", "greedy beside them", "greedy, two tokens banned",
                            "top_k 8, two tokens banned"};
    for (int q = 0; q < NQ; q++)
        finish(rs[q], want[q], G, what[q]);
    sched_free(sc);
    model_free(&m);
    be->ops->free(be);
}

/* Prompts in chunks: a 200-token prompt fed 16 tokens a step answers as a
 * plain engine run does, and its conversation stays resident; a long prompt
 * that comes while another request decodes, in a slot before it and with
 * chunks as large as the batch, leaves room in every step for the other's
 * token (one a step while it prefills); a chunk larger than the batch is
 * refused. */
void test_sched_prefill_chunks(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/qwen3", test_fixtures());
    struct backend *be = test_backend();
    struct model m;
    CHECK(model_load(&m, dir, be, NULL) == 0, "%s", err_msg());
    const int32_t V = m.cfg.vocab_size, G = 8, LONG = 1200;
    int32_t p[200], w[8], *lp = malloc(sizeof(int32_t) * LONG);
    for (int i = 0; i < 200; i++)
        p[i] = 2 + (i * 43 + 5) % (V - 2);
    for (int i = 0; i < LONG; i++)
        lp[i] = 2 + (i * 59 + 13) % (V - 2);
    greedy_ref(&m, p, 200, G, w);
    struct sched *s = sched_new(&m, 4096, 2, 64, 16, DT_F32, NULL, NULL);
    CHECK(s != NULL, "%s", err_msg());
    finish(submit(s, p, 200, G, V), w, G, "a prompt in chunks of 16");
    struct sched_stats st;
    sched_get_stats(s, &st);
    /* the conversation stays: its prompt and all but the last token generated (never fed) */
    CHECK(st.resident == 1 && st.resident_tokens == 200 + G - 1, "%d resident conversations of %lld tokens",
          (int)st.resident, (long long)st.resident_tokens);
    sched_free(s);

    s = sched_new(&m, 4096, 2, 64, 64, DT_F32, NULL, NULL);
    CHECK(s != NULL, "%s", err_msg());
    struct sched_req *x = submit(s, p, 10, 2000, V), *a = submit(s, p + 10, 10, 2000, V);
    CHECK(wait_more(a, 0) >= 1, "the decoding request starts");
    sched_req_cancel(x); /* frees the first slot: the long prompt takes it, before the decoding request */
    struct sched_req *b = submit(s, lp, LONG, 1, V);
    const int32_t a0 = wait_more(a, 0);
    CHECK(wait_more(b, 0) == 1, "the long prompt is answered");
    const int32_t a1 = wait_more(a, 0);
    /* the prompt takes at least LONG / 63 = 20 steps, each with a token of a's */
    CHECK(a1 - a0 >= 15, "the decoding request made %d tokens while a %d-token prompt was fed", a1 - a0, LONG);
    sched_req_cancel(a);
    wait_end(x);
    wait_end(a);
    sched_req_release(x);
    sched_req_release(a);
    sched_req_release(b);
    sched_free(s);
    CHECK(sched_new(&m, 4096, 2, 64, 65, DT_F32, NULL, NULL) == NULL && strstr(err_msg(), "prefill chunk"),
          "a chunk larger than the batch is refused: %s", err_msg());
    free(lp);
    model_free(&m);
    be->ops->free(be);
}

/* A cache of 256 tokens (16 blocks) and six requests of 100 tokens each (60 of
 * prompt, 40 to generate: 7 blocks) in four slots: two run at a time, the
 * others wait instead of failing for want of blocks, and every answer is the
 * plain engine run's. Two repeat earlier prompts, so that cached conversations
 * hold blocks that must be evicted first; on the hybrid, prompt-end checkpoints
 * share a running request's blocks too. A request longer than the whole
 * cache is refused at submission. */
void test_sched_cache_full(void)
{
    const char *archs[] = {"qwen3", "qwen3_5"};
    for (int arch = 0; arch < 2; arch++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", test_fixtures(), archs[arch]);
        struct backend *be = test_backend();
        struct model m;
        CHECK(model_load(&m, dir, be, NULL) == 0, "%s", err_msg());
        enum { NR = 6, NP = 60, G = 40 };
        const int32_t V = m.cfg.vocab_size;
        int32_t p[NR][NP], w[NR][G];
        for (int q = 0; q < NR; q++) {
            for (int i = 0; i < NP; i++)
                p[q][i] = q >= 4 ? p[q - 4][i] : 2 + (i * (31 + 6 * q) + 7 * q + 3) % (V - 2);
            greedy_ref(&m, p[q], NP, G, w[q]);
        }
        struct sched *s = sched_new(&m, 256, 4, 64, 64, DT_F32, NULL, NULL);
        CHECK(s != NULL, "%s", err_msg());
        struct sched_req *rs[NR];
        for (int q = 0; q < NR; q++)
            rs[q] = submit(s, p[q], NP, G, V);
        for (int q = 0; q < NR; q++)
            finish(rs[q], w[q], G, archs[arch]);
        struct sampler_params sp = {.temperature = 0, .top_p = 1, .repeat_penalty = 1, .penalty_last_n = -1};
        int32_t big[200];
        for (int i = 0; i < 200; i++)
            big[i] = 2 + i % (V - 2);
        struct sched_req *r = sched_req_new(big, 200, &sp, 100, V);
        CHECK(r && sched_submit(s, r) == -1 && strstr(err_msg(), "exceed the context"),
              "a request longer than the cache is refused: %s", err_msg());
        sched_req_release(r);
        struct sched_stats st;
        sched_get_stats(s, &st);
        CHECK(st.failed == 0 && st.requests == NR, "%s: %lld of %lld requests failed", archs[arch],
              (long long)st.failed, (long long)st.requests);
        sched_free(s);
        model_free(&m);
        be->ops->free(be);
    }
}

/* The stats count the conversations the cache keeps and their tokens (all
 * but the last sampled, never fed) as soon as a request's end is reported. */
void test_sched_resident(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/qwen3", test_fixtures());
    struct backend *be = test_backend();
    struct model m;
    CHECK(model_load(&m, dir, be, NULL) == 0, "%s", err_msg());
    enum { NP = 40, G = 8 };
    const int32_t V = m.cfg.vocab_size;
    int32_t p[2][NP], w[2][G];
    for (int q = 0; q < 2; q++) {
        for (int i = 0; i < NP; i++)
            p[q][i] = 2 + (i * (37 + 4 * q) + 11 * q) % (V - 2);
        greedy_ref(&m, p[q], NP, G, w[q]);
    }
    struct sched *s = sched_new(&m, 1024, 2, 64, 64, DT_F32, NULL, NULL);
    CHECK(s != NULL, "%s", err_msg());
    struct sched_stats st;
    sched_get_stats(s, &st);
    CHECK(st.resident == 0 && st.resident_tokens == 0, "%d resident before any request", st.resident);
    for (int q = 0; q < 2; q++) {
        finish(submit(s, p[q], NP, G, V), w[q], G, "resident");
        sched_get_stats(s, &st);
        CHECK(st.resident == q + 1 && st.resident_tokens == (q + 1) * (NP + G - 1),
              "after %d requests: %d resident, %lld tokens", q + 1, st.resident, (long long)st.resident_tokens);
    }
    sched_free(s);
    model_free(&m);
    be->ops->free(be);
}
