/* gguf: read-only, mmapped access to GGUF files (llama.cpp's format), single or
 * split by gguf-split (NAME-00001-of-0000N.gguf), and a streaming writer.
 *
 * Format (ggml's docs/gguf.md, versions 2 and 3, little-endian): "GGUF", u32
 * version, u64 tensor count, u64 KV count; the KVs, each a string key, a u32 value
 * type and the value (strings are a u64 length and the bytes, no NUL; an array is
 * a u32 element type, a u64 count and the elements); the tensor infos, each a
 * string name, u32 n_dims (1..4), n_dims u64 extents ne (ne[0] the contiguous one:
 * the columns), u32 ggml type and u64 offset; then the data section, which starts
 * at the end of the infos rounded up to general.alignment (default 32) and holds
 * each tensor at its offset, a multiple of the alignment.
 * Every file is validated whole before any use: magic, version, counts that fit
 * the file, strings and arrays inside it, known value and tensor types, extents
 * whose byte size neither overflows nor leaves the data section, aligned offsets,
 * no two tensors overlapping, no name or key twice. Arrays of arrays are refused,
 * as llama.cpp refuses them.
 *
 * Split sets: opening any part NAME-0000i-of-0000N.gguf opens all N (same folder,
 * same prefix); the tensors are those of every part, the KVs the first part's.
 * Where a part has split.no (0-based) or split.count, they must match its name;
 * split.tensors.count, where the first part has it, the tensors of the set.
 *
 * Ownership: struct gguf owns the mappings, the keys, the names and the string
 * tables; string values, numeric array elements and tensor data point into the
 * mappings. All live until gguf_close(). */
#ifndef KP_GGUF_H
#define KP_GGUF_H

#include "../base/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GGUF_MAX_DIM 4

/* The value types, numbered as in the file. */
enum gguf_type {
    GGUF_U8,
    GGUF_I8,
    GGUF_U16,
    GGUF_I16,
    GGUF_U32,
    GGUF_I32,
    GGUF_F32,
    GGUF_BOOL, /* one byte */
    GGUF_STRING,
    GGUF_ARRAY,
    GGUF_U64,
    GGUF_I64,
    GGUF_F64,
    GGUF_N_TYPES
};

/* A string in a mapping: n bytes at p, not NUL-terminated. */
struct gguf_str {
    const char *p;
    uint64_t n;
};

struct gguf_kv {
    char *key;
    enum gguf_type type;
    enum gguf_type arr_type; /* the element type of an array */
    uint64_t n;              /* the element count of an array */
    union {
        uint64_t u; /* U8, U16, U32, U64 */
        int64_t i;  /* I8, I16, I32, I64 */
        double f;   /* F32, F64 */
        bool b;     /* BOOL */
    } v;
    struct gguf_str str;   /* a STRING */
    const void *arr;       /* a numeric or BOOL array's n elements as stored: little-endian and
                              not aligned (read them with memcpy) */
    struct gguf_str *strs; /* a STRING array's [n] elements (owned) */
};

struct gguf_tensor {
    char *name;
    enum dtype type;
    int32_t n_dim;
    int64_t ne[GGUF_MAX_DIM]; /* ne[0] the columns; 1 past n_dim */
    const void *data;         /* aligned to general.alignment and to the type's elements */
    size_t n_bytes;           /* dtype_bytes(type, ne[0]) * ne[1] * ne[2] * ne[3] */
    const char *file;         /* path of the part holding it (owned by struct gguf) */
};

struct gguf_file {
    char *path;
    void *map;
    size_t size;
};

struct gguf {
    int32_t n_files;
    struct gguf_file *files;     /* [n_files], the parts in order */
    uint32_t alignment;          /* the first part's */
    int64_t n_kv;
    struct gguf_kv *kv;          /* [n_kv], the first part's, sorted by key */
    int64_t n_tensors;
    struct gguf_tensor *tensors; /* [n_tensors], every part's, sorted by name */
};

/* Opens a GGUF file, or the whole set a split part belongs to. 0 on success;
 * -1 with err_set() naming the file and the key or tensor otherwise. */
int gguf_open(struct gguf *g, const char *path);
void gguf_close(struct gguf *g);
/* NULL when absent. */
const struct gguf_kv *gguf_kv_find(const struct gguf *g, const char *key);
/* NULL when absent. */
const struct gguf_tensor *gguf_find(const struct gguf *g, const char *name);

/* Typed lookups. Each returns 0 with *out set when the key holds a value it
 * takes; 1 when the key is absent (*out untouched, no message: the caller knows
 * the default); -1 with err_set() naming the file and the key when the value has
 * another type or is out of the result's range. */
/* Any integer type (U64 up to INT64_MAX). */
int gguf_get_i64(const struct gguf *g, const char *key, int64_t *out);
/* Any integer type, 0..UINT32_MAX. */
int gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out);
/* F32, or F64 rounded (finite values beyond float's range refused). */
int gguf_get_f32(const struct gguf *g, const char *key, float *out);
int gguf_get_bool(const struct gguf *g, const char *key, bool *out);
/* STRING: *p points into the mapping (not NUL-terminated), *n its bytes. */
int gguf_get_str(const struct gguf *g, const char *key, const char **p, size_t *n);
/* An ARRAY of elements of type elem: *out the key's entry (its n, arr or strs). */
int gguf_get_arr(const struct gguf *g, const char *key, enum gguf_type elem, const struct gguf_kv **out);

/* Writer: KVs and tensors described up front, then the data produced one tensor
 * at a time into PATH.tmp, renamed to PATH once it is all on disk. Version 3,
 * alignment 32 (general.alignment is not written: it is the default), tensors in
 * the order added. The kv and tensor calls record the first failure (a key or
 * name added twice, a bad shape, no memory); gguf_writer_finish then writes
 * nothing and reports it. gguf_writer_finish always frees the writer. */
struct gguf_writer;
/* -1 with err_set() when out of memory. */
int gguf_writer_init(struct gguf_writer **w, const char *path);
void gguf_writer_kv_u8(struct gguf_writer *w, const char *key, uint8_t v);
void gguf_writer_kv_i8(struct gguf_writer *w, const char *key, int8_t v);
void gguf_writer_kv_u16(struct gguf_writer *w, const char *key, uint16_t v);
void gguf_writer_kv_i16(struct gguf_writer *w, const char *key, int16_t v);
void gguf_writer_kv_u32(struct gguf_writer *w, const char *key, uint32_t v);
void gguf_writer_kv_i32(struct gguf_writer *w, const char *key, int32_t v);
void gguf_writer_kv_u64(struct gguf_writer *w, const char *key, uint64_t v);
void gguf_writer_kv_i64(struct gguf_writer *w, const char *key, int64_t v);
void gguf_writer_kv_f32(struct gguf_writer *w, const char *key, float v);
void gguf_writer_kv_f64(struct gguf_writer *w, const char *key, double v);
void gguf_writer_kv_bool(struct gguf_writer *w, const char *key, bool v);
void gguf_writer_kv_str(struct gguf_writer *w, const char *key, const char *s);
void gguf_writer_kv_arr_str(struct gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
/* An array of n numeric or BOOL elements of type elem, v holding them as the file does. */
void gguf_writer_kv_arr(struct gguf_writer *w, const char *key, enum gguf_type elem, const void *v, uint64_t n);
void gguf_writer_kv_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
void gguf_writer_kv_arr_f32(struct gguf_writer *w, const char *key, const float *v, uint64_t n);
/* ne[0] = columns, a multiple of dtype_block(type); 1 <= n_dim <= 4, every ne > 0.
 * -1 with err_set() (and recorded for finish) otherwise. */
int gguf_writer_tensor(struct gguf_writer *w, const char *name, enum dtype type, int32_t n_dim, const int64_t *ne);
/* fill(ctx, i, buf, n_bytes) writes tensor i's data (in the order added) into buf. */
typedef void (*gguf_fill_fn)(void *ctx, int32_t i, void *buf, size_t n_bytes);
/* Writes the file; 0 on success, -1 with err_set() (an earlier call's failure, a
 * write error such as a full disk) otherwise, PATH.tmp removed. Frees w. */
int gguf_writer_finish(struct gguf_writer *w, gguf_fill_fn fill, void *ctx);
/* Drops a writer without writing anything (NULL: nothing). */
void gguf_writer_free(struct gguf_writer *w);

#endif
