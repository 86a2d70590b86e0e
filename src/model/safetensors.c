/* safetensors: mmapped reader with full header validation, sharded index,
 * streaming writer. Format: huggingface/safetensors docs (see safetensors.h). */
#define _GNU_SOURCE
#include "safetensors.h"

#include "../base/err.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER (100u << 20)

static int st_dtype_parse(const char *s, enum dtype *out)
{
    for (int t = 0; t < DT_N_PLAIN; t++)
        if (strcmp(s, dtype_name((enum dtype)t)) == 0) {
            *out = (enum dtype)t;
            return 0;
        }
    return -1;
}

static int st_cmp_name(const void *a, const void *b)
{
    return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}

struct st_range {
    uint64_t begin, end;
    const char *name;
};

static int st_cmp_range(const void *a, const void *b)
{
    const struct st_range *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* Header entry key: val (one tensor) checked against the file's data_size
 * bytes of data into t's type, shape and byte range [*b, *e); -1 with
 * err_set() naming the file and the tensor. */
static int st_entry_parse(const char *path, const char *key, json_t *val, uint64_t data_size, struct st_tensor *t,
                          json_int_t *b_out, json_int_t *e_out)
{
    const char *what = NULL;
    json_t *jd = json_object_get(val, "dtype");
    json_t *js = json_object_get(val, "shape");
    json_t *jo = json_object_get(val, "data_offsets");
    if (!json_is_object(val))
        what = "entry is not an object";
    else if (!json_is_string(jd))
        what = "missing dtype";
    else if (st_dtype_parse(json_string_value(jd), &t->type) != 0)
        return err_set("safetensors: %s: tensor '%s': unsupported dtype '%s'", path, key, json_string_value(jd));
    else if (!json_is_array(js) || json_array_size(js) > ST_MAX_DIM)
        what = "bad shape";
    else if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
             !json_is_integer(json_array_get(jo, 1)))
        what = "bad data_offsets";
    if (what)
        return err_set("safetensors: %s: tensor '%s': %s", path, key, what);
    uint64_t numel = 1;
    t->n_dim = (int32_t)json_array_size(js);
    for (int32_t d = 0; d < t->n_dim; d++) {
        json_t *e = json_array_get(js, (size_t)d);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > ((json_int_t)1 << 40))
            return err_set("safetensors: %s: tensor '%s': bad shape", path, key);
        t->shape[d] = json_integer_value(e);
        if (t->shape[d] && numel > ((uint64_t)1 << 44) / (uint64_t)t->shape[d])
            return err_set("safetensors: %s: tensor '%s': shape too large", path, key);
        numel *= (uint64_t)t->shape[d];
    }
    const json_int_t b = json_integer_value(json_array_get(jo, 0)), e = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || e < b || (uint64_t)e > data_size)
        return err_set("safetensors: %s: tensor '%s': data_offsets [%lld, %lld] outside the %llu data bytes", path,
                       key, (long long)b, (long long)e, (unsigned long long)data_size);
    if ((uint64_t)(e - b) != numel * dtype_size(t->type))
        return err_set("safetensors: %s: tensor '%s': %lld bytes for shape of %llu %s elements", path, key,
                       (long long)(e - b), (unsigned long long)numel, dtype_name(t->type));
    *b_out = b;
    *e_out = e;
    return 0;
}

/* The byte ranges of a file's n tensors, sorted: -1 with err_set() if two overlap. */
static int st_check_overlaps(const char *path, struct st_range *ranges, size_t n)
{
    qsort(ranges, n, sizeof *ranges, st_cmp_range);
    for (size_t i = 1; i < n; i++)
        if (ranges[i].begin < ranges[i - 1].end)
            return err_set("safetensors: %s: tensors '%s' and '%s' overlap", path, ranges[i - 1].name,
                           ranges[i].name);
    return 0;
}

/* Tensors first.. of st whose data is not aligned to their element, copied
 * into aligned memory. Only once the header has passed: overlapping entries
 * could otherwise ask for the data many times over. */
static int st_align_copies(struct safetensors *st, const char *path, int32_t first)
{
    for (int32_t i = first; i < st->n_tensors; i++) {
        struct st_tensor *t = &st->tensors[i];
        if (!t->n_bytes || (uintptr_t)t->data % dtype_size(t->type) == 0)
            continue;
        t->copy = aligned_alloc(64, (t->n_bytes + 63) & ~(size_t)63);
        if (!t->copy)
            return err_set("safetensors: %s: out of memory for an aligned copy of '%s' (%zu bytes)", path, t->name,
                           t->n_bytes);
        memcpy(t->copy, t->data, t->n_bytes);
        t->data = t->copy;
        st->n_copied++;
        st->copied_bytes += t->n_bytes;
    }
    return 0;
}

/* Maps one file, validates its header and appends its tensors to st. */
static int st_add_file(struct safetensors *st, const char *path)
{
    int fd = -1;
    void *map = MAP_FAILED;
    json_t *hdr = NULL;
    struct st_range *ranges = NULL;
    struct stat sb;
    size_t size = 0;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        err_set("safetensors: %s: %s", path, strerror(errno));
        goto fail;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        err_set("safetensors: %s: not a regular file", path);
        goto fail;
    }
    size = (size_t)sb.st_size;
    if (size < 8) {
        err_set("safetensors: %s: file too short (%zu bytes) for a header", path, size);
        goto fail;
    }
    map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        err_set("safetensors: %s: mmap: %s", path, strerror(errno));
        goto fail;
    }
    close(fd);
    fd = -1;

    uint64_t n_hdr = 0;
    memcpy(&n_hdr, map, 8); /* little-endian host assumed (x86-64, arm64) */
    if (n_hdr > ST_MAX_HEADER || n_hdr > size - 8) {
        err_set("safetensors: %s: header length %llu exceeds the file (%zu bytes)", path,
                (unsigned long long)n_hdr, size);
        goto fail;
    }
    json_error_t je;
    hdr = json_loadb((const char *)map + 8, (size_t)n_hdr, JSON_REJECT_DUPLICATES, &je);
    if (!hdr || !json_is_object(hdr)) {
        err_set("safetensors: %s: header is not a JSON object (%s)", path, hdr ? "" : je.text);
        goto fail;
    }
    const uint64_t data_size = size - 8 - n_hdr;
    const char *data0 = (const char *)map + 8 + n_hdr;

    size_t n_new = json_object_size(hdr);
    struct st_tensor *nt = realloc(st->tensors, (st->n_tensors + n_new) * sizeof *nt);
    if (!nt) {
        err_set("safetensors: out of memory");
        goto fail;
    }
    st->tensors = nt;
    ranges = calloc(n_new ? n_new : 1, sizeof *ranges);
    struct st_file *nf = realloc(st->files, (st->n_files + 1) * sizeof *nf);
    if (!ranges || !nf) {
        err_set("safetensors: out of memory");
        goto fail;
    }
    st->files = nf;
    char *fpath = strdup(path);
    if (!fpath) {
        err_set("safetensors: out of memory");
        goto fail;
    }
    st->files[st->n_files++] = (struct st_file){fpath, map, size};
    map = MAP_FAILED; /* now owned by st */

    size_t n_ranges = 0;
    const int32_t first = st->n_tensors;
    const char *key;
    json_t *val;
    json_object_foreach(hdr, key, val) {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        struct st_tensor t = {0};
        json_int_t b = 0, e = 0;
        if (st_entry_parse(path, key, val, data_size, &t, &b, &e) != 0)
            goto fail;
        t.name = strdup(key);
        if (!t.name) {
            err_set("safetensors: out of memory");
            goto fail;
        }
        t.data = data0 + b;
        t.n_bytes = (size_t)(e - b);
        t.file = st->files[st->n_files - 1].path;
        st->tensors[st->n_tensors++] = t;
        ranges[n_ranges++] = (struct st_range){(uint64_t)b, (uint64_t)e, t.name};
    }
    if (st_check_overlaps(path, ranges, n_ranges) != 0 || st_align_copies(st, path, first) != 0)
        goto fail;
    free(ranges);
    json_decref(hdr);
    return 0;
fail:
    free(ranges);
    json_decref(hdr);
    if (map != MAP_FAILED)
        munmap(map, size);
    if (fd >= 0)
        close(fd);
    return -1;
}

static int st_finish(struct safetensors *st)
{
    if (st->n_tensors > 1)
        qsort(st->tensors, (size_t)st->n_tensors, sizeof *st->tensors, st_cmp_name);
    for (int32_t i = 1; i < st->n_tensors; i++)
        if (strcmp(st->tensors[i].name, st->tensors[i - 1].name) == 0)
            return err_set("safetensors: tensor '%s' appears in both %s and %s", st->tensors[i].name,
                           st->tensors[i - 1].file, st->tensors[i].file);
    return 0;
}

int st_open_file(struct safetensors *st, const char *path)
{
    memset(st, 0, sizeof *st);
    if (st_add_file(st, path) != 0 || st_finish(st) != 0) {
        st_close(st);
        return -1;
    }
    return 0;
}

static int st_open_index(struct safetensors *st, const char *dir, const char *index_path)
{
    json_error_t je;
    json_t *idx = json_load_file(index_path, 0, &je);
    json_t *map = idx ? json_object_get(idx, "weight_map") : NULL;
    char path[4096];
    int rc = -1;
    if (!json_is_object(map)) {
        err_set("safetensors: %s: %s", index_path, idx ? "no weight_map object" : je.text);
        goto done;
    }
    /* open each distinct shard once, in order of first mention */
    const char *key;
    json_t *val;
    json_object_foreach(map, key, val) {
        const char *shard = json_string_value(val);
        if (!shard || strchr(shard, '/') || strcmp(shard, "..") == 0) {
            err_set("safetensors: %s: weight_map['%s'] is not a file name", index_path, key);
            goto done;
        }
        snprintf(path, sizeof path, "%s/%s", dir, shard);
        int seen = 0;
        for (int32_t f = 0; f < st->n_files && !seen; f++)
            seen = strcmp(st->files[f].path, path) == 0;
        if (!seen && st_add_file(st, path) != 0)
            goto done;
    }
    if (st_finish(st) != 0)
        goto done;
    json_object_foreach(map, key, val) {
        const struct st_tensor *t = st_find(st, key);
        snprintf(path, sizeof path, "%s/%s", dir, json_string_value(val));
        if (!t || strcmp(t->file, path) != 0) {
            err_set("safetensors: %s: tensor '%s' listed in weight_map is missing from %s", index_path,
                    key, path);
            goto done;
        }
    }
    rc = 0;
done:
    json_decref(idx);
    return rc;
}

int st_open_dir(struct safetensors *st, const char *dir)
{
    char path[4096];
    memset(st, 0, sizeof *st);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    int rc;
    if (access(path, F_OK) == 0) {
        rc = st_open_index(st, dir, path);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = st_add_file(st, path);
        if (rc == 0)
            rc = st_finish(st);
    }
    if (rc != 0)
        st_close(st);
    return rc;
}

void st_close(struct safetensors *st)
{
    for (int32_t i = 0; i < st->n_tensors; i++) {
        free(st->tensors[i].name);
        free(st->tensors[i].copy);
    }
    for (int32_t i = 0; i < st->n_files; i++) {
        munmap(st->files[i].map, st->files[i].size);
        free(st->files[i].path);
    }
    free(st->tensors);
    free(st->files);
    memset(st, 0, sizeof *st);
}

const struct st_tensor *st_find(const struct safetensors *st, const char *name)
{
    int32_t lo = 0, hi = st->n_tensors - 1;
    while (lo <= hi) {
        int32_t mid = (lo + hi) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (c == 0)
            return &st->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

int st_write(const char *path, int32_t n, const struct st_wtensor *t, st_fill_fn fill, void *ctx)
{
    json_t *hdr = json_object();
    json_t *meta = json_pack("{s:s}", "format", "pt");
    char *text = NULL;
    void *buf = NULL;
    FILE *f = NULL;
    int rc = -1;
    uint64_t off = 0;
    size_t max_bytes = 0;
    json_object_set_new(hdr, "__metadata__", meta);
    for (int32_t i = 0; i < n; i++) {
        json_t *shape = json_array();
        uint64_t numel = 1;
        for (int32_t d = 0; d < t[i].n_dim; d++) {
            json_array_append_new(shape, json_integer(t[i].shape[d]));
            numel *= (uint64_t)t[i].shape[d];
        }
        uint64_t nb = numel * dtype_size(t[i].type);
        if (nb > max_bytes)
            max_bytes = (size_t)nb;
        json_object_set_new(hdr, t[i].name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", dtype_name(t[i].type), "shape",
                                      shape, "data_offsets", (json_int_t)off, (json_int_t)(off + nb)));
        off += nb;
    }
    text = json_dumps(hdr, JSON_COMPACT);
    if (!text) {
        err_set("safetensors: %s: cannot encode header", path);
        goto done;
    }
    size_t n_text = strlen(text);
    size_t n_pad = (8 - n_text % 8) % 8; /* keep data 8-byte aligned, padded with spaces */
    uint64_t n_hdr = n_text + n_pad;
    f = fopen(path, "wb");
    if (!f) {
        err_set("safetensors: %s: %s", path, strerror(errno));
        goto done;
    }
    buf = malloc(max_bytes ? max_bytes : 1);
    if (!buf) {
        err_set("safetensors: out of memory (%zu bytes)", max_bytes);
        goto done;
    }
    if (fwrite(&n_hdr, 8, 1, f) != 1 || fwrite(text, 1, n_text, f) != n_text ||
        fwrite("        ", 1, n_pad, f) != n_pad)
        goto werr;
    for (int32_t i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (int32_t d = 0; d < t[i].n_dim; d++)
            numel *= (uint64_t)t[i].shape[d];
        size_t nb = (size_t)(numel * dtype_size(t[i].type));
        fill(ctx, i, buf, nb);
        if (fwrite(buf, 1, nb, f) != nb)
            goto werr;
    }
    if (fclose(f) != 0) {
        f = NULL;
        goto werr;
    }
    f = NULL;
    rc = 0;
    goto done;
werr:
    err_set("safetensors: %s: write failed: %s", path, strerror(errno));
done:
    if (f)
        fclose(f);
    free(buf);
    free(text);
    json_decref(hdr);
    return rc;
}
