/* kapitsa imatrix: the importance matrix of a model over a calibration text
 * (src/model/imatrix.h), written as the GGUF file llama-imatrix writes. The
 * text's tokens are cut into chunks, each run from an empty cache as
 * llama-imatrix runs them; a tail shorter than a chunk is left out, as there. */
#define _POSIX_C_SOURCE 200809L
#include "../base/err.h"
#include "../engine/engine.h"
#include "../model/imatrix.h"
#include "../runtime/runtime.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void imatrix_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa imatrix -m|--model M --text FILE [--out FILE.gguf] [--chunk N] [--chunks K]\n"
               "                       [-t|--threads N]\n"
               "  the importance matrix of model M (a folder, catalog name, hub id or .gguf; qwen3, qwen3_moe)\n"
               "  over the text in FILE: per weight matrix, the sums of each input column's squares over the\n"
               "  tokens, in chunks of N tokens (default 512), the first K chunks (default all), on the cpu.\n"
               "  --out: the file (default imatrix.gguf), llama-imatrix's GGUF format, which\n"
               "  `kapitsa quantize --imatrix` and llama-quantize --imatrix read\n");
}

/* The text's tokens; -1 with err_set(). */
static int read_tokens(const char *model, const char *path, struct tok_ids *ids)
{
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    long n = -1;
    if (!f || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0 ||
        !(text = malloc((size_t)n + 1)) || fread(text, 1, (size_t)n, f) != (size_t)n) {
        if (f)
            fclose(f);
        free(text);
        return err_set("imatrix: %s: cannot read the text", path);
    }
    fclose(f);
    struct tokenizer *tok = runtime_tokenizer(model);
    const int rc = tok ? tok_encode(tok, text, (size_t)n, ids) : -1;
    tok_free(tok);
    free(text);
    return rc;
}

/* Runs n_chunks chunks of `chunk` tokens through e, each a sequence of its own. */
static int run_chunks(struct engine *e, const int32_t *toks, int32_t chunk, int32_t n_chunks, bool progress)
{
    int32_t *pos = malloc((size_t)chunk * sizeof *pos), *seq = malloc((size_t)chunk * sizeof *seq);
    int32_t *par = malloc((size_t)chunk * sizeof *par);
    uint8_t *want = calloc((size_t)chunk, 1);
    int rc = -1;
    if (!pos || !seq || !par || !want) {
        err_set("imatrix: out of memory");
        goto done;
    }
    want[chunk - 1] = 1; /* a forward returns at least one row; none is read */
    for (int32_t c = 0; c < n_chunks; c++) {
        const int32_t s = engine_seq_new(e);
        if (s < 0)
            goto done;
        for (int32_t i = 0; i < chunk; i++) {
            pos[i] = i;
            seq[i] = s;
            par[i] = i - 1;
        }
        const struct batch b = {chunk, toks + (int64_t)c * chunk, pos, seq, par, want};
        const int32_t got = engine_forward(e, &b, NULL, NULL);
        engine_seq_free(e, s);
        if (got < 0)
            goto done;
        if (progress)
            fprintf(stderr, "\rimatrix: chunk %d/%d", (int)c + 1, (int)n_chunks);
    }
    if (progress)
        fputc('\n', stderr);
    rc = 0;
done:
    free(pos);
    free(seq);
    free(par);
    free(want);
    return rc;
}

int cli_imatrix(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *out = "imatrix.gguf", *v;
    int64_t chunk = 512, chunks = 0, threads = 0;
    for (int i = 0; i < argc; i++) {
        int f;
        if ((f = cli_flag(argc, argv, &i, "-m|--model", &model)) || (f = cli_flag(argc, argv, &i, "--text", &text)) ||
            (f = cli_flag(argc, argv, &i, "--out", &out))) {
            if (f < 0)
                return 2;
            continue;
        }
        int64_t *dst = NULL;
        if ((f = cli_flag(argc, argv, &i, "--chunk", &v)))
            dst = &chunk;
        else if ((f = cli_flag(argc, argv, &i, "--chunks", &v)))
            dst = &chunks;
        else if ((f = cli_flag(argc, argv, &i, "-t|--threads", &v)))
            dst = &threads;
        else
            return cli_arg_reject(argv[i], imatrix_usage);
        if (f < 0 || (*dst = cli_int(v)) < 1 || *dst > INT32_MAX) {
            imatrix_usage(stderr);
            return 2;
        }
    }
    if (!model || !text) {
        fprintf(stderr, "kapitsa imatrix: --model and --text are required\n");
        imatrix_usage(stderr);
        return 2;
    }
    struct tok_ids ids = {0};
    struct imatrix im = {0};
    struct runtime rt = {0};
    struct engine e;
    bool engine = false;
    int rc = 1;
    const char *dir = cli_model_dir(model);
    if (!dir || read_tokens(dir, text, &ids) != 0)
        goto done;
    int64_t n_chunks = ids.n / chunk;
    if (n_chunks == 0) {
        err_set("imatrix: %s is %d tokens, fewer than one chunk of %lld", text, (int)ids.n, (long long)chunk);
        goto done;
    }
    if (chunks > 0 && chunks < n_chunks)
        n_chunks = chunks;
    const struct runtime_opts ro = {.device = "cpu", .threads = (int32_t)threads, .model = dir,
                                    .wrap = imatrix_collector_wrap};
    if (runtime_open(&rt, &ro) != 0)
        goto done;
    if (imatrix_collector_bind(rt.be, &rt.m, &im) != 0 ||
        engine_init(&e, &rt.m, (int32_t)chunk, 1, (int32_t)chunk, 1, 0, DT_F32) != 0)
        goto done;
    engine = true;
    fprintf(stderr, "imatrix: %s, %lld chunks of %lld tokens (of %d)\n", dir, (long long)n_chunks, (long long)chunk,
            (int)ids.n);
    if (run_chunks(&e, ids.ids, (int32_t)chunk, (int32_t)n_chunks, isatty(2)) != 0 ||
        imatrix_collector_status(rt.be) != 0 || imatrix_add_dataset(&im, text) != 0)
        goto done;
    im.chunk_count = (int32_t)n_chunks;
    im.chunk_size = (int32_t)chunk;
    if (imatrix_write(&im, out) != 0)
        goto done;
    fprintf(stderr, "kapitsa: wrote %s (%d entries)\n", out, (int)im.n);
    rc = 0;
done:
    if (rc)
        fprintf(stderr, "kapitsa: %s\n", err_msg());
    if (engine)
        engine_free(&e);
    runtime_close(&rt);
    imatrix_free(&im);
    tok_ids_free(&ids);
    return rc;
}
