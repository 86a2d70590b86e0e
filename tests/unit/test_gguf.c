/* Tests of the GGUF reader and writer: a round trip of every value type and of
 * plain and block tensor types, the writer's refusals, split sets opened through
 * any part, and broken files built byte by byte (each must fail with a message
 * naming the file and the key, tensor or reason; a file cut anywhere too). */
#define _GNU_SOURCE
#include "../../src/base/err.h"
#include "../../src/model/gguf.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void fill_seq(void *ctx, int32_t i, void *buf, size_t n)
{
    (void)ctx;
    for (size_t b = 0; b < n; b++)
        ((uint8_t *)buf)[b] = (uint8_t)(i * 31 + (int32_t)b * 7);
}

static bool str_is(const char *p, size_t n, const char *want)
{
    return n == strlen(want) && memcmp(p, want, n) == 0;
}

static const struct {
    const char *name;
    enum dtype type;
    int32_t n_dim;
    int64_t ne[4];
} rt_tensors[] = {
    {"blk.0.attn_q.weight", DT_Q4_K, 2, {512, 3}},
    {"token_embd.weight", DT_Q8_0, 2, {64, 5}},
    {"output_norm.weight", DT_F32, 1, {7}},
    {"blk.0.ffn_up.weight", DT_F16, 3, {3, 2, 2}},
    {"a.bf16", DT_BF16, 4, {2, 1, 3, 2}},
    {"z.i32", DT_I32, 1, {5}},
    {"q4_0", DT_Q4_0, 1, {32}},
    {"iq2", DT_IQ2_XXS, 2, {256, 2}},
    {"q6k", DT_Q6_K, 1, {256}},
    {"iq4xs", DT_IQ4_XS, 2, {256, 1}},
};
enum { N_RT = sizeof rt_tensors / sizeof rt_tensors[0] };

void test_gguf_roundtrip(void)
{
    char path[512], tmp[600];
    snprintf(path, sizeof path, "%s/rt.gguf", test_tmpdir());
    struct gguf_writer *w;
    CHECK(gguf_writer_init(&w, path) == 0, "%s", err_msg());
    gguf_writer_kv_str(w, "general.architecture", "qwen3");
    gguf_writer_kv_u8(w, "t.u8", 200);
    gguf_writer_kv_i8(w, "t.i8", -100);
    gguf_writer_kv_u16(w, "t.u16", 60000);
    gguf_writer_kv_i16(w, "t.i16", -30000);
    gguf_writer_kv_u32(w, "t.u32", 4000000000u);
    gguf_writer_kv_i32(w, "t.i32", -2000000000);
    gguf_writer_kv_u64(w, "t.u64", UINT64_MAX);
    gguf_writer_kv_i64(w, "t.i64", INT64_MIN);
    gguf_writer_kv_f32(w, "t.f32", 0.1f);
    gguf_writer_kv_f64(w, "t.f64", 0.25);
    gguf_writer_kv_f64(w, "t.f64big", 1e300);
    gguf_writer_kv_bool(w, "t.bool", true);
    gguf_writer_kv_str(w, "t.empty", "");
    const char *toks[] = {"a", "", "h\xc3\xa9llo", "<|im_end|>"};
    gguf_writer_kv_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
    const int32_t ids[] = {1, -2, 3};
    gguf_writer_kv_arr_i32(w, "t.arr_i32", ids, 3);
    const float scores[] = {0.5f, -1.25f};
    gguf_writer_kv_arr_f32(w, "t.arr_f32", scores, 2);
    const uint8_t flags[] = {1, 0, 1};
    gguf_writer_kv_arr(w, "t.arr_bool", GGUF_BOOL, flags, 3);
    const double dbl[] = {1e-300, -2.5};
    gguf_writer_kv_arr(w, "t.arr_f64", GGUF_F64, dbl, 2);
    const int64_t big[] = {INT64_MAX, -1};
    gguf_writer_kv_arr(w, "t.arr_i64", GGUF_I64, big, 2);
    gguf_writer_kv_arr(w, "t.arr_empty", GGUF_U16, NULL, 0);
    gguf_writer_kv_arr_str(w, "t.arr_str_empty", NULL, 0);
    enum { N_KV = 22 };
    for (int i = 0; i < N_RT; i++)
        CHECK(gguf_writer_tensor(w, rt_tensors[i].name, rt_tensors[i].type, rt_tensors[i].n_dim, rt_tensors[i].ne) == 0,
              "%s", err_msg());
    CHECK(gguf_writer_finish(w, fill_seq, NULL) == 0, "%s", err_msg());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0, "%s left behind", tmp);

    struct gguf g;
    if (gguf_open(&g, path) != 0) {
        CHECK(0, "open: %s", err_msg());
        return;
    }
    CHECK(g.n_files == 1 && g.alignment == 32, "files %d alignment %u", g.n_files, g.alignment);
    CHECK(g.n_kv == N_KV, "n_kv %lld", (long long)g.n_kv);
    for (int64_t i = 1; i < g.n_kv; i++)
        CHECK(strcmp(g.kv[i - 1].key, g.kv[i].key) < 0, "kv not sorted at %lld", (long long)i);

    const char *s;
    size_t n;
    CHECK(gguf_get_str(&g, "general.architecture", &s, &n) == 0 && str_is(s, n, "qwen3"), "architecture");
    CHECK(gguf_get_str(&g, "t.empty", &s, &n) == 0 && n == 0, "empty string");
    uint32_t u32 = 7;
    int64_t i64;
    CHECK(gguf_get_u32(&g, "t.u8", &u32) == 0 && u32 == 200, "u8 %u", u32);
    CHECK(gguf_get_i64(&g, "t.i8", &i64) == 0 && i64 == -100, "i8");
    CHECK(gguf_get_i64(&g, "t.u16", &i64) == 0 && i64 == 60000, "u16");
    CHECK(gguf_get_i64(&g, "t.i16", &i64) == 0 && i64 == -30000, "i16");
    CHECK(gguf_get_u32(&g, "t.u32", &u32) == 0 && u32 == 4000000000u, "u32");
    CHECK(gguf_get_i64(&g, "t.i32", &i64) == 0 && i64 == -2000000000, "i32");
    CHECK(gguf_get_i64(&g, "t.i64", &i64) == 0 && i64 == INT64_MIN, "i64");
    const struct gguf_kv *kv = gguf_kv_find(&g, "t.u64");
    CHECK(kv && kv->type == GGUF_U64 && kv->v.u == UINT64_MAX, "u64 raw");
    /* out of the result's range, or another type: -1 naming the file and key */
    CHECK(gguf_get_i64(&g, "t.u64", &i64) == -1 && strstr(err_msg(), "'t.u64'") && strstr(err_msg(), path), "%s",
          err_msg());
    CHECK(gguf_get_u32(&g, "t.i8", &u32) == -1 && strstr(err_msg(), "'t.i8' = -100"), "%s", err_msg());
    CHECK(gguf_get_u32(&g, "t.u64", &u32) == -1, "u64 as u32");
    CHECK(gguf_get_u32(&g, "general.architecture", &u32) == -1 && strstr(err_msg(), "holds a STRING, not an integer"),
          "%s", err_msg());
    float f;
    CHECK(gguf_get_f32(&g, "t.f32", &f) == 0 && f == 0.1f, "f32 %g", f);
    CHECK(gguf_get_f32(&g, "t.f64", &f) == 0 && f == 0.25f, "f64 %g", f);
    kv = gguf_kv_find(&g, "t.f64big");
    CHECK(kv && kv->v.f == 1e300, "f64 raw");
    CHECK(gguf_get_f32(&g, "t.f64big", &f) == -1 && strstr(err_msg(), "'t.f64big'"), "%s", err_msg());
    CHECK(gguf_get_f32(&g, "t.u8", &f) == -1, "u8 as float");
    bool b = false;
    CHECK(gguf_get_bool(&g, "t.bool", &b) == 0 && b, "bool");
    CHECK(gguf_get_bool(&g, "t.u8", &b) == -1 && strstr(err_msg(), "holds a U8, not a BOOL"), "%s", err_msg());
    /* absent: 1, nothing touched */
    u32 = 7;
    CHECK(gguf_get_u32(&g, "no.such.key", &u32) == 1 && u32 == 7, "absent");
    CHECK(gguf_get_str(&g, "no.such.key", &s, &n) == 1 && !gguf_kv_find(&g, "no.such.key"), "absent str");

    CHECK(gguf_get_arr(&g, "tokenizer.ggml.tokens", GGUF_STRING, &kv) == 0 && kv->n == 4, "tokens");
    for (int i = 0; i < 4 && kv && kv->n == 4; i++)
        CHECK(str_is(kv->strs[i].p, kv->strs[i].n, toks[i]), "token %d", i);
    CHECK(gguf_get_arr(&g, "t.arr_i32", GGUF_F32, &kv) == -1 &&
              strstr(err_msg(), "holds an ARRAY of I32, not an ARRAY of F32"),
          "%s", err_msg());
    CHECK(gguf_get_arr(&g, "t.u8", GGUF_U8, &kv) == -1, "scalar as array");
    int32_t ids_back[3];
    CHECK(gguf_get_arr(&g, "t.arr_i32", GGUF_I32, &kv) == 0 && kv->n == 3, "arr_i32");
    memcpy(ids_back, kv->arr, sizeof ids_back);
    CHECK(memcmp(ids_back, ids, sizeof ids) == 0, "arr_i32 values");
    CHECK(gguf_get_arr(&g, "t.arr_f32", GGUF_F32, &kv) == 0 && kv->n == 2 &&
              memcmp(kv->arr, scores, sizeof scores) == 0,
          "arr_f32");
    CHECK(gguf_get_arr(&g, "t.arr_bool", GGUF_BOOL, &kv) == 0 && kv->n == 3 && memcmp(kv->arr, flags, 3) == 0, "bools");
    CHECK(gguf_get_arr(&g, "t.arr_f64", GGUF_F64, &kv) == 0 && kv->n == 2 && memcmp(kv->arr, dbl, sizeof dbl) == 0,
          "arr_f64");
    CHECK(gguf_get_arr(&g, "t.arr_i64", GGUF_I64, &kv) == 0 && kv->n == 2 && memcmp(kv->arr, big, sizeof big) == 0,
          "arr_i64");
    CHECK(gguf_get_arr(&g, "t.arr_empty", GGUF_U16, &kv) == 0 && kv->n == 0, "empty array");
    CHECK(gguf_get_arr(&g, "t.arr_str_empty", GGUF_STRING, &kv) == 0 && kv->n == 0, "empty string array");

    CHECK(g.n_tensors == N_RT, "n_tensors %lld", (long long)g.n_tensors);
    for (int64_t i = 1; i < g.n_tensors; i++)
        CHECK(strcmp(g.tensors[i - 1].name, g.tensors[i].name) < 0, "tensors not sorted");
    for (int i = 0; i < N_RT; i++) {
        const struct gguf_tensor *t = gguf_find(&g, rt_tensors[i].name);
        if (!t) {
            CHECK(0, "%s missing", rt_tensors[i].name);
            continue;
        }
        size_t want = dtype_bytes(rt_tensors[i].type, rt_tensors[i].ne[0]);
        for (int d = 1; d < rt_tensors[i].n_dim; d++)
            want *= (size_t)rt_tensors[i].ne[d];
        CHECK(t->type == rt_tensors[i].type && t->n_dim == rt_tensors[i].n_dim && t->n_bytes == want, "%s: %s %d %zu",
              t->name, dtype_name(t->type), t->n_dim, t->n_bytes);
        for (int d = 0; d < 4; d++)
            CHECK(t->ne[d] == (d < rt_tensors[i].n_dim ? rt_tensors[i].ne[d] : 1), "%s ne[%d] = %lld", t->name, d,
                  (long long)t->ne[d]);
        CHECK(((const char *)t->data - (const char *)g.files[0].map) % 32 == 0, "%s not aligned", t->name);
        CHECK(strcmp(t->file, path) == 0, "%s file %s", t->name, t->file);
        uint8_t *exp = malloc(t->n_bytes);
        fill_seq(NULL, i, exp, t->n_bytes);
        CHECK(memcmp(exp, t->data, t->n_bytes) == 0, "%s: data differs", t->name);
        free(exp);
    }
    CHECK(gguf_find(&g, "missing") == NULL, "absent tensor found");
    gguf_close(&g);
}

void test_gguf_writer_errors(void)
{
    char path[512], tmp[600];
    snprintf(path, sizeof path, "%s/werr.gguf", test_tmpdir());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    const int64_t ne[2] = {4, 2};
    struct gguf_writer *w;

    /* a good file first: the failed writes after must leave it whole */
    CHECK(gguf_writer_init(&w, path) == 0, "%s", err_msg());
    gguf_writer_kv_u32(w, "k", 1);
    gguf_writer_tensor(w, "t", DT_F32, 2, ne);
    CHECK(gguf_writer_finish(w, fill_seq, NULL) == 0, "%s", err_msg());

    CHECK(gguf_writer_init(&w, path) == 0, "%s", err_msg());
    gguf_writer_kv_u32(w, "k", 1);
    gguf_writer_kv_str(w, "k", "again");
    gguf_writer_kv_u32(w, "later", 2); /* after a failure: ignored, the first message kept */
    CHECK(gguf_writer_tensor(w, "t", DT_F32, 2, ne) == -1, "tensor after a failure");
    CHECK(gguf_writer_finish(w, fill_seq, NULL) == -1 && strstr(err_msg(), "key 'k' added twice") &&
              strstr(err_msg(), path),
          "%s", err_msg());

    const struct {
        enum dtype type;
        int32_t n_dim;
        int64_t ne[4];
        const char *want;
    } bad[] = {
        {DT_Q8_0, 2, {33, 2}, "ne[0] = 33 is not a multiple of Q8_0's block of 32"},
        {DT_F32, 5, {1, 1, 1, 1}, "5 dimensions"},
        {DT_F32, 0, {1}, "0 dimensions"},
        {DT_F32, 2, {4, 0}, "ne[1] = 0 is not positive"},
        {DT_F32, 3, {INT64_MAX / 2, INT64_MAX / 2, 4}, "too large"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(gguf_writer_init(&w, path) == 0, "%s", err_msg());
        CHECK(gguf_writer_tensor(w, "bad", bad[i].type, bad[i].n_dim, bad[i].ne) == -1 && strstr(err_msg(), "'bad'") &&
                  strstr(err_msg(), bad[i].want),
              "case %zu: %s", i, err_msg());
        err_clear();
        CHECK(gguf_writer_finish(w, fill_seq, NULL) == -1 && strstr(err_msg(), bad[i].want), "case %zu finish: %s", i,
              err_msg());
    }
    CHECK(gguf_writer_init(&w, path) == 0, "%s", err_msg());
    gguf_writer_tensor(w, "t", DT_F32, 2, ne);
    CHECK(gguf_writer_tensor(w, "t", DT_F16, 2, ne) == -1 && strstr(err_msg(), "tensor 't' added twice"), "%s",
          err_msg());
    CHECK(gguf_writer_finish(w, fill_seq, NULL) == -1, "duplicate tensor written");

    CHECK(access(tmp, F_OK) != 0, "%s left behind", tmp);
    struct gguf g;
    CHECK(gguf_open(&g, path) == 0 && g.n_tensors == 1 && g.n_kv == 1, "the earlier file: %s", err_msg());
    gguf_close(&g);

    /* a full disk: PATH.tmp leads to /dev/full, whose writes fail with ENOSPC */
    if (access("/dev/full", W_OK) == 0 && symlink("/dev/full", tmp) == 0) {
        CHECK(gguf_writer_init(&w, path) == 0, "%s", err_msg());
        gguf_writer_tensor(w, "t", DT_F32, 2, ne);
        CHECK(gguf_writer_finish(w, fill_seq, NULL) == -1 && strstr(err_msg(), "No space left on device") &&
                  strstr(err_msg(), tmp),
              "%s", err_msg());
        CHECK(access(tmp, F_OK) != 0, "%s left behind", tmp);
        CHECK(gguf_open(&g, path) == 0 && g.n_kv == 1, "the earlier file after a full disk: %s", err_msg());
        gguf_close(&g);
    }
    /* a folder that does not exist */
    char nodir[600];
    snprintf(nodir, sizeof nodir, "%s/no/such/dir/x.gguf", test_tmpdir());
    CHECK(gguf_writer_init(&w, nodir) == 0, "%s", err_msg());
    CHECK(gguf_writer_finish(w, fill_seq, NULL) == -1 && strstr(err_msg(), "No such file") &&
              strstr(err_msg(), "x.gguf.tmp"),
          "%s", err_msg());
}

/* One part of a split set: F32 [4] tensors, the split.* KVs as gguf-split writes them. */
static void write_part(const char *path, int no, int count, int total, const char *name, int n_t,
                       const char *const *tensors)
{
    struct gguf_writer *w;
    const int64_t ne[1] = {4};
    CHECK(gguf_writer_init(&w, path) == 0, "%s", err_msg());
    gguf_writer_kv_str(w, "general.name", name);
    gguf_writer_kv_u16(w, "split.no", (uint16_t)no);
    gguf_writer_kv_u16(w, "split.count", (uint16_t)count);
    gguf_writer_kv_i32(w, "split.tensors.count", total);
    if (no == 1)
        gguf_writer_kv_u32(w, "only.second", 1);
    for (int i = 0; i < n_t; i++)
        gguf_writer_tensor(w, tensors[i], DT_F32, 1, ne);
    CHECK(gguf_writer_finish(w, fill_seq, NULL) == 0, "%s", err_msg());
}

void test_gguf_split(void)
{
    char dir[512], p1[600], p2[600], p3[600];
    snprintf(dir, sizeof dir, "%s/split", test_tmpdir());
    mkdir(dir, 0755);
    snprintf(p1, sizeof p1, "%s/m-00001-of-00002.gguf", dir);
    snprintf(p2, sizeof p2, "%s/m-00002-of-00002.gguf", dir);
    const char *first[] = {"x", "y"}, *second[] = {"z"};
    write_part(p1, 0, 2, 3, "one", 2, first);
    write_part(p2, 1, 2, 3, "two", 1, second);
    const char *via[] = {p1, p2};
    for (int v = 0; v < 2; v++) {
        struct gguf g;
        if (gguf_open(&g, via[v]) != 0) {
            CHECK(0, "via %s: %s", via[v], err_msg());
            continue;
        }
        CHECK(g.n_files == 2 && g.n_tensors == 3, "files %d tensors %lld", g.n_files, (long long)g.n_tensors);
        CHECK(strcmp(g.files[0].path, p1) == 0 && strcmp(g.files[1].path, p2) == 0, "part order");
        const struct gguf_tensor *x = gguf_find(&g, "x"), *z = gguf_find(&g, "z");
        CHECK(x && strcmp(x->file, p1) == 0, "x in part 1");
        CHECK(z && strcmp(z->file, p2) == 0 && ((const uint8_t *)z->data)[1] == 7, "z in part 2");
        const char *s;
        size_t n;
        uint32_t u;
        CHECK(gguf_get_str(&g, "general.name", &s, &n) == 0 && str_is(s, n, "one"), "KVs of the first part");
        CHECK(gguf_get_u32(&g, "only.second", &u) == 1, "a KV of the second part");
        gguf_close(&g);
    }
    struct gguf g;
    /* a tensor in both parts */
    const char *dup[] = {"x"};
    write_part(p2, 1, 2, 3, "two", 1, dup);
    CHECK(gguf_open(&g, p1) != 0 && strstr(err_msg(), "tensor 'x' appears in both") && strstr(err_msg(), p2), "%s",
          err_msg());
    /* split.no against the name */
    write_part(p2, 0, 2, 3, "two", 1, second);
    CHECK(gguf_open(&g, p1) != 0 && strstr(err_msg(), "split.no is 0") && strstr(err_msg(), p2), "%s", err_msg());
    /* split.tensors.count against the tensors */
    write_part(p2, 1, 2, 3, "two", 1, second);
    write_part(p1, 0, 2, 5, "one", 2, first);
    CHECK(gguf_open(&g, p2) != 0 && strstr(err_msg(), "split.tensors.count is 5") && strstr(err_msg(), p1), "%s",
          err_msg());
    /* a missing part, named */
    snprintf(p1, sizeof p1, "%s/n-00001-of-00003.gguf", dir);
    snprintf(p2, sizeof p2, "%s/n-00002-of-00003.gguf", dir);
    snprintf(p3, sizeof p3, "%s/n-00003-of-00003.gguf", dir);
    write_part(p1, 0, 3, 3, "one", 2, first);
    write_part(p2, 1, 3, 3, "two", 1, second);
    CHECK(gguf_open(&g, p2) != 0 && strstr(err_msg(), p3) && strstr(err_msg(), "part 3 of a split set of 3"), "%s",
          err_msg());
    /* a part opened under another name */
    snprintf(p3, sizeof p3, "%s/renamed.gguf", dir);
    write_part(p3, 0, 3, 3, "one", 2, first);
    CHECK(gguf_open(&g, p3) != 0 && strstr(err_msg(), "split.count is 3") && strstr(err_msg(), p3), "%s", err_msg());
    /* a name whose numbers make no set */
    snprintf(p3, sizeof p3, "%s/m-00003-of-00002.gguf", dir);
    CHECK(gguf_open(&g, p3) != 0 && strstr(err_msg(), "part 3 of 2"), "%s", err_msg());
}

/* Files built byte by byte: a valid base (general.alignment 64, tensors 'a'
 * F32 [4] at 0 and 'b' Q8_0 [32, 2] at 64) and variants of it, each broken
 * in one way. */
struct raw {
    uint8_t b[4096];
    size_t n;
};

static void raw_put(struct raw *r, const void *p, size_t n)
{
    memcpy(r->b + r->n, p, n);
    r->n += n;
}

static void raw_u32(struct raw *r, uint32_t v) { raw_put(r, &v, 4); }
static void raw_u64(struct raw *r, uint64_t v) { raw_put(r, &v, 8); }

static void raw_str(struct raw *r, const char *s)
{
    raw_u64(r, strlen(s));
    raw_put(r, s, strlen(s));
}

enum xkv { XKV_NONE, XKV_LONG_STRING, XKV_UNKNOWN_TYPE, XKV_UNKNOWN_ELEM, XKV_NESTED, XKV_HUGE_ARRAY,
           XKV_HUGE_STRINGS, XKV_DUP_KEY, XKV_ALIGN_ZERO, XKV_ALIGN_STR };

struct rtensor {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    uint64_t off;
};

struct variant {
    const char *want;   /* in the message */
    const char *magic;  /* NULL: "GGUF" */
    uint32_t version;   /* 0: 3 */
    uint64_t n_kv, n_t; /* the counts claimed; 0: the real ones */
    uint32_t align;     /* general.alignment; 0: 64 */
    enum xkv xkv;       /* a KV added or changed */
    struct rtensor t[2]; /* t[0].name NULL: the base's */
    size_t n_data;      /* 0: 132 */
};

static void raw_build(struct raw *r, const struct variant *v)
{
    static const struct rtensor base[2] = {{"a", 1, {4}, 0, 0}, {"b", 2, {32, 2}, 8, 64}};
    const struct rtensor *t = v->t[0].name ? v->t : base;
    const uint32_t align = v->align ? v->align : 64;
    const bool extra = v->xkv != XKV_NONE && v->xkv != XKV_ALIGN_ZERO && v->xkv != XKV_ALIGN_STR;
    r->n = 0;
    raw_put(r, v->magic ? v->magic : "GGUF", 4);
    raw_u32(r, v->version ? v->version : 3);
    raw_u64(r, v->n_t ? v->n_t : 2);
    raw_u64(r, v->n_kv ? v->n_kv : 2 + (uint64_t)extra);
    raw_str(r, "general.architecture");
    raw_u32(r, GGUF_STRING);
    raw_str(r, "test");
    raw_str(r, "general.alignment");
    if (v->xkv == XKV_ALIGN_STR) {
        raw_u32(r, GGUF_STRING);
        raw_str(r, "64");
    } else {
        raw_u32(r, GGUF_U32);
        raw_u32(r, v->xkv == XKV_ALIGN_ZERO ? 0 : align);
    }
    switch (v->xkv) {
    case XKV_LONG_STRING:
        raw_str(r, "general.name");
        raw_u32(r, GGUF_STRING);
        raw_u64(r, 1000000);
        break;
    case XKV_UNKNOWN_TYPE:
        raw_str(r, "x.extra");
        raw_u32(r, 13);
        break;
    case XKV_UNKNOWN_ELEM:
        raw_str(r, "x.extra");
        raw_u32(r, GGUF_ARRAY);
        raw_u32(r, 99);
        raw_u64(r, 1);
        break;
    case XKV_NESTED:
        raw_str(r, "x.extra");
        raw_u32(r, GGUF_ARRAY);
        raw_u32(r, GGUF_ARRAY);
        raw_u64(r, 1);
        break;
    case XKV_HUGE_ARRAY:
        raw_str(r, "x.extra");
        raw_u32(r, GGUF_ARRAY);
        raw_u32(r, GGUF_U32);
        raw_u64(r, 1ull << 61);
        break;
    case XKV_HUGE_STRINGS:
        raw_str(r, "x.extra");
        raw_u32(r, GGUF_ARRAY);
        raw_u32(r, GGUF_STRING);
        raw_u64(r, 1ull << 60);
        break;
    case XKV_DUP_KEY:
        raw_str(r, "general.architecture");
        raw_u32(r, GGUF_STRING);
        raw_str(r, "again");
        break;
    default:
        break;
    }
    for (int i = 0; i < 2; i++) {
        raw_str(r, t[i].name);
        raw_u32(r, t[i].n_dims);
        for (uint32_t d = 0; d < t[i].n_dims && d < 4; d++)
            raw_u64(r, t[i].ne[d]);
        raw_u32(r, t[i].type);
        raw_u64(r, t[i].off);
    }
    const size_t pad = (align - r->n % align) % align;
    memset(r->b + r->n, 0, pad);
    r->n += pad;
    const size_t n_data = v->n_data ? v->n_data : 132;
    for (size_t i = 0; i < n_data; i++)
        r->b[r->n++] = (uint8_t)(i * 3);
}

static void raw_save(const struct raw *r, size_t n, const char *path)
{
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(r->b, 1, n, f) == n && fclose(f) == 0, "write %s", path);
}

void test_gguf_broken(void)
{
    char path[512];
    struct raw r;
    struct gguf g;
    /* the base opens, its data at general.alignment 64 */
    snprintf(path, sizeof path, "%s/base.gguf", test_tmpdir());
    raw_build(&r, &(struct variant){0});
    raw_save(&r, r.n, path);
    if (gguf_open(&g, path) == 0) {
        const struct gguf_tensor *b = gguf_find(&g, "b");
        CHECK(g.alignment == 64 && b && b->type == DT_Q8_0 && b->n_bytes == 68, "base");
        CHECK(b && ((const char *)b->data - (const char *)g.files[0].map) % 64 == 0 &&
                  (const uint8_t *)b->data + 68 == (const uint8_t *)g.files[0].map + r.n,
              "b at the end");
        gguf_close(&g);
    } else {
        CHECK(0, "base: %s", err_msg());
    }
    /* cut anywhere: refused, never read past the end */
    for (size_t cut = 0; cut < r.n; cut++) {
        snprintf(path, sizeof path, "%s/cut%zu.gguf", test_tmpdir(), cut);
        raw_save(&r, cut, path);
        err_clear();
        CHECK(gguf_open(&g, path) == -1 && strstr(err_msg(), path), "cut at %zu: '%s'", cut, err_msg());
        unlink(path);
    }

    const struct variant cases[] = {
        {.want = "not a GGUF file (magic 47 47 55 58)", .magic = "GGUX"},
        {.want = "GGUF version 1 (before August 2023)", .version = 1},
        {.want = "big-endian", .version = 3u << 24},
        {.want = "GGUF version 4, which Kapitsa does not read", .version = 4},
        {.want = "cannot fit", .n_kv = 1ull << 60},
        {.want = "cannot fit", .n_t = 1ull << 40},
        {.want = "cannot fit", .n_kv = UINT64_MAX, .n_t = UINT64_MAX},
        {.want = "key 'general.name': string runs past the end", .xkv = XKV_LONG_STRING},
        {.want = "key 'x.extra' has unknown value type 13", .xkv = XKV_UNKNOWN_TYPE},
        {.want = "key 'x.extra' is an array of unknown type 99", .xkv = XKV_UNKNOWN_ELEM},
        {.want = "key 'x.extra' is an array of arrays", .xkv = XKV_NESTED},
        {.want = "key 'x.extra': value runs past the end", .xkv = XKV_HUGE_ARRAY},
        {.want = "key 'x.extra': value runs past the end", .xkv = XKV_HUGE_STRINGS},
        {.want = "key 'general.architecture' appears twice", .xkv = XKV_DUP_KEY},
        {.want = "general.alignment 0 is not a power of two", .xkv = XKV_ALIGN_ZERO},
        {.want = "general.alignment 48 is not a power of two", .align = 48},
        {.want = "key 'general.alignment' holds a STRING, not an integer", .xkv = XKV_ALIGN_STR},
        {.want = "tensor 'a': general.alignment 1 leaves its F32 data misaligned", .align = 1},
        {.want = "tensor 'b' has GGUF type 17 (IQ2_XS), which Kapitsa does not read",
         .t = {{"a", 1, {4}, 0, 0}, {"b", 2, {32, 2}, 17, 64}}},
        {.want = "tensor 'b' has unknown GGUF type 99", .t = {{"a", 1, {4}, 0, 0}, {"b", 2, {32, 2}, 99, 64}}},
        {.want = "tensor 'b': offset 40 is not a multiple of general.alignment 64",
         .t = {{"a", 1, {4}, 0, 0}, {"b", 2, {32, 2}, 8, 40}}},
        {.want = "tensor 'b': 68 bytes at offset 128 pass the end of the data section",
         .t = {{"a", 1, {4}, 0, 0}, {"b", 2, {32, 2}, 8, 128}}},
        {.want = "tensor 'b': 68 bytes at offset 18446744073709551552 pass the end",
         .t = {{"a", 1, {4}, 0, 0}, {"b", 2, {32, 2}, 8, UINT64_MAX - 63}}},
        {.want = "tensors 'a' and 'b' overlap", .t = {{"a", 1, {32}, 0, 0}, {"b", 2, {32, 2}, 8, 64}}},
        {.want = "tensor 'a' appears twice", .t = {{"a", 1, {4}, 0, 0}, {"a", 2, {32, 2}, 8, 64}}},
        {.want = "tensor 'b': ne[0] = 33 is not a multiple of Q8_0's block of 32",
         .t = {{"a", 1, {4}, 0, 0}, {"b", 2, {33, 2}, 8, 64}}},
        {.want = "tensor 'b' has 5 dimensions", .t = {{"a", 1, {4}, 0, 0}, {"b", 5, {32, 1, 1, 1}, 8, 64}}},
        {.want = "tensor 'b' has 0 dimensions", .t = {{"a", 1, {4}, 0, 0}, {"b", 0, {0}, 8, 64}}},
        {.want = "tensor 'b': ne[1] = 0 is not positive", .t = {{"a", 1, {4}, 0, 0}, {"b", 2, {32, 0}, 8, 64}}},
        {.want = "tensor 'b': ne[1] = -9223372036854775808 is not positive",
         .t = {{"a", 1, {4}, 0, 0}, {"b", 2, {32, 1ull << 63}, 8, 64}}},
        {.want = "tensor 'b' (F32 [1099511627776, 1099511627776, 1099511627776, 1]) is larger than the file",
         .t = {{"a", 1, {4}, 0, 0}, {"b", 3, {1ull << 40, 1ull << 40, 1ull << 40}, 0, 64}}},
        {.want = "tensor 'b' (Q8_0 [9223372036854775776, 1, 1, 1]) is larger than the file",
         .t = {{"a", 1, {4}, 0, 0}, {"b", 1, {INT64_MAX - 31}, 8, 64}}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(path, sizeof path, "%s/broken%zu.gguf", test_tmpdir(), i);
        raw_build(&r, &cases[i]);
        raw_save(&r, r.n, path);
        err_clear();
        CHECK(gguf_open(&g, path) == -1 && strstr(err_msg(), cases[i].want) && strstr(err_msg(), path),
              "case %zu: message '%s' lacks '%s'", i, err_msg(), cases[i].want);
    }
    /* too short for a header, and missing */
    snprintf(path, sizeof path, "%s/short.gguf", test_tmpdir());
    raw_save(&r, 23, path);
    CHECK(gguf_open(&g, path) == -1 && strstr(err_msg(), "too short"), "%s", err_msg());
    snprintf(path, sizeof path, "%s/none.gguf", test_tmpdir());
    CHECK(gguf_open(&g, path) == -1 && strstr(err_msg(), "No such file") && strstr(err_msg(), path), "%s", err_msg());
}
