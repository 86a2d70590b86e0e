/* Tests of the safetensors reader: round trip through the writer, every kind
 * of broken header (each must fail with a message naming file and tensor),
 * and sharded checkpoints. */
#include "../../src/base/err.h"
#include "../../src/model/safetensors.h"
#include "test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void fill_seq(void *ctx, int32_t i, void *buf, size_t n)
{
    (void)ctx;
    for (size_t b = 0; b < n; b++)
        ((uint8_t *)buf)[b] = (uint8_t)(i * 31 + (int32_t)b);
}

void test_safetensors_roundtrip(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/rt.safetensors", test_tmpdir());
    struct st_wtensor t[3] = {{"b.weight", DT_BF16, 2, {3, 5}}, {"a", DT_F32, 1, {7}}, {"c.f16", DT_F16, 3, {2, 1, 3}}};
    CHECK(st_write(path, 3, t, fill_seq, NULL) == 0, "%s", err_msg());
    struct safetensors st;
    CHECK(st_open_file(&st, path) == 0, "%s", err_msg());
    CHECK(st.n_tensors == 3, "n=%d", st.n_tensors);
    const struct st_tensor *b = st_find(&st, "b.weight"), *a = st_find(&st, "a"), *c = st_find(&st, "c.f16");
    CHECK(b && b->type == DT_BF16 && b->n_dim == 2 && b->shape[0] == 3 && b->shape[1] == 5 && b->n_bytes == 30, "b");
    CHECK(a && a->type == DT_F32 && a->n_bytes == 28, "a");
    CHECK(c && c->type == DT_F16 && c->n_dim == 3 && c->n_bytes == 12, "c");
    CHECK(st_find(&st, "missing") == NULL, "absent tensor found");
    if (b)
        for (size_t i = 0; i < b->n_bytes; i++)
            CHECK(((const uint8_t *)b->data)[i] == (uint8_t)(0 * 31 + (int)i), "b data %zu", i);
    if (c)
        CHECK(((const uint8_t *)c->data)[5] == (uint8_t)(2 * 31 + 5), "c data");
    st_close(&st);
}

/* Writes a file with the given JSON header and n_data bytes of data. */
static void write_raw(const char *path, const char *hdr, uint64_t n_hdr_claim, size_t n_data)
{
    FILE *f = fopen(path, "wb");
    uint64_t n = n_hdr_claim ? n_hdr_claim : strlen(hdr);
    fwrite(&n, 8, 1, f);
    fwrite(hdr, 1, strlen(hdr), f);
    for (size_t i = 0; i < n_data; i++)
        fputc(0, f);
    fclose(f);
}

void test_safetensors_broken(void)
{
    struct {
        const char *hdr;
        uint64_t claim;
        size_t n_data;
        const char *want; /* substring of the error */
    } cases[] = {
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 0, 8, "outside"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 1000, 16, "header length"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"u\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 0, 16, "overlap"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", 0, 16, "bytes for shape"},
        {"{\"t\":{\"dtype\":\"Q4_K\",\"shape\":[4],\"data_offsets\":[0,16]}}", 0, 16, "unsupported dtype 'Q4_K'"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,4]}}", 0, 16, "outside"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}", 0, 16, "bad shape"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[4]}}", 0, 16, "data_offsets"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},", 0, 16, "not a JSON object"},
        {"[1,2]", 0, 0, "not a JSON object"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 0, 8, "not a JSON object"},
        {"{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,16]}}", 0, 16, "too large"},
    };
    char path[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(path, sizeof path, "%s/broken%zu.safetensors", test_tmpdir(), i);
        write_raw(path, cases[i].hdr, cases[i].claim, cases[i].n_data);
        struct safetensors st;
        err_clear();
        int rc = st_open_file(&st, path);
        CHECK(rc != 0, "case %zu opened", i);
        CHECK(strstr(err_msg(), cases[i].want) && strstr(err_msg(), path), "case %zu: message '%s' lacks '%s'", i,
              err_msg(), cases[i].want);
    }
    /* too short for a header, and missing */
    snprintf(path, sizeof path, "%s/short.safetensors", test_tmpdir());
    FILE *f = fopen(path, "wb");
    fputs("abc", f);
    fclose(f);
    struct safetensors st;
    CHECK(st_open_file(&st, path) != 0 && strstr(err_msg(), "too short"), "%s", err_msg());
    snprintf(path, sizeof path, "%s/none.safetensors", test_tmpdir());
    CHECK(st_open_file(&st, path) != 0 && strstr(err_msg(), "No such file"), "%s", err_msg());
}

/* Tensors not aligned to their element in the file (a header not padded to 8
 * bytes) are read into aligned copies with the same bytes. */
void test_safetensors_unaligned(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/unaligned.safetensors", test_tmpdir());
    char hdr[256];
    int n = snprintf(hdr, sizeof hdr, "%s",
                     "{\"w\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]},"
                     "\"f\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[6,14]},"
                     "\"g\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[15,17]}}");
    while ((8 + n) % 4 != 1) /* w and f misaligned; g (at data + 15) aligned to its 2 bytes */
        hdr[n++] = ' ';
    uint64_t n_hdr = (uint64_t)n;
    uint8_t data[17];
    for (int i = 0; i < 17; i++)
        data[i] = (uint8_t)(i * 13 + 1);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(&n_hdr, 8, 1, f) == 1 && fwrite(hdr, 1, (size_t)n, f) == (size_t)n &&
              fwrite(data, 1, sizeof data, f) == sizeof data && fclose(f) == 0,
          "write");
    struct safetensors st;
    CHECK(st_open_file(&st, path) == 0, "%s", err_msg());
    CHECK(st.n_copied == 2 && st.copied_bytes == 14, "copied %d tensors, %llu bytes", st.n_copied,
          (unsigned long long)st.copied_bytes);
    const char *names[] = {"w", "f", "g"};
    const size_t off[] = {0, 6, 15}, align[] = {2, 4, 2};
    for (int i = 0; i < 3; i++) {
        const struct st_tensor *t = st_find(&st, names[i]);
        CHECK(t && (uintptr_t)t->data % align[i] == 0, "%s misaligned", names[i]);
        CHECK(t && memcmp(t->data, data + off[i], t->n_bytes) == 0, "%s: bytes differ", names[i]);
        CHECK(t && (t->copy != NULL) == (i < 2), "%s: copy %p", names[i], t ? t->copy : NULL);
    }
    st_close(&st);
}

void test_safetensors_sharded(void)
{
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/sharded", test_tmpdir());
    mkdir(dir, 0755);
    struct st_wtensor a[2] = {{"x", DT_F32, 1, {4}}, {"y", DT_BF16, 1, {6}}};
    struct st_wtensor b[1] = {{"z", DT_F16, 2, {2, 2}}};
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    st_write(path, 2, a, fill_seq, NULL);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    st_write(path, 1, b, fill_seq, NULL);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"metadata\":{\"total_size\":36},\"weight_map\":{\"x\":\"model-00001-of-00002.safetensors\","
          "\"y\":\"model-00001-of-00002.safetensors\",\"z\":\"model-00002-of-00002.safetensors\"}}", f);
    fclose(f);
    struct safetensors st;
    CHECK(st_open_dir(&st, dir) == 0, "%s", err_msg());
    CHECK(st.n_files == 2 && st.n_tensors == 3, "files %d tensors %d", st.n_files, st.n_tensors);
    const struct st_tensor *z = st_find(&st, "z");
    CHECK(z && strstr(z->file, "00002") && z->type == DT_F16, "z in shard 2");
    st_close(&st);

    /* the index names a tensor its shard lacks */
    f = fopen(path, "w");
    fputs("{\"weight_map\":{\"x\":\"model-00001-of-00002.safetensors\",\"w\":\"model-00002-of-00002.safetensors\"}}", f);
    fclose(f);
    CHECK(st_open_dir(&st, dir) != 0 && strstr(err_msg(), "'w'"), "%s", err_msg());
    /* a missing shard */
    f = fopen(path, "w");
    fputs("{\"weight_map\":{\"x\":\"model-00003-of-00002.safetensors\"}}", f);
    fclose(f);
    CHECK(st_open_dir(&st, dir) != 0 && strstr(err_msg(), "00003"), "%s", err_msg());
    /* a shard name that escapes the folder */
    f = fopen(path, "w");
    fputs("{\"weight_map\":{\"x\":\"../x.safetensors\"}}", f);
    fclose(f);
    CHECK(st_open_dir(&st, dir) != 0 && strstr(err_msg(), "not a file name"), "%s", err_msg());
}
