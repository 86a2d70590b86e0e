/* sampler: picks the next token from a row of logits.
 *
 * Order, as in llama.cpp / vLLM: logit bias -> repetition, presence and
 * frequency penalties over the recent history -> greedy when temperature is 0
 * -> temperature -> top-k -> top-p -> min-p -> a draw from the seeded
 * generator (xoshiro256**), so the same seed gives the same output.
 *
 * Ownership: the sampler owns its vocab-sized scratch, allocated at init; a
 * sample call does not allocate. One sampler per sequence. */
#ifndef KP_SAMPLER_H
#define KP_SAMPLER_H

#include "../grammar/grammar.h"
#include "../model/config.h"

#include <stdbool.h>
#include <stdint.h>

#define SAMPLER_MAX_BIAS 300

struct sampler_params {
    float temperature;       /* 0 = greedy */
    int32_t top_k;           /* 0 = off */
    float top_p;             /* 1 = off */
    float min_p;             /* 0 = off */
    float repeat_penalty;    /* 1 = off; divides positive logits, multiplies negative */
    float presence_penalty;  /* subtracted once from a token seen in the window */
    float frequency_penalty; /* subtracted per occurrence */
    int32_t penalty_last_n;  /* window of history the penalties look at; -1 = all */
    uint64_t seed;
    int32_t n_bias;
    int32_t bias_id[SAMPLER_MAX_BIAS];
    float bias[SAMPLER_MAX_BIAS];
};

struct sampler {
    struct sampler_params p;
    int32_t n_vocab;
    uint64_t rng[4];
    float *logits;    /* [n_vocab] working copy */
    int32_t *idx;     /* [n_vocab] candidate ids */
    double *w;        /* [n_vocab] their unnormalised probabilities (sampler_dist) */
    int32_t *count;   /* [n_vocab] occurrences in the penalty window */
};

/* Defaults: greedy, every filter off. */
struct sampler_params sampler_defaults(void);
/* The sampling the model's generation_config.json asks for (temperature,
 * top_p, top_k, min_p, repetition penalty: model_config's gen_*) into p;
 * the other fields of p stay as they are. */
void sampler_params_from_config(struct sampler_params *p, const struct model_config *c);
int sampler_init(struct sampler *s, const struct sampler_params *p, int32_t n_vocab);
void sampler_free(struct sampler *s);
/* history: the sequence's tokens so far (prompt and output), for penalties. */
int32_t sampler_sample(struct sampler *s, const float *logits, const int32_t *history, int32_t n_history);
/* The distribution sampler_sample draws from: candidate ids in s->idx[0..n)
 * with unnormalised probabilities s->w[0..n) (some may be 0); greedy gives one
 * candidate. Returns n; valid until the next call. */
int32_t sampler_dist(struct sampler *s, const float *logits, const int32_t *history, int32_t n_history);
/* A uniform draw in [0, 1) from the sampler's seeded stream. */
double sampler_uniform(struct sampler *s);
/* How many of the largest raw logits a draw needs, when those are all it
 * needs: 1 when greedy, top_k when that filter is on, plus one per banned
 * token (a bias of -inf, as ignore_eos sets), when no other bias and no
 * penalty changes the logits first; 0 when it needs them all. */
int32_t sampler_top_need(const struct sampler *s);
/* The draw sampler_sample makes (the same token for the same seed and state)
 * from only the k >= sampler_top_need(s) largest logits: ids/vals in the
 * backend's top_k order (larger first, then the lower id), banned tokens
 * among them skipped, so that a GPU copies k numbers per row instead of the
 * vocabulary. */
int32_t sampler_sample_top(struct sampler *s, const int32_t *ids, const float *vals, int32_t k);
/* sampler_dist from the same k largest logits (vals may be NULL when greedy):
 * the same candidates in the same order with the same weights. */
int32_t sampler_dist_top(struct sampler *s, const int32_t *ids, const float *vals, int32_t k);
/* Whether every sample is the largest raw logit (temperature 0, no bias, no
 * penalties), so that the caller may rank the logits where they are
 * (engine_out_top) instead of reading them all. */
bool sampler_greedy(const struct sampler *s);
/* Index of the largest logit (lowest index on ties). */
int32_t sampler_argmax(const float *logits, int32_t n);

/* The next token under the guard: a draw from the sampler's distribution
 * (sampler_dist) restricted to allowed tokens; if none of its candidates is
 * allowed, the allowed token with the largest adjusted logit. Advances the
 * guard over it (an end token: the caller ends the output). -1 if no token
 * at all can continue. */
int32_t sampler_sample_guarded(struct sampler *s, struct guard *gd, const struct vocab_bytes *vb, const float *logits,
                               const int32_t *history, int32_t n_history);

#endif
