/* libFuzzer target: a checkpoint folder as a download could leave it. The first
 * byte picks a fixture (tests/fixtures), the second which of its files the rest
 * of the input replaces: the safetensors header (the fixture's tensor bytes kept
 * after it), config.json, generation_config.json, or, for the sharded fixture,
 * model.safetensors.index.json. Loading must fail with a message, or give a
 * model whose forward runs on the cpu (a prompt of five tokens, then one token
 * decoded on a fork); never crash, leak or touch memory it does not own. */
#define _GNU_SOURCE
#include "../../src/backend/cpu/cpu.h"
#include "../../src/base/err.h"
#include "../../src/engine/engine.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

static const char *const fixtures[] = {
    "qwen3",      "qwen3_moe",       "qwen3_moe_mixed", "qwen3_f16_linear", "qwen3_next", "qwen3_next_mixed",
    "qwen3_5",    "qwen3_5_moe",     "qwen3_5_wrapper", "nemotron_h",       "nemotron_h_groups",
    "nemotron_h_moe", "qwen3_yarn_sharded",
};
enum { N_FIX = sizeof fixtures / sizeof fixtures[0], SHARDED = N_FIX - 1 };
enum { M_HEADER, M_CONFIG, M_GENERATION, M_INDEX, N_MODE };
static const char *const mode_file[N_MODE] = {"model.safetensors", "config.json", "generation_config.json",
                                              "model.safetensors.index.json"};

static char work[PATH_MAX];
static struct backend *be;

static void die(const char *what)
{
    fprintf(stderr, "fuzz_checkpoint: %s: %s\n", what, err_msg());
    abort();
}

static void clear_work(void);

static void remove_work(void)
{
    clear_work();
    rmdir(work);
}

static void setup(void)
{
    const char *tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(work, sizeof work, "%s/kapitsa-fuzz-XXXXXX", tmp);
    if (!mkdtemp(work))
        die("mkdtemp");
    atexit(remove_work);
    be = cpu_backend_init(1, NULL);
    if (!be)
        die("cpu backend");
}

static void clear_work(void)
{
    DIR *d = opendir(work);
    if (!d)
        die("opendir");
    struct dirent *de;
    char p[PATH_MAX + 256];
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", work, de->d_name);
            unlink(p);
        }
    closedir(d);
}

static void write_file(const char *name, const void *a, size_t na, const void *b, size_t nb)
{
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/%s", work, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(a, 1, na, f) != na || (nb && fwrite(b, 1, nb, f) != nb) || fclose(f) != 0)
        die(name);
}

/* Every file of the fixture but the one the input replaces, linked in. */
static void link_fixture(const char *fix, const char *skip)
{
    char src[PATH_MAX], p[PATH_MAX + 256], q[PATH_MAX + 256];
    snprintf(p, sizeof p, "tests/fixtures/%s", fix);
    if (!realpath(p, src))
        die(p);
    DIR *d = opendir(src);
    if (!d)
        die("opendir fixture");
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.' && strcmp(de->d_name, skip) != 0 && strcmp(de->d_name, "golden.safetensors") != 0) {
            snprintf(p, sizeof p, "%s/%s", src, de->d_name);
            snprintf(q, sizeof q, "%s/%s", work, de->d_name);
            if (symlink(p, q) != 0)
                die("symlink");
        }
    closedir(d);
}

/* The tensor bytes after the fixture's header (read once per fixture). */
static const unsigned char *fixture_data(int32_t fi, size_t *n)
{
    static unsigned char *bytes[N_FIX];
    static size_t n_bytes[N_FIX];
    if (!bytes[fi]) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "tests/fixtures/%s/model.safetensors", fixtures[fi]);
        FILE *f = fopen(p, "rb");
        uint64_t h = 0;
        if (!f || fread(&h, 8, 1, f) != 1 || fseek(f, 0, SEEK_END) != 0)
            die(p);
        long end = ftell(f);
        n_bytes[fi] = (size_t)end - 8 - (size_t)h;
        bytes[fi] = malloc(n_bytes[fi]);
        if (!bytes[fi] || fseek(f, (long)(8 + h), SEEK_SET) != 0 || fread(bytes[fi], 1, n_bytes[fi], f) != n_bytes[fi])
            die(p);
        fclose(f);
    }
    *n = n_bytes[fi];
    return bytes[fi];
}

/* A model that loaded must run: a five-token prompt, then a decode on a fork. */
static void run_model(struct model *m)
{
    struct engine e;
    if (engine_init(&e, m, 64, 2, 8, 8, 8, DT_F32) != 0)
        return;
    const int32_t V = m->cfg.vocab_size;
    float *logits = malloc((size_t)V * 2 * sizeof(float));
    if (!logits)
        abort();
    int32_t tok[5], pos[5], seq[5], par[5];
    uint8_t want[5];
    int32_t s0 = engine_seq_new(&e);
    for (int32_t i = 0; i < 5; i++) {
        tok[i] = (i * 7 + 3) % V;
        pos[i] = i;
        seq[i] = s0;
        par[i] = i - 1;
        want[i] = i == 4;
    }
    struct batch pb = {5, tok, pos, seq, par, want};
    if (engine_forward(&e, &pb, logits, NULL) != 1 || engine_commit_all(&e) != 0)
        die("prefill");
    int32_t s1 = engine_seq_fork(&e, s0), p5 = 5, pa = -1, t1 = 1 % V;
    uint8_t one = 1;
    struct batch db = {1, &t1, &p5, &s1, &pa, &one};
    if (s1 < 0 || engine_forward(&e, &db, logits + V, NULL) != 1 || engine_commit_all(&e) != 0)
        die("decode");
    free(logits);
    engine_free(&e);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    if (!be)
        setup();
    if (size < 2)
        return 0;
    const int32_t fi = data[0] % N_FIX;
    int mode = data[1] % N_MODE;
    if ((mode == M_INDEX) != (fi == SHARDED))
        return 0;
    const unsigned char *text = data + 2;
    const size_t n = size - 2;
    clear_work();
    if (mode == M_HEADER) {
        size_t nd;
        const unsigned char *d = fixture_data(fi, &nd);
        uint64_t h = n;
        unsigned char *buf = malloc(8 + n);
        if (!buf)
            abort();
        memcpy(buf, &h, 8);
        memcpy(buf + 8, text, n);
        write_file(mode_file[mode], buf, 8 + n, d, nd);
        free(buf);
    } else {
        write_file(mode_file[mode], text, n, NULL, 0);
    }
    link_fixture(fixtures[fi], mode_file[mode]);
    struct model m;
    err_clear();
    if (model_load(&m, work, be, NULL) == 0) {
        run_model(&m);
        model_free(&m);
    } else if (!err_msg()[0]) {
        abort(); /* a failure must say why */
    }
    return 0;
}
