/* spec: KFlash, tree speculative decoding over two engines (a target model and
 * a small draft model with the same vocabulary).
 *
 * One step: the draft proposes a best-first tree of candidates below the
 * pending token (by cumulative draft log-probability, batching the draft's
 * forward over each round's new nodes), merged with a prompt-lookup chain (the
 * tokens that followed the last few tokens where they occurred earlier in the
 * context); the target verifies every node in one forward (the engine's tree
 * visibility); acceptance walks from the root: at each node the target's
 * sampling distribution p (the sampler's, after penalties, temperature and
 * filters) is queried against the node's children in order, accepting a child
 * with its residual probability and otherwise zeroing it and renormalising;
 * when no child is accepted the next token is drawn from the residual. Greedy
 * decoding is the special case of a one-hot p. The output distribution is
 * exactly the target's, token for token identical when greedy.
 *
 * Sequences: the caller owns both engines and one sequence in each; the draft
 * may lag the target by the tokens it never saw (accepted leaves, the bonus
 * token) and catches up inside its next forward. Hybrid models need engines
 * made with n_keep >= the node budget (each node's recurrent state comes from
 * its parent's).
 *
 * Without a draft engine (dft NULL) the tree is the prompt-lookup chain alone.
 *
 * Ownership: struct spec borrows the engines and the sampler; its buffers are
 * sized at spec_init and nothing allocates during a step. */
#ifndef KP_SPEC_H
#define KP_SPEC_H

#include "engine.h"
#include "sampler.h"

#include <stdbool.h>
#include <stdint.h>

enum spec_mode { SPEC_OFF, SPEC_CHAIN, SPEC_TREE };

#define SPEC_MAX_NODES 256
#define SPEC_MAX_DEPTH 32

/* The batch of an engine that a one-sequence speculation drives (run and
 * chat's target, any draft): a prompt in batches of the backend's chunk, at
 * least 256 (a tree's rows, a draft's catch-up before them); its forwards
 * want logits for up to a whole tree's nodes (engine_init max_out). */
static inline int32_t spec_engine_batch(int32_t prefill_chunk) { return prefill_chunk > 256 ? prefill_chunk : 256; }
static inline int32_t spec_engine_out(int32_t batch) { return batch < SPEC_MAX_NODES + 1 ? batch : SPEC_MAX_NODES + 1; }

struct spec_params {
    enum spec_mode mode;
    int32_t n_nodes;     /* tree: node budget below the root; chain: its length */
    int32_t depth;       /* tree: deepest node */
    int32_t top_k;       /* children considered per expanded node */
    bool ngram;          /* merge the prompt-lookup chain into the tree */
    int32_t ngram_min;   /* shortest suffix that must match earlier in the context */
    /* Tune the tree to the machine: choose among shapes up to n_nodes / depth
     * by measured tokens per second (see spec_tuner). */
    bool tune;
    /* Skip the draft in a step whose prompt lookup already proposes at least
     * SPEC_LOOKUP_MIN tokens (an edit repeating its input): the chain alone is
     * verified (one of the tuner's shapes). */
    bool lookup_first;
    /* For the tests only: multiply every acceptance probability by this (1 =
     * the exact rule), so that the distribution test is seen to fail. */
    double accept_bias;
};

/* Defaults: tree of 24 nodes, depth 8, 4 children per node, prompt lookup on. */
struct spec_params spec_defaults(void);

struct spec_stats {
    int64_t steps;                   /* target verify forwards */
    int64_t tokens;                  /* tokens produced (accepted + one per step) */
    int64_t accepted[SPEC_MAX_DEPTH + 1]; /* steps that accepted at least d+1 nodes */
    int64_t ngram_accepted;          /* accepted nodes that came from prompt lookup */
    double t_draft, t_verify;        /* seconds in draft and target forwards */
};

/* The tuner: tree shapes (and none: a plain step) tried in turn, then the
 * fastest used, with an occasional step on another so that changing
 * acceptance is noticed. Speed is measured (draft + verify + acceptance time
 * per produced token), so it accounts for this machine's verify-time curve
 * T(n) and draft step time. */
#define SPEC_TUNE_SHAPES 8
#define SPEC_LOOKUP_MIN 4
#define SPEC_DRAFT_TOP 16 /* draft candidates per expanded node that enter its normaliser (<= TOP_K_MAX) */
struct spec_tuner {
    int32_t n_shape;
    int32_t nodes[SPEC_TUNE_SHAPES], depth[SPEC_TUNE_SHAPES];
    bool lookup_first[SPEC_TUNE_SHAPES];
    double tok_s[SPEC_TUNE_SHAPES];  /* moving average of tokens per second, 0 = not measured */
    int32_t tries[SPEC_TUNE_SHAPES];
    int64_t step;
};

struct spec_node {
    int32_t token, parent, depth;
    float logq;           /* cumulative draft log-probability (prompt-lookup nodes: 0) */
    bool ngram;
    int32_t drow;         /* row in the last draft forward, -1 if it was not in it */
};

struct spec_cand {
    float lq;
    int32_t parent, token;
};

struct spec {
    struct engine *tgt, *dft;
    int32_t tseq, dseq;
    int32_t d_len;                    /* tokens the draft has committed */
    struct spec_params p;
    struct spec_stats st;
    struct spec_tuner tu;
    struct spec_tuner *tun;           /* the tuner in use: &tu, or its main spec's for a lane */
    int32_t tcur;                     /* the tuner shape of this step */
    int32_t vocab;
    int32_t draft_top;                /* SPEC_DRAFT_TOP, or the vocabulary if smaller */
    int32_t max_nodes;                /* the node budget the buffers were sized for */
    int32_t n_node;
    struct spec_node node[SPEC_MAX_NODES + 1];  /* [0] is the root (the pending token) */
    /* the step in progress (spec_propose .. spec_accept) */
    int32_t cap;                      /* node budget of this step (<= p.n_nodes) */
    int32_t n_catchup;                /* catch-up rows of the last draft forward */
    int32_t row0, n_pred;             /* first verify row in the target batch; logit rows wanted */
    double t_step;
    /* draft forwards of this spec and its lanes, counted: a step commits its
     * draft rows only if its forward was the draft's last */
    uint64_t dfw_count, *dfw, dfw_mine;
    bool lane;                        /* buffers borrowed from a main spec */
    /* Set by the caller when another lane's draft forward will follow this
     * one's before it accepts (so it cannot commit its draft rows then): the
     * draft catches up in a forward of its own first, and lags by one step's
     * tokens at most. */
    bool catchup_first;
    /* per-forward buffers */
    int32_t *tok, *pos, *seq, *par;   /* [max batch] */
    uint8_t *want;
    int32_t *rows;                    /* [2 * max batch] */
    float *tlogits;                   /* [n_nodes+2][vocab]: the verify pass's logit rows, then one on demand */
    int32_t lrow[SPEC_MAX_NODES + 1]; /* each node's row in tlogits, -1 if not computed in the pass */
    int32_t *dids;                    /* [n_nodes+1][SPEC_DRAFT_TOP]: the expanded nodes' best draft tokens */
    float *dvals;                     /* [n_nodes+1][SPEC_DRAFT_TOP]: their logits */
    int32_t *tids;                    /* [n_nodes+1][TOP_K_MAX]: the target's largest logits per row */
    float *tvals;                     /* [n_nodes+1][TOP_K_MAX]: their values */
    int32_t sids[TOP_K_MAX];          /* the same for a row asked for on demand */
    float svals[TOP_K_MAX];
    int32_t *path;                    /* history + path, for penalties [ctx] */
    int32_t cap_ctx;
    double *res;                      /* residual probabilities [vocab] */
    struct spec_cand *heap;           /* candidates [SPEC_MAX_NODES*top_k] */
    int32_t n_heap, cap_heap;
};

/* tseq/dseq: sequences of tgt/dft (dft may be NULL) holding the same committed tokens (the
 * draft's may be a prefix of the target's: it catches up). -1 with err_set()
 * for a vocabulary mismatch, bad parameters or no memory. */
int spec_init(struct spec *s, struct engine *tgt, int32_t tseq, struct engine *dft, int32_t dseq,
              const struct spec_params *p, int32_t n_ctx);
void spec_free(struct spec *s);
/* The shape the tuner would use now (nodes, depth, and whether it skips the
 * draft when prompt lookup proposes enough; lookup_first may be NULL), e.g. to report it. */
void spec_tuned_shape(const struct spec *s, int32_t *nodes, int32_t *depth, bool *lookup_first);
/* The tuner kept between runs in a small text file of one line per key (the
 * caller's: the machine, the model pair, the device, how many requests
 * speculate at once): the key, then a tab-separated field per shape,
 * nodes,depth,lookup_first,tries,tokens per second. Load: whether the file
 * has key's line with one of t's shapes; t then goes on from those shapes'
 * tries and speeds (settled, it uses the fastest at once; a shape it lacks is
 * tried first). Save: t's line, the other keys' kept (a new file replaces the
 * old, so a reader never sees half of one; its folder made if missing); -1
 * with err_set(). */
bool spec_tuner_load(struct spec_tuner *t, const char *path, const char *key);
int spec_tuner_save(const struct spec_tuner *t, const char *path, const char *key);
/* Every shape tried its first times: from here on the tuner uses the fastest. */
bool spec_tuner_settled(const struct spec_tuner *t);
/* Points the spec at another pair of sequences (same engines). */
void spec_reset(struct spec *s, int32_t tseq, int32_t dseq);

/* A lane of main for another pair of sequences: its own tree and step, main's
 * engines, parameters, tuner and buffers (lanes and main are used one at a
 * time in each phase: propose in turn, one shared verify forward, accept in
 * turn). Valid while main is; spec_free releases nothing of main's. */
void spec_init_lane(struct spec *lane, struct spec *main, int32_t tseq, int32_t dseq);

/* Feeds toks[len..n) to both engines (len: what each sequence holds already);
 * logits (host, [vocab]) receives the target's logits after the last token. */
int spec_prefill(struct spec *s, const int32_t *toks, int32_t n, float *logits);

/* One step. hist[0..n_hist) is the sequence so far; its last token is pending
 * (sampled, not yet fed to the target, whose sequence holds n_hist-1 tokens).
 * Writes the k >= 1 tokens that follow into out (the last is the new pending
 * token; the target then holds n_hist-1+k tokens) and returns k (at most
 * max_out), or -1 with err_set(). */
int32_t spec_step(struct spec *s, struct sampler *sm, const int32_t *hist, int32_t n_hist, int32_t *out,
                  int32_t max_out);

/* spec_step in three phases, so that several sequences' trees are verified in
 * one target forward. Propose: the draft's tree for hist (at most cap nodes
 * below the root); returns the node count (batch rows it needs), or -1.
 * Fill: the tree as batch rows row0.. of the arrays (each [>= row0 + nodes];
 * parents point into the batch); returns how many of them want logits.
 * Accept: after the target's forward, what it gave of those rows in order
 * (struct spec_rows); writes the tokens to out (at most the max_out given to
 * propose), commits the accepted path and returns their number k as
 * spec_step does, or -1. */
int32_t spec_propose(struct spec *s, const int32_t *hist, int32_t n_hist, int32_t max_out, int32_t cap);
int32_t spec_fill(struct spec *s, int32_t n_hist, int32_t row0, int32_t *tok, int32_t *pos, int32_t *seq,
                  int32_t *par, uint8_t *want);
/* The verify pass's output rows as acceptance reads them: whole logit rows
 * [rows][vocab], or (logits NULL) each row's k largest logits as
 * engine_out_top gives them, ids and vals [rows][k] (vals may be NULL when
 * the sampler is greedy), with k >= spec_top_need. */
struct spec_rows {
    const float *logits;
    const int32_t *ids;
    const float *vals;
    int32_t k;
};
int32_t spec_accept(struct spec *s, struct sampler *sm, const int32_t *hist, int32_t n_hist, int32_t *out,
                    const struct spec_rows *in);
/* How many of each node's largest logits acceptance with this sampler needs
 * when those are all it needs (sampler_top_need, up to TOP_K_MAX: greedy 1,
 * top_k k), so the verify pass ranks on the device and copies k numbers per
 * node; 0 when it needs whole rows. */
int32_t spec_top_need(const struct sampler *sm);

#endif
