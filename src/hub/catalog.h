/* catalog: the models Kapitsa supports (models/catalog.json, written by
 * tools/catalog_sizes.py from the published configs' shapes) and the rule
 * for what fits a machine.
 *
 * Ownership: struct catalog owns every string of its entries; entries live
 * until catalog_free. */
#ifndef KP_CATALOG_H
#define KP_CATALOG_H

#include "../base/dtype.h"

#include <stdint.h>

struct catalog_model {
    char *name, *repo, *revision, *arch;
    char *draft; /* catalog name of the recommended draft (same tokenizer), or NULL */
    int64_t params, bytes, active_bytes; /* bf16 checkpoint; bytes one decode step reads */
    int64_t context;                     /* longest context the model was trained for */
    int64_t kv_bytes_per_token;          /* Kapitsa's fp32 KV cache */
    int64_t state_bytes;                 /* recurrent state per sequence (hybrids) */
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

/* Memory a model needs: weights + KV for n_ctx tokens (kv_type DT_F32 or
 * DT_BF16, half as much) + recurrent state of n_seq sequences + runtime
 * overhead (activations, logits, buffers: 4% of the weights and 512 MiB). */
int64_t catalog_need_bytes(const struct catalog_model *m, int64_t n_ctx, int32_t n_seq, enum dtype kv_type);
/* The longest context (a multiple of 4096, at most m->context) with which the
 * model fits in `avail` bytes; 0 when not even 4096 tokens fit. */
int64_t catalog_fit_context(const struct catalog_model *m, int64_t avail, int32_t n_seq, enum dtype kv_type);

#endif
