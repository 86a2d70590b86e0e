/* libFuzzer target: a GGUF file. The input is written to a file named as the
 * only part of a split set (so the split.* checks run too) and opened. Opening
 * must fail with a message, or give KVs and tensors that every getter reads
 * within the mapping. A file that opens is written again through the writer
 * and must read back the same: its KVs (less general.alignment, which the
 * writer does not take, and strings holding a NUL, which its C strings cannot
 * carry) and its tensors, byte for byte. */
#define _GNU_SOURCE
#include "../../src/base/err.h"
#include "../../src/model/gguf.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

static const size_t elem_size[GGUF_N_TYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
static char dir[PATH_MAX], in_path[PATH_MAX + 64], out_path[PATH_MAX + 64];
static volatile unsigned sink; /* keeps the reads of every byte */

static void die(const char *what)
{
    fprintf(stderr, "fuzz_gguf: %s: %s\n", what, err_msg());
    abort();
}

static void remove_dir(void)
{
    unlink(in_path);
    unlink(out_path);
    rmdir(dir);
}

static void setup(void)
{
    const char *tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof dir, "%s/kapitsa-fuzz-gguf-XXXXXX", tmp);
    if (!mkdtemp(dir))
        die("mkdtemp");
    snprintf(in_path, sizeof in_path, "%s/in-00001-of-00001.gguf", dir);
    snprintf(out_path, sizeof out_path, "%s/out.gguf", dir);
    atexit(remove_dir);
}

static void touch(const void *p, size_t n)
{
    unsigned s = 0;
    for (size_t i = 0; i < n; i++)
        s += ((const unsigned char *)p)[i];
    sink += s;
}

/* Every KV through its getter, every tensor's bytes inside its part's mapping. */
static void walk(const struct gguf *g)
{
    for (int64_t i = 0; i < g->n_kv; i++) {
        const struct gguf_kv *kv = &g->kv[i], *arr;
        int64_t i64;
        uint32_t u32;
        float f;
        bool b;
        const char *s;
        size_t n;
        if (gguf_kv_find(g, kv->key) != kv)
            die("kv_find");
        switch (kv->type) {
        case GGUF_F32:
        case GGUF_F64:
            if (gguf_get_f32(g, kv->key, &f) < 0 && !err_msg()[0])
                die("f32 without a message");
            break;
        case GGUF_BOOL:
            if (gguf_get_bool(g, kv->key, &b) != 0)
                die("bool");
            break;
        case GGUF_STRING:
            if (gguf_get_str(g, kv->key, &s, &n) != 0)
                die("str");
            touch(s, n);
            break;
        case GGUF_ARRAY:
            if (gguf_get_arr(g, kv->key, kv->arr_type, &arr) != 0 || arr != kv)
                die("arr");
            if (kv->arr_type == GGUF_STRING)
                for (uint64_t e = 0; e < kv->n; e++)
                    touch(kv->strs[e].p, (size_t)kv->strs[e].n);
            else
                touch(kv->arr, (size_t)kv->n * elem_size[kv->arr_type]);
            break;
        default:
            if (gguf_get_i64(g, kv->key, &i64) < 0 && !err_msg()[0])
                die("i64 without a message");
            if (gguf_get_u32(g, kv->key, &u32) < 0 && !err_msg()[0])
                die("u32 without a message");
        }
    }
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const struct gguf_tensor *t = &g->tensors[i];
        size_t want = dtype_bytes(t->type, t->ne[0]) * (size_t)(t->ne[1] * t->ne[2] * t->ne[3]);
        if (gguf_find(g, t->name) != t || t->n_bytes != want)
            die("tensor");
        const struct gguf_file *f = NULL;
        for (int32_t k = 0; k < g->n_files; k++)
            if (g->files[k].path == t->file)
                f = &g->files[k];
        if (!f || (const char *)t->data < (const char *)f->map ||
            t->n_bytes > f->size - (size_t)((const char *)t->data - (const char *)f->map))
            die("tensor outside its file");
        touch(t->data, t->n_bytes);
    }
}

static void fill_copy(void *ctx, int32_t i, void *buf, size_t n)
{
    const struct gguf *g = ctx;
    if (n != g->tensors[i].n_bytes)
        die("fill size");
    memcpy(buf, g->tensors[i].data, n);
}

/* Whether the writer can carry kv: not general.alignment, no string with a NUL. */
static bool writable(const struct gguf_kv *kv)
{
    if (strcmp(kv->key, "general.alignment") == 0)
        return false;
    if (kv->type == GGUF_STRING)
        return !memchr(kv->str.p, 0, (size_t)kv->str.n);
    if (kv->type == GGUF_ARRAY && kv->arr_type == GGUF_STRING)
        for (uint64_t e = 0; e < kv->n; e++)
            if (memchr(kv->strs[e].p, 0, (size_t)kv->strs[e].n))
                return false;
    return true;
}

static void write_kv(struct gguf_writer *w, const struct gguf_kv *kv)
{
    switch (kv->type) {
    case GGUF_U8: gguf_writer_kv_u8(w, kv->key, (uint8_t)kv->v.u); break;
    case GGUF_I8: gguf_writer_kv_i8(w, kv->key, (int8_t)kv->v.i); break;
    case GGUF_U16: gguf_writer_kv_u16(w, kv->key, (uint16_t)kv->v.u); break;
    case GGUF_I16: gguf_writer_kv_i16(w, kv->key, (int16_t)kv->v.i); break;
    case GGUF_U32: gguf_writer_kv_u32(w, kv->key, (uint32_t)kv->v.u); break;
    case GGUF_I32: gguf_writer_kv_i32(w, kv->key, (int32_t)kv->v.i); break;
    case GGUF_U64: gguf_writer_kv_u64(w, kv->key, kv->v.u); break;
    case GGUF_I64: gguf_writer_kv_i64(w, kv->key, kv->v.i); break;
    case GGUF_F32: gguf_writer_kv_f32(w, kv->key, (float)kv->v.f); break;
    case GGUF_F64: gguf_writer_kv_f64(w, kv->key, kv->v.f); break;
    case GGUF_BOOL: gguf_writer_kv_bool(w, kv->key, kv->v.b); break;
    case GGUF_STRING: {
        char *s = strndup(kv->str.p, (size_t)kv->str.n);
        if (!s)
            die("strndup");
        gguf_writer_kv_str(w, kv->key, s);
        free(s);
        break;
    }
    case GGUF_ARRAY:
        if (kv->arr_type != GGUF_STRING) {
            gguf_writer_kv_arr(w, kv->key, kv->arr_type, kv->arr, kv->n);
            break;
        }
        char **strs = calloc(kv->n ? (size_t)kv->n : 1, sizeof *strs);
        if (!strs)
            die("calloc");
        for (uint64_t e = 0; e < kv->n; e++)
            if (!(strs[e] = strndup(kv->strs[e].p, (size_t)kv->strs[e].n)))
                die("strndup");
        gguf_writer_kv_arr_str(w, kv->key, (const char *const *)strs, kv->n);
        for (uint64_t e = 0; e < kv->n; e++)
            free(strs[e]);
        free(strs);
        break;
    default:
        die("kv type");
    }
}

static bool same_str(struct gguf_str a, struct gguf_str b)
{
    return a.n == b.n && memcmp(a.p, b.p, (size_t)a.n) == 0;
}

static bool same_kv(const struct gguf_kv *a, const struct gguf_kv *b)
{
    if (a->type != b->type)
        return false;
    switch (a->type) {
    case GGUF_F32:
    case GGUF_F64:
        return a->v.f == b->v.f || (isnan(a->v.f) && isnan(b->v.f));
    case GGUF_BOOL:
        return a->v.b == b->v.b;
    case GGUF_STRING:
        return same_str(a->str, b->str);
    case GGUF_ARRAY:
        if (a->arr_type != b->arr_type || a->n != b->n)
            return false;
        if (a->arr_type != GGUF_STRING)
            return memcmp(a->arr, b->arr, (size_t)a->n * elem_size[a->arr_type]) == 0;
        for (uint64_t e = 0; e < a->n; e++)
            if (!same_str(a->strs[e], b->strs[e]))
                return false;
        return true;
    default:
        return a->v.u == b->v.u;
    }
}

/* g written again and read back: the same KVs and tensors. */
static void rewrite(const struct gguf *g)
{
    struct gguf_writer *w;
    int64_t n_kept = 0;
    if (gguf_writer_init(&w, out_path) != 0)
        die("writer");
    for (int64_t i = 0; i < g->n_kv; i++)
        if (writable(&g->kv[i])) {
            write_kv(w, &g->kv[i]);
            n_kept++;
        }
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const struct gguf_tensor *t = &g->tensors[i];
        if (gguf_writer_tensor(w, t->name, t->type, t->n_dim, t->ne) != 0)
            die("writer refused a tensor the reader took");
    }
    if (gguf_writer_finish(w, fill_copy, (void *)g) != 0)
        die("finish");
    struct gguf h;
    if (gguf_open(&h, out_path) != 0)
        die("reopen");
    if (h.n_kv != n_kept || h.n_tensors != g->n_tensors || h.alignment != 32)
        die("counts differ");
    for (int64_t i = 0; i < g->n_kv; i++) {
        const struct gguf_kv *b = gguf_kv_find(&h, g->kv[i].key);
        if (writable(&g->kv[i]) && (!b || !same_kv(&g->kv[i], b)))
            die(g->kv[i].key);
    }
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const struct gguf_tensor *a = &g->tensors[i], *b = &h.tensors[i];
        if (strcmp(a->name, b->name) != 0 || a->type != b->type || a->n_dim != b->n_dim ||
            memcmp(a->ne, b->ne, sizeof a->ne) != 0 || a->n_bytes != b->n_bytes ||
            memcmp(a->data, b->data, a->n_bytes) != 0)
            die(a->name);
    }
    gguf_close(&h);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    if (!dir[0])
        setup();
    FILE *f = fopen(in_path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0)
        die(in_path);
    struct gguf g;
    err_clear();
    if (gguf_open(&g, in_path) != 0) {
        if (!err_msg()[0])
            abort(); /* a failure must say why */
        return 0;
    }
    walk(&g);
    rewrite(&g);
    gguf_close(&g);
    return 0;
}
