/* catalog: the models Kapitsa supports (models/catalog.json, written by
 * tools/catalog_sizes.py from the published configs' shapes) and the rule
 * for what fits a machine.
 *
 * Ownership: struct catalog owns every string of its entries (but a quant's
 * recipe, static); entries live until catalog_free. */
#ifndef KP_CATALOG_H
#define KP_CATALOG_H

#include "../base/dtype.h"

#include <stdbool.h>
#include <stdint.h>

/* The recipes of `kapitsa quantize` the catalog sizes, highest bits first. */
#define CATALOG_N_RECIPES 7
extern const char *const catalog_recipes[CATALOG_N_RECIPES];

/* One recipe's GGUF of a model. */
struct catalog_quant {
    const char *recipe;           /* an entry of catalog_recipes */
    int64_t bytes, active_bytes;  /* its tensors; the bytes one decode step reads */
    bool published;               /* the model's gguf_repo holds a file of it */
};

struct catalog_model {
    char *name, *repo, *revision, *arch;
    char *draft; /* catalog name of the recommended draft (same tokenizer), or NULL */
    int64_t params, bytes, active_bytes; /* bf16 checkpoint; bytes one decode step reads */
    int64_t context;                     /* longest context the model was trained for */
    int64_t kv_bytes_per_token;          /* Kapitsa's fp32 KV cache */
    int64_t state_bytes;                 /* recurrent state per sequence (hybrids) */
    char *gguf_repo;                     /* the publisher's GGUF repo, or NULL */
    struct catalog_quant quant[CATALOG_N_RECIPES]; /* [n_quant], in catalog_recipes' order */
    int32_t n_quant;                     /* 0: an architecture quantize does not write */
};

struct catalog {
    struct catalog_model *m; /* [n] */
    int32_t n;
};

/* path NULL: KAPITSA_CATALOG, ./models/catalog.json, or models/ beside the binary.
 * -1 with err_set() naming the file on failure. */
int catalog_load(struct catalog *c, const char *path);
void catalog_free(struct catalog *c);
/* By catalog name or hub id (case-insensitive); NULL if absent. */
const struct catalog_model *catalog_find(const struct catalog *c, const char *ref);

/* m's GGUF of recipe (case-insensitive); NULL if the catalog has none. */
const struct catalog_quant *catalog_quant(const struct catalog_model *m, const char *recipe);

/* Memory a model needs with weights q (NULL: the bf16 checkpoint): weights +
 * KV for n_ctx tokens (kv_type DT_F32 or DT_BF16, half as much) + recurrent
 * state of n_seq sequences + runtime overhead (activations, logits, buffers:
 * 4% of the weights and 512 MiB). */
int64_t catalog_need_bytes(const struct catalog_model *m, const struct catalog_quant *q, int64_t n_ctx, int32_t n_seq,
                           enum dtype kv_type);
/* The longest context (a multiple of 4096, at most m->context) with which the
 * model with weights q (NULL: bf16) fits in `avail` bytes; 0 when not even
 * 4096 tokens fit. */
int64_t catalog_fit_context(const struct catalog_model *m, const struct catalog_quant *q, int64_t avail, int32_t n_seq,
                            enum dtype kv_type);

/* A machine, as doctor measures it. */
struct catalog_host {
    int64_t mem;     /* bytes the cpu may give a model */
    int64_t gpu_mem; /* free bytes on GPU 0; 0: none */
    int64_t disk;    /* free bytes where models are stored */
    double read_bw;  /* the cpu's read bandwidth in bytes/s; 0: unknown (no decode estimate) */
};

/* One way to run model m on a host: its bf16 checkpoint (q NULL) or the GGUF
 * of recipe q. */
struct catalog_run {
    const struct catalog_model *m;
    const struct catalog_quant *q;
    bool gpu;            /* on GPU 0, where it fits (bf16 only: the cuda backend takes no GGUF weights); else the cpu */
    int64_t ctx, ctx16;  /* the longest context with an f32 / a bf16 KV cache (catalog_fit_context); 0: does not fit */
    double toks;         /* estimated decode tokens/s on the cpu: read_bw / the weight bytes a token reads;
                            0: none (on a GPU, not fitting, or read_bw unknown) */
    int64_t disk;        /* bytes it takes on disk: a recipe not published needs the bf16 download beside it */
};
struct catalog_run catalog_run_on(const struct catalog_model *m, const struct catalog_quant *q,
                                  const struct catalog_host *h);

/* The context a recommendation must keep (with a bf16 cache; a model trained
 * for less: all of its own) and the decode rate it must reach on the cpu, a
 * pace a chat or an agent can be used at. */
#define CATALOG_REC_CTX 32768
#define CATALOG_REC_TOKS 8.0
/* The recipe shown beside bf16: the one with the most bits that keeps
 * CATALOG_REC_CTX, else the smallest that fits at all; .m NULL when none
 * fits or m has no recipes. */
struct catalog_run catalog_best_quant(const struct catalog_model *m, const struct catalog_host *h);
/* The recommendation: of every model's forms (bf16, then its recipes, most
 * bits first) that keep CATALOG_REC_CTX and fit the disk, the model with the
 * most parameters in its first form that decodes at CATALOG_REC_TOKS or more
 * (a form on the GPU, or on a host of unknown bandwidth, always does). 1 with
 * that in *out; 0 when no such form reaches the rate, with the fastest in
 * *out; -1 when no form keeps the context. */
int catalog_recommend(const struct catalog *c, const struct catalog_host *h, struct catalog_run *out);

#endif
