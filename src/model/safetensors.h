/* safetensors: read-only, mmapped access to Hugging Face safetensors checkpoints,
 * single-file or sharded (model.safetensors.index.json), and a streaming writer.
 *
 * Format (huggingface/safetensors): u64 little-endian header length N, N bytes of
 * JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
 * then the data; offsets are relative to the end of the header.
 * Every header is validated before any tensor is used: known dtype, offsets
 * inside the file, sizes equal to shape x dtype, no two tensors overlapping.
 * The format does not require a tensor's bytes to be aligned to its element
 * (the official writer pads the header to 8 bytes, others, MLX's among them,
 * do not); a misaligned tensor is copied to aligned memory once, at open.
 *
 * Ownership: struct safetensors owns the mappings and those copies;
 * st_tensor.data points into them and lives until st_close(). */
#ifndef KP_SAFETENSORS_H
#define KP_SAFETENSORS_H

#include "../base/dtype.h"

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIM 8

struct st_tensor {
    char *name;
    enum dtype type;
    int32_t n_dim;
    int64_t shape[ST_MAX_DIM];
    const void *data;
    size_t n_bytes;
    const char *file; /* path of the file holding it (owned by struct safetensors) */
    void *copy;       /* the aligned copy data points to, when the file's bytes are not aligned; else NULL */
};

struct st_file {
    char *path;
    void *map;
    size_t size;
};

struct safetensors {
    int32_t n_files;
    struct st_file *files;     /* [n_files] */
    int32_t n_tensors;
    struct st_tensor *tensors; /* [n_tensors], sorted by name */
    int32_t n_copied;          /* tensors read into aligned copies */
    uint64_t copied_bytes;
};

/* Opens DIR/model.safetensors.index.json if present, else DIR/model.safetensors.
 * 0 on success; -1 with err_set() naming the file and tensor otherwise. */
int st_open_dir(struct safetensors *st, const char *dir);
/* Opens one .safetensors file. */
int st_open_file(struct safetensors *st, const char *path);
void st_close(struct safetensors *st);
/* NULL when absent. */
const struct st_tensor *st_find(const struct safetensors *st, const char *name);

/* Writer: tensors described up front, data produced one tensor at a time. */
struct st_wtensor {
    const char *name;
    enum dtype type;
    int32_t n_dim;
    int64_t shape[ST_MAX_DIM];
};
/* fill(ctx, i, buf, n_bytes) writes tensor i's data into buf. */
typedef void (*st_fill_fn)(void *ctx, int32_t i, void *buf, size_t n_bytes);
int st_write(const char *path, int32_t n, const struct st_wtensor *t, st_fill_fn fill, void *ctx);

#endif
