/* gguf: mmapped reader with full validation, split sets, streaming writer.
 * Format: ggml's docs/gguf.md (see gguf.h). */
#define _GNU_SOURCE
#include "gguf.h"

#include "../base/err.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_ALIGN_DEFAULT 32u
#define GGUF_HEADER_BYTES 24u /* magic, version, tensor count, KV count */
/* The fewest bytes a KV (empty key, type, one-byte value) and a tensor info
 * (empty name, n_dims, one extent, type, offset) take: the counts in a header
 * are checked against them before anything is allocated by them. */
#define GGUF_MIN_KV 13u
#define GGUF_MIN_INFO 32u

static const uint8_t gguf_type_size[GGUF_N_TYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
static const char *const gguf_type_names[GGUF_N_TYPES] = {"U8",  "I8",     "U16",   "I16", "U32", "I32", "F32",
                                                          "BOOL", "STRING", "ARRAY", "U64", "I64", "F64"};

/* ggml's type ids that Kapitsa does not read, named for the message (the
 * removed ones too: old files still carry them). */
static const char *const gguf_ggml_unread[] = {
    [4] = "Q4_2",        [5] = "Q4_3",        [9] = "Q8_1",        [15] = "Q8_K",     [17] = "IQ2_XS",
    [18] = "IQ3_XXS",    [19] = "IQ1_S",      [21] = "IQ3_S",      [22] = "IQ2_S",    [24] = "I8",
    [25] = "I16",        [27] = "I64",        [28] = "F64",        [29] = "IQ1_M",    [31] = "Q4_0_4_4",
    [32] = "Q4_0_4_8",   [33] = "Q4_0_8_8",   [34] = "TQ1_0",      [35] = "TQ2_0",    [36] = "IQ4_NL_4_4",
    [37] = "IQ4_NL_4_8", [38] = "IQ4_NL_8_8", [39] = "MXFP4",
};

static bool gguf_type_is_int(enum gguf_type t)
{
    return t <= GGUF_I32 || t == GGUF_U64 || t == GGUF_I64;
}

static bool gguf_type_is_signed(enum gguf_type t)
{
    return t == GGUF_I8 || t == GGUF_I16 || t == GGUF_I32 || t == GGUF_I64;
}

/* The byte size of a tensor of type t and extents ne[4]; -1 when it passes
 * limit (checked before each product, so none overflows). */
static int gguf_nbytes(enum dtype t, const int64_t *ne, uint64_t limit, uint64_t *out)
{
    uint64_t n = (uint64_t)(ne[0] / dtype_block(t));
    if (n > limit / dtype_block_bytes(t))
        return -1;
    n *= dtype_block_bytes(t);
    for (int d = 1; d < GGUF_MAX_DIM; d++) {
        if ((uint64_t)ne[d] > limit / n)
            return -1;
        n *= (uint64_t)ne[d];
    }
    *out = n;
    return 0;
}

/* ---------------------------------------------------------------- reader */

/* A cursor over a mapping: every read is checked against its end. */
struct gguf_rd {
    const uint8_t *p;
    uint64_t size, at; /* at <= size */
};

static int gguf_rd_take(struct gguf_rd *r, void *out, uint64_t n)
{
    if (n > r->size - r->at)
        return -1;
    memcpy(out, r->p + r->at, n);
    r->at += n;
    return 0;
}

/* A string, left in the mapping. */
static int gguf_rd_str(struct gguf_rd *r, struct gguf_str *s)
{
    uint64_t n;
    if (gguf_rd_take(r, &n, 8) != 0 || n > r->size - r->at)
        return -1;
    s->p = (const char *)r->p + r->at;
    s->n = n;
    r->at += n;
    return 0;
}

static void gguf_kvs_free(struct gguf_kv *kv, uint64_t n)
{
    for (uint64_t i = 0; kv && i < n; i++) {
        free(kv[i].key);
        free(kv[i].strs);
    }
    free(kv);
}

static int gguf_cmp_key(const void *a, const void *b)
{
    return strcmp(((const struct gguf_kv *)a)->key, ((const struct gguf_kv *)b)->key);
}

static const struct gguf_kv *gguf_kvs_find(const struct gguf_kv *kv, int64_t n, const char *key)
{
    int64_t lo = 0, hi = n - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(kv[mid].key, key);
        if (c == 0)
            return &kv[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

/* A scalar of kv->type at p, widened into kv->v. */
static void gguf_scalar_decode(struct gguf_kv *kv, const uint8_t *p)
{
    uint16_t u16;
    int16_t i16;
    uint32_t u32;
    int32_t i32;
    float f32;
    switch (kv->type) {
    case GGUF_U8:
        kv->v.u = p[0];
        break;
    case GGUF_I8:
        kv->v.i = (int8_t)p[0];
        break;
    case GGUF_U16:
        memcpy(&u16, p, 2);
        kv->v.u = u16;
        break;
    case GGUF_I16:
        memcpy(&i16, p, 2);
        kv->v.i = i16;
        break;
    case GGUF_U32:
        memcpy(&u32, p, 4);
        kv->v.u = u32;
        break;
    case GGUF_I32:
        memcpy(&i32, p, 4);
        kv->v.i = i32;
        break;
    case GGUF_F32:
        memcpy(&f32, p, 4);
        kv->v.f = f32;
        break;
    case GGUF_BOOL:
        kv->v.b = p[0] != 0;
        break;
    case GGUF_U64:
        memcpy(&kv->v.u, p, 8);
        break;
    case GGUF_I64:
        memcpy(&kv->v.i, p, 8);
        break;
    case GGUF_F64:
        memcpy(&kv->v.f, p, 8);
        break;
    default:
        assert(!"not a scalar type");
    }
}

/* Reads KV i of n into kv (which owns what it allocates, freed by the caller
 * on failure too). */
static int gguf_kv_read(struct gguf_rd *r, const char *path, struct gguf_kv *kv, uint64_t i, uint64_t n)
{
    struct gguf_str key;
    uint32_t type, elem;
    if (gguf_rd_str(r, &key) != 0)
        return err_set("gguf: %s: key %llu of %llu runs past the end of the file", path, (unsigned long long)i,
                       (unsigned long long)n);
    if (memchr(key.p, 0, key.n))
        return err_set("gguf: %s: key %llu of %llu holds a NUL byte", path, (unsigned long long)i,
                       (unsigned long long)n);
    kv->key = strndup(key.p, key.n);
    if (!kv->key)
        return err_set("gguf: out of memory");
    if (gguf_rd_take(r, &type, 4) != 0)
        goto past_end;
    if (type >= GGUF_N_TYPES)
        return err_set("gguf: %s: key '%s' has unknown value type %u", path, kv->key, type);
    kv->type = (enum gguf_type)type;
    if (type == GGUF_STRING)
        return gguf_rd_str(r, &kv->str) != 0 ? err_set("gguf: %s: key '%s': string runs past the end of the file",
                                                       path, kv->key)
                                              : 0;
    if (type != GGUF_ARRAY) {
        if (gguf_type_size[type] > r->size - r->at)
            goto past_end;
        gguf_scalar_decode(kv, r->p + r->at);
        r->at += gguf_type_size[type];
        return 0;
    }
    if (gguf_rd_take(r, &elem, 4) != 0 || gguf_rd_take(r, &kv->n, 8) != 0)
        goto past_end;
    if (elem >= GGUF_N_TYPES)
        return err_set("gguf: %s: key '%s' is an array of unknown type %u", path, kv->key, elem);
    if (elem == GGUF_ARRAY)
        return err_set("gguf: %s: key '%s' is an array of arrays, which Kapitsa (like llama.cpp) does not read",
                       path, kv->key);
    kv->arr_type = (enum gguf_type)elem;
    const uint64_t left = r->size - r->at;
    if (elem != GGUF_STRING) {
        if (kv->n > left / gguf_type_size[elem])
            goto past_end;
        kv->arr = r->p + r->at;
        r->at += kv->n * gguf_type_size[elem];
        return 0;
    }
    if (kv->n > left / 8) /* each string's length alone takes 8 bytes */
        goto past_end;
    kv->strs = malloc(kv->n ? kv->n * sizeof *kv->strs : 1);
    if (!kv->strs)
        return err_set("gguf: out of memory");
    for (uint64_t s = 0; s < kv->n; s++)
        if (gguf_rd_str(r, &kv->strs[s]) != 0)
            return err_set("gguf: %s: key '%s': string %llu of %llu runs past the end of the file", path, kv->key,
                           (unsigned long long)s, (unsigned long long)kv->n);
    return 0;
past_end:
    return err_set("gguf: %s: key '%s': value runs past the end of the file", path, kv->key);
}

/* Reads tensor info i of n into t: name, extents, ggml type id and offset.
 * t->name, once set, is the caller's to free, failure or not. */
static int gguf_info_read(struct gguf_rd *r, const char *path, struct gguf_tensor *t, uint32_t *ggml,
                          uint64_t *off, uint64_t i, uint64_t n)
{
    struct gguf_str name;
    uint32_t n_dims;
    if (gguf_rd_str(r, &name) != 0)
        return err_set("gguf: %s: tensor info %llu of %llu runs past the end of the file", path,
                       (unsigned long long)i, (unsigned long long)n);
    if (memchr(name.p, 0, name.n))
        return err_set("gguf: %s: tensor info %llu of %llu: the name holds a NUL byte", path,
                       (unsigned long long)i, (unsigned long long)n);
    t->name = strndup(name.p, name.n);
    if (!t->name)
        return err_set("gguf: out of memory");
    if (gguf_rd_take(r, &n_dims, 4) != 0)
        goto past_end;
    if (n_dims < 1 || n_dims > GGUF_MAX_DIM)
        return err_set("gguf: %s: tensor '%s' has %u dimensions (Kapitsa reads 1 to %d)", path, t->name, n_dims,
                       GGUF_MAX_DIM);
    t->n_dim = (int32_t)n_dims;
    for (int32_t d = 0; d < GGUF_MAX_DIM; d++) {
        uint64_t ne = 1;
        if (d < t->n_dim && gguf_rd_take(r, &ne, 8) != 0)
            goto past_end;
        if (ne == 0 || ne > INT64_MAX)
            return err_set("gguf: %s: tensor '%s': ne[%d] = %lld is not positive", path, t->name, d,
                           (long long)ne);
        t->ne[d] = (int64_t)ne;
    }
    if (gguf_rd_take(r, ggml, 4) != 0 || gguf_rd_take(r, off, 8) != 0)
        goto past_end;
    return 0;
past_end:
    return err_set("gguf: %s: tensor '%s': info runs past the end of the file", path, t->name);
}

/* Checks t's type id and extents, and sets its type and byte size. */
static int gguf_info_check(struct gguf_tensor *t, const char *path, uint32_t ggml, uint64_t size)
{
    if (dtype_from_ggml(ggml, &t->type) != 0) {
        if (ggml < sizeof gguf_ggml_unread / sizeof *gguf_ggml_unread && gguf_ggml_unread[ggml])
            return err_set("gguf: %s: tensor '%s' has GGUF type %u (%s), which Kapitsa does not read", path,
                           t->name, ggml, gguf_ggml_unread[ggml]);
        return err_set("gguf: %s: tensor '%s' has unknown GGUF type %u", path, t->name, ggml);
    }
    if (t->ne[0] % dtype_block(t->type) != 0)
        return err_set("gguf: %s: tensor '%s': ne[0] = %lld is not a multiple of %s's block of %lld", path,
                       t->name, (long long)t->ne[0], dtype_name(t->type), (long long)dtype_block(t->type));
    uint64_t n_bytes;
    if (gguf_nbytes(t->type, t->ne, size, &n_bytes) != 0)
        return err_set("gguf: %s: tensor '%s' (%s [%lld, %lld, %lld, %lld]) is larger than the file (%llu bytes)",
                       path, t->name, dtype_name(t->type), (long long)t->ne[0], (long long)t->ne[1],
                       (long long)t->ne[2], (long long)t->ne[3], (unsigned long long)size);
    t->n_bytes = (size_t)n_bytes;
    return 0;
}

/* The alignment a type's data needs in memory: a plain type its element's
 * size; the block types 2, for the fp16 scales their blocks hold. */
static uint64_t gguf_elem_align(enum dtype t)
{
    return dtype_is_block(t) ? 2 : dtype_size(t);
}

/* -1 with a message: kv holds another type than `want`. */
static int gguf_val_wrong(const struct gguf_kv *kv, const char *path, const char *want)
{
    if (kv->type == GGUF_ARRAY)
        return err_set("gguf: %s: key '%s' holds an ARRAY of %s, not %s", path, kv->key,
                       gguf_type_names[kv->arr_type], want);
    return err_set("gguf: %s: key '%s' holds a %s, not %s", path, kv->key, gguf_type_names[kv->type], want);
}

/* An integer KV's value within [lo, hi] (lo <= 0 <= hi); 1 when kv is NULL. */
static int gguf_val_int(const struct gguf_kv *kv, const char *path, int64_t lo, int64_t hi, int64_t *out)
{
    if (!kv)
        return 1;
    if (!gguf_type_is_int(kv->type))
        return gguf_val_wrong(kv, path, "an integer");
    if (gguf_type_is_signed(kv->type) ? kv->v.i < lo || kv->v.i > hi : kv->v.u > (uint64_t)hi) {
        if (gguf_type_is_signed(kv->type))
            return err_set("gguf: %s: key '%s' = %lld is outside %lld..%lld", path, kv->key, (long long)kv->v.i,
                           (long long)lo, (long long)hi);
        return err_set("gguf: %s: key '%s' = %llu is outside %lld..%lld", path, kv->key,
                       (unsigned long long)kv->v.u, (long long)lo, (long long)hi);
    }
    *out = gguf_type_is_signed(kv->type) ? kv->v.i : (int64_t)kv->v.u;
    return 0;
}

/* Where a part has split.no or split.count, they must say what its name does:
 * part `part` (0-based) of n_parts. */
static int gguf_split_check(const struct gguf_kv *kv, uint64_t n_kv, const char *path, int32_t part,
                            int32_t n_parts)
{
    int64_t v;
    int rc = gguf_val_int(gguf_kvs_find(kv, (int64_t)n_kv, "split.count"), path, 0, INT32_MAX, &v);
    if (rc < 0)
        return -1;
    if (rc == 0 && v != n_parts && n_parts == 1)
        return err_set("gguf: %s: split.count is %lld: a part of a split set, whose parts open by their names "
                       "(NAME-00001-of-%05lld.gguf)",
                       path, (long long)v, (long long)v);
    if (rc == 0 && v != n_parts)
        return err_set("gguf: %s: split.count is %lld, but the file's name says %d parts", path, (long long)v,
                       n_parts);
    rc = gguf_val_int(gguf_kvs_find(kv, (int64_t)n_kv, "split.no"), path, 0, INT32_MAX, &v);
    if (rc < 0)
        return -1;
    if (rc == 0 && v != part)
        return err_set("gguf: %s: split.no is %lld, but the file's name makes it part %d (split.no %d)", path,
                       (long long)v, part + 1, part);
    return 0;
}

struct gguf_range {
    uint64_t begin, end;
    const char *name;
};

static int gguf_cmp_range(const void *a, const void *b)
{
    const struct gguf_range *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Maps one file (part `part` of n_parts), validates it and appends its
 * tensors to g; the first part's KVs and alignment become g's. */
static int gguf_add_file(struct gguf *g, const char *path, int32_t part, int32_t n_parts)
{
    int fd = -1, rc = -1;
    void *map = MAP_FAILED;
    struct stat sb;
    size_t size = 0;
    struct gguf_kv *kv = NULL;
    uint64_t n_kv = 0;
    struct gguf_range *ranges = NULL;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (n_parts > 1)
            err_set("gguf: %s: %s (part %d of a split set of %d)", path, strerror(errno), part + 1, n_parts);
        else
            err_set("gguf: %s: %s", path, strerror(errno));
        goto done;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        err_set("gguf: %s: not a regular file", path);
        goto done;
    }
    size = (size_t)sb.st_size;
    if (size < GGUF_HEADER_BYTES) {
        err_set("gguf: %s: file too short (%zu bytes) for a GGUF header", path, size);
        goto done;
    }
    map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        err_set("gguf: %s: mmap: %s", path, strerror(errno));
        goto done;
    }
    close(fd);
    fd = -1;
    struct gguf_file *nf = realloc(g->files, ((size_t)g->n_files + 1) * sizeof *nf);
    char *fpath = nf ? strdup(path) : NULL;
    if (nf)
        g->files = nf;
    if (!fpath) {
        err_set("gguf: out of memory");
        goto done;
    }
    g->files[g->n_files++] = (struct gguf_file){fpath, map, size};
    map = MAP_FAILED; /* now owned by g */

    /* little-endian host assumed (x86-64, arm64), as the format's byte order;
     * the header's 24 bytes are there (the size was checked) */
    struct gguf_rd r = {g->files[g->n_files - 1].map, size, 0};
    uint8_t magic[4];
    uint32_t version;
    uint64_t n_tensors;
    gguf_rd_take(&r, magic, 4);
    gguf_rd_take(&r, &version, 4);
    gguf_rd_take(&r, &n_tensors, 8);
    gguf_rd_take(&r, &n_kv, 8);
    if (memcmp(magic, "GGUF", 4) != 0) {
        err_set("gguf: %s: not a GGUF file (magic %02x %02x %02x %02x)", path, magic[0], magic[1], magic[2],
                magic[3]);
        goto done;
    }
    if (version == 1) {
        err_set("gguf: %s: GGUF version 1 (before August 2023), which Kapitsa does not read: convert the model "
                "again with a current llama.cpp",
                path);
        goto done;
    }
    if (version != 2 && version != 3) {
        /* a big-endian file stores its small version number in the last byte */
        if (version != 0 && (version & 0xffffffu) == 0)
            err_set("gguf: %s: a big-endian GGUF file (version %u), which Kapitsa does not read", path,
                    version >> 24);
        else
            err_set("gguf: %s: GGUF version %u, which Kapitsa does not read (it reads 2 and 3)", path, version);
        goto done;
    }
    const uint64_t rest = size - r.at;
    if (n_kv > rest / GGUF_MIN_KV || n_tensors > (rest - n_kv * GGUF_MIN_KV) / GGUF_MIN_INFO) {
        err_set("gguf: %s: %llu KVs and %llu tensors cannot fit in the file's %zu bytes", path,
                (unsigned long long)n_kv, (unsigned long long)n_tensors, size);
        goto done;
    }

    kv = calloc(n_kv ? n_kv : 1, sizeof *kv);
    if (!kv) {
        err_set("gguf: out of memory");
        goto done;
    }
    for (uint64_t i = 0; i < n_kv; i++)
        if (gguf_kv_read(&r, path, &kv[i], i, n_kv) != 0)
            goto done;
    qsort(kv, n_kv, sizeof *kv, gguf_cmp_key);
    for (uint64_t i = 1; i < n_kv; i++)
        if (strcmp(kv[i].key, kv[i - 1].key) == 0) {
            err_set("gguf: %s: key '%s' appears twice", path, kv[i].key);
            goto done;
        }
    int64_t align = GGUF_ALIGN_DEFAULT;
    if (gguf_val_int(gguf_kvs_find(kv, (int64_t)n_kv, "general.alignment"), path, 0, UINT32_MAX, &align) < 0 ||
        gguf_split_check(kv, n_kv, path, part, n_parts) != 0)
        goto done;
    if (align == 0 || (align & (align - 1)) != 0) {
        err_set("gguf: %s: general.alignment %lld is not a power of two", path, (long long)align);
        goto done;
    }

    /* + 1: never a zero-size allocation */
    struct gguf_tensor *nt = realloc(g->tensors, (size_t)(g->n_tensors + (int64_t)n_tensors + 1) * sizeof *nt);
    if (nt)
        g->tensors = nt;
    ranges = calloc(n_tensors ? n_tensors : 1, sizeof *ranges);
    if (!nt || !ranges) {
        err_set("gguf: out of memory");
        goto done;
    }
    const int64_t first = g->n_tensors;
    for (uint64_t i = 0; i < n_tensors; i++) {
        struct gguf_tensor *t = &g->tensors[g->n_tensors];
        uint32_t ggml = 0;
        *t = (struct gguf_tensor){.file = g->files[g->n_files - 1].path};
        int bad = gguf_info_read(&r, path, t, &ggml, &ranges[i].begin, i, n_tensors);
        if (t->name)
            g->n_tensors++; /* owned by g from here */
        if (bad || gguf_info_check(t, path, ggml, size) != 0)
            goto done;
        ranges[i].name = t->name;
    }
    /* the data section: after the infos, at the next multiple of the alignment */
    const uint64_t data0 = (r.at + (uint64_t)align - 1) / (uint64_t)align * (uint64_t)align;
    const uint64_t data_size = size > data0 ? size - data0 : 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        struct gguf_tensor *t = &g->tensors[first + (int64_t)i];
        const uint64_t off = ranges[i].begin;
        if (off % (uint64_t)align != 0) {
            err_set("gguf: %s: tensor '%s': offset %llu is not a multiple of general.alignment %lld", path, t->name,
                    (unsigned long long)off, (long long)align);
            goto done;
        }
        if (off > data_size || t->n_bytes > data_size - off) {
            err_set("gguf: %s: tensor '%s': %zu bytes at offset %llu pass the end of the data section (%llu bytes)",
                    path, t->name, t->n_bytes, (unsigned long long)off, (unsigned long long)data_size);
            goto done;
        }
        if ((uint64_t)align < gguf_elem_align(t->type)) {
            err_set("gguf: %s: tensor '%s': general.alignment %lld leaves its %s data misaligned", path, t->name,
                    (long long)align, dtype_name(t->type));
            goto done;
        }
        ranges[i].end = off + t->n_bytes;
        t->data = (const char *)g->files[g->n_files - 1].map + data0 + off;
    }
    qsort(ranges, n_tensors, sizeof *ranges, gguf_cmp_range);
    for (uint64_t i = 1; i < n_tensors; i++)
        if (ranges[i].begin < ranges[i - 1].end) {
            err_set("gguf: %s: tensors '%s' and '%s' overlap", path, ranges[i - 1].name, ranges[i].name);
            goto done;
        }
    if (part == 0) {
        g->kv = kv;
        g->n_kv = (int64_t)n_kv;
        g->alignment = (uint32_t)align;
        kv = NULL;
    }
    rc = 0;
done:
    gguf_kvs_free(kv, n_kv);
    free(ranges);
    if (map != MAP_FAILED)
        munmap(map, size);
    if (fd >= 0)
        close(fd);
    return rc;
}

static int gguf_cmp_name(const void *a, const void *b)
{
    return strcmp(((const struct gguf_tensor *)a)->name, ((const struct gguf_tensor *)b)->name);
}

/* Sorts the tensors of every part, refuses a name twice, and checks the
 * first part's split.tensors.count against them. */
static int gguf_finish(struct gguf *g)
{
    if (g->n_tensors > 1)
        qsort(g->tensors, (size_t)g->n_tensors, sizeof *g->tensors, gguf_cmp_name);
    for (int64_t i = 1; i < g->n_tensors; i++) {
        const struct gguf_tensor *a = &g->tensors[i - 1], *b = &g->tensors[i];
        if (strcmp(a->name, b->name) != 0)
            continue;
        if (a->file == b->file)
            return err_set("gguf: %s: tensor '%s' appears twice", a->file, a->name);
        return err_set("gguf: tensor '%s' appears in both %s and %s", a->name, a->file, b->file);
    }
    int64_t n;
    int rc = gguf_get_i64(g, "split.tensors.count", &n);
    if (rc < 0)
        return -1;
    if (rc == 0 && n != g->n_tensors)
        return err_set("gguf: %s: split.tensors.count is %lld, but the %d part(s) hold %lld tensors",
                       g->files[0].path, (long long)n, g->n_files, (long long)g->n_tensors);
    return 0;
}

/* A split part's name, "PREFIX-<no>-of-<count>.gguf" (gguf-split writes
 * five digits each); the parts' names are rebuilt with the same widths. */
struct gguf_split {
    int n_prefix, w_no, w_count;
    const char *count_digits;
    int32_t no, count;
};

/* Digits ending at end (at most 9, at least one, not before lo); their start, or NULL. */
static const char *gguf_digits_before(const char *lo, const char *end, int32_t *v)
{
    const char *b = end;
    while (b > lo && end - b < 9 && isdigit((unsigned char)b[-1]))
        b--;
    if (b == end)
        return NULL;
    *v = 0;
    for (const char *c = b; c < end; c++)
        *v = *v * 10 + (*c - '0');
    return b;
}

/* 0 when path names a split part, -1 when it does not. */
static int gguf_split_parse(const char *path, struct gguf_split *s)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const size_t n = strlen(path);
    if (n < 5 || strcmp(path + n - 5, ".gguf") != 0)
        return -1;
    const char *end = path + n - 5;
    const char *c = gguf_digits_before(base, end, &s->count);
    if (!c || c - base < 4 || memcmp(c - 4, "-of-", 4) != 0)
        return -1;
    const char *b = gguf_digits_before(base, c - 4, &s->no);
    if (!b || b == base || b[-1] != '-')
        return -1;
    s->n_prefix = (int)(b - 1 - path);
    s->w_no = (int)(c - 4 - b);
    s->w_count = (int)(end - c);
    s->count_digits = c;
    return 0;
}

int gguf_open(struct gguf *g, const char *path)
{
    struct gguf_split s;
    char part[4096];
    memset(g, 0, sizeof *g);
    if (gguf_split_parse(path, &s) != 0) {
        if (gguf_add_file(g, path, 0, 1) != 0)
            goto fail;
    } else {
        if (s.no < 1 || s.no > s.count) {
            err_set("gguf: %s: the name makes it part %d of %d", path, s.no, s.count);
            goto fail;
        }
        for (int32_t i = 1; i <= s.count; i++) {
            int n = snprintf(part, sizeof part, "%.*s-%0*d-of-%.*s.gguf", s.n_prefix, path, s.w_no, i, s.w_count,
                             s.count_digits);
            if (n < 0 || (size_t)n >= sizeof part) {
                err_set("gguf: %s: path too long", path);
                goto fail;
            }
            if (gguf_add_file(g, part, i - 1, s.count) != 0)
                goto fail;
        }
    }
    if (gguf_finish(g) != 0)
        goto fail;
    return 0;
fail:
    gguf_close(g);
    return -1;
}

void gguf_close(struct gguf *g)
{
    gguf_kvs_free(g->kv, (uint64_t)g->n_kv);
    for (int64_t i = 0; i < g->n_tensors; i++)
        free(g->tensors[i].name);
    for (int32_t i = 0; i < g->n_files; i++) {
        munmap(g->files[i].map, g->files[i].size);
        free(g->files[i].path);
    }
    free(g->tensors);
    free(g->files);
    memset(g, 0, sizeof *g);
}

const struct gguf_kv *gguf_kv_find(const struct gguf *g, const char *key)
{
    return gguf_kvs_find(g->kv, g->n_kv, key);
}

const struct gguf_tensor *gguf_find(const struct gguf *g, const char *name)
{
    int64_t lo = 0, hi = g->n_tensors - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->tensors[mid].name, name);
        if (c == 0)
            return &g->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

int gguf_get_i64(const struct gguf *g, const char *key, int64_t *out)
{
    return gguf_val_int(gguf_kv_find(g, key), g->files[0].path, INT64_MIN, INT64_MAX, out);
}

int gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out)
{
    int64_t v;
    int rc = gguf_val_int(gguf_kv_find(g, key), g->files[0].path, 0, UINT32_MAX, &v);
    if (rc == 0)
        *out = (uint32_t)v;
    return rc;
}

int gguf_get_f32(const struct gguf *g, const char *key, float *out)
{
    const struct gguf_kv *kv = gguf_kv_find(g, key);
    if (!kv)
        return 1;
    if (kv->type != GGUF_F32 && kv->type != GGUF_F64)
        return gguf_val_wrong(kv, g->files[0].path, "a float");
    if (isfinite(kv->v.f) && fabs(kv->v.f) > FLT_MAX)
        return err_set("gguf: %s: key '%s' = %g is beyond a 32-bit float's range", g->files[0].path, key, kv->v.f);
    *out = (float)kv->v.f;
    return 0;
}

int gguf_get_bool(const struct gguf *g, const char *key, bool *out)
{
    const struct gguf_kv *kv = gguf_kv_find(g, key);
    if (!kv)
        return 1;
    if (kv->type != GGUF_BOOL)
        return gguf_val_wrong(kv, g->files[0].path, "a BOOL");
    *out = kv->v.b;
    return 0;
}

int gguf_get_str(const struct gguf *g, const char *key, const char **p, size_t *n)
{
    const struct gguf_kv *kv = gguf_kv_find(g, key);
    if (!kv)
        return 1;
    if (kv->type != GGUF_STRING)
        return gguf_val_wrong(kv, g->files[0].path, "a STRING");
    *p = kv->str.p;
    *n = (size_t)kv->str.n;
    return 0;
}

int gguf_get_arr(const struct gguf *g, const char *key, enum gguf_type elem, const struct gguf_kv **out)
{
    const struct gguf_kv *kv = gguf_kv_find(g, key);
    if (!kv)
        return 1;
    if (kv->type != GGUF_ARRAY || kv->arr_type != elem) {
        char want[32];
        snprintf(want, sizeof want, "an ARRAY of %s", gguf_type_names[elem]);
        return gguf_val_wrong(kv, g->files[0].path, want);
    }
    *out = kv;
    return 0;
}

/* ---------------------------------------------------------------- writer */

struct gguf_wtensor {
    char *name;
    enum dtype type;
    int32_t n_dim;
    int64_t ne[GGUF_MAX_DIM];
    uint64_t n_bytes, off; /* off: in the data section */
};

struct gguf_writer {
    char *path;
    uint8_t *kvs; /* the KV section as it will be written */
    size_t n_kvs, cap_kvs;
    uint64_t n_kv;
    char **keys; /* [n_kv], to refuse a key added twice */
    struct gguf_wtensor *t;
    int32_t n_t;
    char err[512]; /* the first failure, reported by finish; "" while none */
};

/* Records the message just set as w's first failure. */
static void gguf_writer_fail(struct gguf_writer *w)
{
    if (!w->err[0])
        snprintf(w->err, sizeof w->err, "%s", err_msg());
}

int gguf_writer_init(struct gguf_writer **w, const char *path)
{
    *w = calloc(1, sizeof **w);
    if (*w)
        (*w)->path = strdup(path);
    if (!*w || !(*w)->path) {
        free(*w);
        *w = NULL;
        return err_set("gguf: out of memory");
    }
    return 0;
}

static int gguf_writer_put(struct gguf_writer *w, const void *p, size_t n)
{
    if (w->err[0])
        return -1;
    if (n == 0) /* p may be NULL (an empty array): no memcpy from it */
        return 0;
    if (n > w->cap_kvs - w->n_kvs) {
        size_t cap = w->cap_kvs ? w->cap_kvs * 2 : 256;
        if (n > SIZE_MAX / 2 - w->n_kvs) {
            err_set("gguf: %s: out of memory for the KVs", w->path);
            gguf_writer_fail(w);
            return -1;
        }
        if (cap < w->n_kvs + n)
            cap = w->n_kvs + n;
        uint8_t *kvs = realloc(w->kvs, cap);
        if (!kvs) {
            err_set("gguf: %s: out of memory for the KVs", w->path);
            gguf_writer_fail(w);
            return -1;
        }
        w->kvs = kvs;
        w->cap_kvs = cap;
    }
    memcpy(w->kvs + w->n_kvs, p, n);
    w->n_kvs += n;
    return 0;
}

static int gguf_writer_put_str(struct gguf_writer *w, const char *s)
{
    const uint64_t n = strlen(s);
    return gguf_writer_put(w, &n, 8) != 0 || gguf_writer_put(w, s, (size_t)n) != 0 ? -1 : 0;
}

/* Starts a KV: its key and type; -1 (recorded) for a key added twice. */
static int gguf_writer_key(struct gguf_writer *w, const char *key, enum gguf_type type)
{
    assert(strcmp(key, "general.alignment") != 0); /* the data is laid out at the default */
    if (w->err[0])
        return -1;
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0) {
            err_set("gguf: %s: key '%s' added twice", w->path, key);
            gguf_writer_fail(w);
            return -1;
        }
    char **keys = realloc(w->keys, (size_t)(w->n_kv + 1) * sizeof *keys);
    if (keys)
        w->keys = keys;
    char *k = keys ? strdup(key) : NULL;
    if (!k) {
        err_set("gguf: %s: out of memory", w->path);
        gguf_writer_fail(w);
        return -1;
    }
    w->keys[w->n_kv++] = k;
    const uint32_t t = type;
    return gguf_writer_put_str(w, key) != 0 || gguf_writer_put(w, &t, 4) != 0 ? -1 : 0;
}

static void gguf_writer_scalar(struct gguf_writer *w, const char *key, enum gguf_type type, const void *v)
{
    if (gguf_writer_key(w, key, type) == 0)
        gguf_writer_put(w, v, gguf_type_size[type]);
}

void gguf_writer_kv_u8(struct gguf_writer *w, const char *key, uint8_t v)
{
    gguf_writer_scalar(w, key, GGUF_U8, &v);
}

void gguf_writer_kv_i8(struct gguf_writer *w, const char *key, int8_t v)
{
    gguf_writer_scalar(w, key, GGUF_I8, &v);
}

void gguf_writer_kv_u16(struct gguf_writer *w, const char *key, uint16_t v)
{
    gguf_writer_scalar(w, key, GGUF_U16, &v);
}

void gguf_writer_kv_i16(struct gguf_writer *w, const char *key, int16_t v)
{
    gguf_writer_scalar(w, key, GGUF_I16, &v);
}

void gguf_writer_kv_u32(struct gguf_writer *w, const char *key, uint32_t v)
{
    gguf_writer_scalar(w, key, GGUF_U32, &v);
}

void gguf_writer_kv_i32(struct gguf_writer *w, const char *key, int32_t v)
{
    gguf_writer_scalar(w, key, GGUF_I32, &v);
}

void gguf_writer_kv_u64(struct gguf_writer *w, const char *key, uint64_t v)
{
    gguf_writer_scalar(w, key, GGUF_U64, &v);
}

void gguf_writer_kv_i64(struct gguf_writer *w, const char *key, int64_t v)
{
    gguf_writer_scalar(w, key, GGUF_I64, &v);
}

void gguf_writer_kv_f32(struct gguf_writer *w, const char *key, float v)
{
    gguf_writer_scalar(w, key, GGUF_F32, &v);
}

void gguf_writer_kv_f64(struct gguf_writer *w, const char *key, double v)
{
    gguf_writer_scalar(w, key, GGUF_F64, &v);
}

void gguf_writer_kv_bool(struct gguf_writer *w, const char *key, bool v)
{
    const uint8_t b = v;
    gguf_writer_scalar(w, key, GGUF_BOOL, &b);
}

void gguf_writer_kv_str(struct gguf_writer *w, const char *key, const char *s)
{
    if (gguf_writer_key(w, key, GGUF_STRING) == 0)
        gguf_writer_put_str(w, s);
}

void gguf_writer_kv_arr_str(struct gguf_writer *w, const char *key, const char *const *strs, uint64_t n)
{
    const uint32_t elem = GGUF_STRING;
    if (gguf_writer_key(w, key, GGUF_ARRAY) != 0 || gguf_writer_put(w, &elem, 4) != 0 ||
        gguf_writer_put(w, &n, 8) != 0)
        return;
    for (uint64_t i = 0; i < n && gguf_writer_put_str(w, strs[i]) == 0; i++)
        ;
}

void gguf_writer_kv_arr(struct gguf_writer *w, const char *key, enum gguf_type elem, const void *v, uint64_t n)
{
    assert(elem < GGUF_N_TYPES && elem != GGUF_STRING && elem != GGUF_ARRAY);
    const uint32_t e = elem;
    if (gguf_writer_key(w, key, GGUF_ARRAY) != 0 || gguf_writer_put(w, &e, 4) != 0 || gguf_writer_put(w, &n, 8) != 0)
        return;
    if (n > SIZE_MAX / gguf_type_size[elem]) {
        err_set("gguf: %s: key '%s': array of %llu elements too large", w->path, key, (unsigned long long)n);
        gguf_writer_fail(w);
        return;
    }
    gguf_writer_put(w, v, (size_t)n * gguf_type_size[elem]);
}

void gguf_writer_kv_arr_i32(struct gguf_writer *w, const char *key, const int32_t *v, uint64_t n)
{
    gguf_writer_kv_arr(w, key, GGUF_I32, v, n);
}

void gguf_writer_kv_arr_f32(struct gguf_writer *w, const char *key, const float *v, uint64_t n)
{
    gguf_writer_kv_arr(w, key, GGUF_F32, v, n);
}

int gguf_writer_tensor(struct gguf_writer *w, const char *name, enum dtype type, int32_t n_dim, const int64_t *ne)
{
    assert((unsigned)type < DT_COUNT);
    if (w->err[0])
        return err_set("%s", w->err);
    struct gguf_wtensor t = {.type = type, .n_dim = n_dim, .ne = {1, 1, 1, 1}};
    if (n_dim < 1 || n_dim > GGUF_MAX_DIM) {
        err_set("gguf: %s: tensor '%s': %d dimensions (1 to %d)", w->path, name, n_dim, GGUF_MAX_DIM);
        goto fail;
    }
    for (int32_t d = 0; d < n_dim; d++) {
        if (ne[d] <= 0) {
            err_set("gguf: %s: tensor '%s': ne[%d] = %lld is not positive", w->path, name, d, (long long)ne[d]);
            goto fail;
        }
        t.ne[d] = ne[d];
    }
    if (t.ne[0] % dtype_block(type) != 0) {
        err_set("gguf: %s: tensor '%s': ne[0] = %lld is not a multiple of %s's block of %lld", w->path, name,
                (long long)t.ne[0], dtype_name(type), (long long)dtype_block(type));
        goto fail;
    }
    if (gguf_nbytes(type, t.ne, INT64_MAX, &t.n_bytes) != 0) {
        err_set("gguf: %s: tensor '%s' is too large", w->path, name);
        goto fail;
    }
    for (int32_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0) {
            err_set("gguf: %s: tensor '%s' added twice", w->path, name);
            goto fail;
        }
    struct gguf_wtensor *nt = realloc(w->t, ((size_t)w->n_t + 1) * sizeof *nt);
    if (nt)
        w->t = nt;
    t.name = nt ? strdup(name) : NULL;
    if (!t.name) {
        err_set("gguf: %s: out of memory", w->path);
        goto fail;
    }
    w->t[w->n_t++] = t;
    return 0;
fail:
    gguf_writer_fail(w);
    return -1;
}

static uint64_t gguf_align_up(uint64_t n)
{
    return (n + GGUF_ALIGN_DEFAULT - 1) / GGUF_ALIGN_DEFAULT * GGUF_ALIGN_DEFAULT;
}

int gguf_writer_finish(struct gguf_writer *w, gguf_fill_fn fill, void *ctx)
{
    static const uint8_t zeros[GGUF_ALIGN_DEFAULT];
    char *tmp = NULL;
    FILE *f = NULL;
    void *buf = NULL;
    int rc = -1;
    if (w->err[0]) {
        err_set("%s", w->err);
        goto done;
    }
    /* the layout: each tensor's data at the next multiple of the alignment,
     * padded after the last too (as ggml writes it) */
    uint64_t infos = 0, off = 0, max_bytes = 0;
    for (int32_t i = 0; i < w->n_t; i++) {
        infos += 8 + strlen(w->t[i].name) + 4 + 8 * (uint64_t)w->t[i].n_dim + 4 + 8;
        w->t[i].off = off;
        off = gguf_align_up(off + w->t[i].n_bytes);
        if (w->t[i].n_bytes > max_bytes)
            max_bytes = w->t[i].n_bytes;
    }
    const uint64_t header = GGUF_HEADER_BYTES + w->n_kvs + infos;
    tmp = malloc(strlen(w->path) + 5);
    buf = malloc(max_bytes ? (size_t)max_bytes : 1);
    if (!tmp || !buf) {
        err_set("gguf: %s: out of memory (%llu bytes for a tensor)", w->path, (unsigned long long)max_bytes);
        goto done;
    }
    sprintf(tmp, "%s.tmp", w->path);
    f = fopen(tmp, "wb");
    if (!f) {
        err_set("gguf: %s: %s", tmp, strerror(errno));
        goto done;
    }
    const uint32_t version = 3;
    const uint64_t n_t = (uint64_t)w->n_t;
    /* with no KVs w->kvs is NULL, which fwrite may not be given even for 0 bytes */
    if (fwrite("GGUF", 4, 1, f) != 1 || fwrite(&version, 4, 1, f) != 1 || fwrite(&n_t, 8, 1, f) != 1 ||
        fwrite(&w->n_kv, 8, 1, f) != 1 || (w->n_kvs && fwrite(w->kvs, 1, w->n_kvs, f) != w->n_kvs))
        goto werr;
    for (int32_t i = 0; i < w->n_t; i++) {
        const struct gguf_wtensor *t = &w->t[i];
        const uint64_t n_name = strlen(t->name);
        const uint32_t n_dim = (uint32_t)t->n_dim, ggml = (uint32_t)dtype_traits[t->type].ggml;
        if (fwrite(&n_name, 8, 1, f) != 1 || fwrite(t->name, 1, n_name, f) != n_name || fwrite(&n_dim, 4, 1, f) != 1 ||
            fwrite(t->ne, 8, n_dim, f) != n_dim || fwrite(&ggml, 4, 1, f) != 1 || fwrite(&t->off, 8, 1, f) != 1)
            goto werr;
    }
    size_t n_pad = (size_t)(gguf_align_up(header) - header);
    if (fwrite(zeros, 1, n_pad, f) != n_pad)
        goto werr;
    for (int32_t i = 0; i < w->n_t; i++) {
        const size_t nb = (size_t)w->t[i].n_bytes;
        fill(ctx, i, buf, nb);
        n_pad = (size_t)(gguf_align_up(nb) - nb);
        if (fwrite(buf, 1, nb, f) != nb || fwrite(zeros, 1, n_pad, f) != n_pad)
            goto werr;
    }
    /* on disk before the rename, so PATH is never a partial file */
    if (fflush(f) != 0 || fsync(fileno(f)) != 0)
        goto werr;
    int closed = fclose(f);
    f = NULL;
    if (closed != 0)
        goto werr;
    if (rename(tmp, w->path) != 0) {
        err_set("gguf: %s: rename from %s: %s", w->path, tmp, strerror(errno));
        goto done;
    }
    rc = 0;
    goto done;
werr:
    err_set("gguf: %s: write failed: %s", tmp, strerror(errno));
done:
    if (f)
        fclose(f);
    if (rc != 0 && tmp)
        unlink(tmp);
    free(tmp);
    free(buf);
    gguf_writer_free(w);
    return rc;
}

void gguf_writer_free(struct gguf_writer *w)
{
    if (!w)
        return;
    for (uint64_t i = 0; i < w->n_kv; i++)
        free(w->keys[i]);
    for (int32_t i = 0; i < w->n_t; i++)
        free(w->t[i].name);
    free(w->keys);
    free(w->t);
    free(w->kvs);
    free(w->path);
    free(w);
}
