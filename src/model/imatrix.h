/* imatrix: importance matrices as llama.cpp's llama-imatrix makes them, read,
 * written and collected, for quantisers that weigh each column's error
 * (`kapitsa imatrix`, `kapitsa quantize --imatrix`).
 *
 * For every weight matrix a forward multiplies, an entry holds per input
 * column the sum over the calibration tokens of the squared input (in_sum2),
 * and the number of tokens summed (counts); a stacked MoE tensor has a row of
 * sums and a count per expert (the tokens routed to it). The importance of a
 * column is in_sum2 / counts: the mean squared input, which is what the
 * product's error weighs each column's weight error by.
 *
 * Files (tools/imatrix/imatrix.cpp and common/imatrix-loader.cpp):
 *  - GGUF (llama-imatrix's default): per entry the F32 tensors
 *    `NAME.in_sum2` [n_cols] or [n_cols x n_mat] and `NAME.counts` [1] or
 *    [1 x n_mat] (ne order), NAME the weight's GGUF name; KVs general.type
 *    "imatrix", imatrix.datasets (strings), imatrix.chunk_count and
 *    imatrix.chunk_size (u32), all required as llama-quantize requires them.
 *  - legacy .dat (`--output-format dat`): i32 entry count; per entry i32
 *    name length, the name, i32 ncall, i32 nval, nval f32 values, each the
 *    mean squared input times ncall (1 times ncall where an expert had no
 *    token); optionally i32 chunk count, i32 length and the dataset's name.
 *    Such an entry is read as sums = the values, counts = {ncall}, so that
 *    sums / counts is the mean again; its experts are not told apart (n_mat
 *    1, n_cols nval) until a lookup gives the tensor's shape.
 * Everything is validated when read: names, shapes, types, F32 sums that are
 * finite and not negative, counts that are whole and not negative, no
 * trailing bytes; errors name the file and the entry.
 *
 * Collection: a backend that wraps another and, for a model loaded through
 * it, sees every product's input (after its RMSNorm or SwiGLU) and adds its
 * squares to the weight's entry; a MoE block's router input, each picked
 * expert's gate/up input and its down input (silu(h gate_e) * (h up_e),
 * recomputed on the inner backend after the block) go to the stacked
 * tensors' rows. Architectures qwen3 and qwen3_moe.
 *
 * Ownership: struct imatrix owns its entries, names and datasets
 * (imatrix_free). A collector borrows the model and the imatrix it fills
 * until it is freed (be->ops->free, which frees the inner backend too);
 * free the model, whose weights it releases, before it. */
#ifndef KP_IMATRIX_H
#define KP_IMATRIX_H

#include "model.h"

#include <stdint.h>

struct imatrix_entry {
    char *name;        /* the weight's GGUF name: blk.0.attn_q.weight, blk.3.ffn_down_exps.weight */
    int64_t n_cols;    /* the sums of one matrix */
    int32_t n_mat;     /* matrices (1, or a stacked tensor's experts) */
    int32_t n_counts;  /* 1 (shared by every matrix) or n_mat */
    float *sums;       /* [n_mat][n_cols] sums of squared inputs */
    int64_t *counts;   /* [n_counts] tokens summed */
};

struct imatrix {
    char *path;        /* the file read, or NULL */
    int32_t n;
    struct imatrix_entry *e; /* [n], in the file's order */
    int32_t n_datasets;
    char **datasets;   /* [n_datasets] the calibration texts' names */
    int32_t chunk_count, chunk_size; /* chunks of chunk_size tokens the sums cover (legacy: size 0) */
};

/* Reads a GGUF or legacy .dat imatrix file (told apart by GGUF's magic).
 * -1 with err_set() naming the file and the entry; im is then empty. */
int imatrix_read(struct imatrix *im, const char *path);
/* Writes im as llama-imatrix's GGUF file, entries in name order. -1 with err_set(). */
int imatrix_write(const struct imatrix *im, const char *path);
void imatrix_free(struct imatrix *im);
/* Adds a calibration text's name to im->datasets. -1 with err_set(). */
int imatrix_add_dataset(struct imatrix *im, const char *name);
/* NULL when absent. */
const struct imatrix_entry *imatrix_find(const struct imatrix *im, const char *name);

/* The importance of matrix `mat` (an expert; 0 of a 2-D tensor) of tensor
 * `name` (n_mat matrices of n_cols columns) into out[n_cols]: in_sum2 /
 * counts per column, as llama-quantize takes it (1 where the matrix's count
 * is 0: no token reached it). 0 when found; 1 when im has no entry for name
 * (out untouched); -1 with err_set() naming the file and the entry when the
 * entry does not have n_cols * n_mat values. */
int imatrix_importance(const struct imatrix *im, const char *name, int64_t n_cols, int32_t n_mat, int32_t mat,
                       float *out);

/* A collecting backend around inner (taken over: freed with the collector).
 * Load the model with it, then bind. NULL with err_set() (inner freed). */
struct backend *imatrix_collector_wrap(struct backend *inner);
/* Fills im (empty: zeroed or freed) with an entry for every matrix of m,
 * sums and counts 0, to which the forwards of m (loaded through be) then add. -1 with err_set() for an
 * architecture it does not collect or out of memory. */
int imatrix_collector_bind(struct backend *be, const struct model *m, struct imatrix *im);
/* 0, or -1 with err_set() when an op since bind could not collect (out of
 * memory, a failed read): the sums are then incomplete. */
int imatrix_collector_status(struct backend *be);

#endif
