/* sched: the engine thread. It owns one engine (model context, KV cache) and
 * runs every active request in the same steps: each step is one batch holding
 * a prefill chunk or the next token of every running sequence (continuous
 * batching), one forward, then one sampled token per sequence that asked.
 *
 * Finished conversations stay in the KV cache (a few, least recently used
 * evicted first): a request whose prompt starts with one of them forks it and
 * prefills only the rest, which is what an agent's next turn looks like. On
 * models with recurrent layers a conversation can only be extended, never cut
 * back, so the state one token short of each prompt's end is kept as an entry
 * too, and so is the state where a prompt leaves a cached conversation it
 * shares a long prefix with (see cache_checkpoint).
 *
 * A request is admitted only while the KV cache can hold all that it and the
 * running requests may take (prompt and max_tokens each): the rest wait in
 * order, so no request fails for want of blocks.
 *
 * Server threads never touch the model: they submit a request and wait on it;
 * the engine thread never blocks on a socket. A request that goes away
 * (client disconnect) is cancelled and its sequence dropped at the next step.
 *
 * Ownership: a request is shared by the submitter and the engine thread and
 * freed by sched_req_release when both have let go. */
#ifndef KP_SCHED_H
#define KP_SCHED_H

#include "engine.h"
#include "../grammar/grammar.h"
#include "sampler.h"
#include "spec.h"

#include <stdbool.h>
#include <stdint.h>

enum sched_finish { SCHED_RUNNING, SCHED_STOP, SCHED_LENGTH, SCHED_CANCELLED, SCHED_ERROR };

struct sched_req; /* opaque: sched_req_poll and the accessors below read it */
struct sched;

/* Starts the engine thread over model m. draft (may be NULL) and sp (NULL or
 * mode SPEC_OFF: no speculation) enable KFlash: while every active request is
 * decoding (none prefilling, none asking for log-probabilities or constrained output), each
 * step is a speculative step for all of them: a tree each, verified together
 * in one target forward (the batch, and a hybrid's kept states, split evenly).
 * max_batch: the most tokens a forward takes; prefill_chunk (1..max_batch):
 * the most prompt tokens one request feeds a step. A step first makes room
 * for every decoding request's token, then prompts fill the rest, each up to
 * its chunk: a long prompt slows the others' decoding, never stops it.
 * kv_type: both engines' KV cache dtype (engine_init). NULL with err_set()
 * on failure. */
struct sched *sched_new(struct model *m, int32_t n_ctx, int32_t n_seq_max, int32_t max_batch, int32_t prefill_chunk,
                        enum dtype kv_type, struct model *draft, const struct spec_params *sp);
/* Stops the engine thread: every active and queued request finishes as
 * cancelled ("server shutting down") and later submissions are refused; what
 * waits on them returns. sched_free stops first if this was not called. */
void sched_stop(struct sched *s);
void sched_free(struct sched *s);

/* A request for prompt[0..n) (copied); sampler params and limits given. NULL on
 * a bad sampler parameter (err_set). */
struct sched_req *sched_req_new(const int32_t *prompt, int32_t n, const struct sampler_params *sp, int32_t max_tokens,
                                int32_t n_vocab);
/* Asks for log-probabilities with n_top (0..SCHED_MAX_TOP) alternatives per
 * token, before sched_submit. Such a request decodes without speculation (a
 * speculative step's tokens come without their own logits pass). -1 with err_set(). */
#define SCHED_MAX_TOP 20
int sched_req_logprobs(struct sched_req *r, int32_t n_top);
/* Where the reply starts as a next turn renders it: the prompt's first n
 * tokens (1..n_prompt-1), before what the template writes only into a
 * generation prompt (Qwen3's empty reasoning block with thinking off, or a
 * block's opening), which the history drops. Before sched_submit. On a
 * recurrent model the end-of-prompt checkpoint is kept there instead of one
 * token short of the end, so that the next turn finds a state it extends. */
void sched_req_reply_at(struct sched_req *r, int32_t n);
/* Constrains the output to grammar gm (moved into the request, gm is left
 * empty), before sched_submit; the output stops where the grammar is
 * complete. vb must outlive the request. Such a request decodes without
 * speculation. */
void sched_req_guard(struct sched_req *r, const struct vocab_bytes *vb, struct grammar *gm);
/* -1 with err_set() when the request cannot fit the context; -2 when the queue
 * is full (the server is overloaded: try again later); -3 after sched_stop. */
int sched_submit(struct sched *s, struct sched_req *r);

/* Counters since start, for /metrics. */
struct sched_stats {
    int64_t requests, prompt_tokens, cached_tokens, generated_tokens, cancelled, failed;
    int64_t spec_passes, spec_tokens; /* KFlash: verify passes (one per request per step), their tokens */
    int64_t spec_forwards;            /* the target forwards that ran those passes (several requests each) */
    int32_t active, queued;
    /* what the KV cache keeps for prefix reuse now: the entries (finished conversations, a recurrent
     * model's checkpoints) and their tokens; as of the end of a request or a step */
    int32_t resident;
    int64_t resident_tokens;
    double prefill_seconds, decode_seconds;
};
void sched_get_stats(struct sched *s, struct sched_stats *st);
/* Where a request stands, read at once. */
struct sched_progress {
    int32_t n_out;              /* output tokens so far (sched_req_out) */
    int32_t n_cached;           /* prompt tokens reused from an earlier conversation (set at admission) */
    int32_t n_prefilled;        /* prompt tokens in the cache so far: the reused ones, then chunk by chunk */
    bool admitted;              /* the request holds a slot (n_cached is final); false while it queues */
    enum sched_finish finish;   /* SCHED_RUNNING until it ends */
    double t_prefill, t_decode; /* seconds from submission to the first token, from it to the end (0: not yet) */
};
/* Waits until r has more than `seen` output tokens (seen < 0: until it is
 * admitted, which comes before its first token) or has finished, for at most
 * `seconds` (< 0: as long as it takes; 0: not at all), then fills *p; returns
 * p->n_out. */
int32_t sched_req_poll(struct sched_req *r, int32_t seen, double seconds, struct sched_progress *p);
/* The output tokens: the first n_out that a poll reported are final. */
const int32_t *sched_req_out(const struct sched_req *r);
/* Why r ended as it did, once a poll reported its end: the engine's error
 * (SCHED_ERROR), "server shutting down" (cancelled by sched_stop), else "". */
const char *sched_req_error(const struct sched_req *r);
/* Output token i's log-probability (under the model, before sampling's
 * adjustments) in *lp and its most likely alternatives, best first, in
 * *top_id / *top_lp (i below a polled n_out); returns how many alternatives,
 * -1 when r did not ask for them (sched_req_logprobs). */
int32_t sched_req_logprob(const struct sched_req *r, int32_t i, float *lp, const int32_t **top_id,
                          const float **top_lp);
/* r's sampler: to set its random state before sched_submit, or to read it once
 * a poll reported r's end (a conversation draws on where its last turn stopped). */
struct sampler *sched_req_sampler(struct sched_req *r);
/* Stops the line each finished request writes to stderr (the server's log),
 * for a command that reports on its own; before the first sched_submit. */
void sched_quiet(struct sched *s);
/* Keeps the KFlash tuners (one for each number of requests speculating at
 * once) in the file at path, under key (the caller's: the machine, the model
 * pair, the threads) with the device and that number appended
 * (spec_tuner_load / spec_tuner_save): each goes on from what is stored,
 * and is saved when it settles and, if it took a step, at sched_free. Before the first
 * sched_submit; returns how many tuners it loaded (0 without tuning). */
int32_t sched_spec_persist(struct sched *s, const char *path, const char *key);
void sched_req_cancel(struct sched_req *r);
void sched_req_release(struct sched_req *r);
int32_t sched_n_ctx(const struct sched *s);

#endif
