/* kapitsa quantize: a checkpoint (folder, hub id, catalog name or GGUF) to a
 * GGUF file by a recipe (src/model/convert.h). */
#include "../base/err.h"
#include "../model/convert.h"
#include "../model/imatrix.h"
#include "cli.h"
#include "progress.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* convert_opts.progress: begun at the first tensor, once the total is known. */
static void quantize_progress(void *ctx, int64_t done, int64_t total, const char *tensor)
{
    struct progress *p = ctx;
    if (!p->open)
        progress_begin(p, stderr, "quantize", total, "B");
    progress_update(p, done, tensor);
    if (done >= total)
        progress_end(p);
}

static void quantize_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa quantize SRC OUT.gguf --recipe NAME | --type TYPE [--imatrix FILE]\n"
               "  SRC      a model folder, catalog name, hub id already pulled, or a .gguf file\n"
               "  --recipe");
    for (int i = 0; convert_recipes[i]; i++)
        fprintf(f, " %s", convert_recipes[i]);
    fprintf(f, "\n           (Q2_MOE: a MoE model's routed experts at 2-3 bits, the rest at 5-8)\n"
               "  --type   every matrix in one type: Q8_0 Q6_K Q5_K Q4_K Q3_K Q2_K Q5_0 Q5_1 Q4_0 Q4_1 IQ4_NL "
               "IQ4_XS IQ2_XXS F16 BF16 F32\n"
               "  --imatrix an importance matrix (kapitsa imatrix, or llama-imatrix's .gguf or .dat) that\n"
               "           weighs each column's error in the K-quant and IQ4 scale searches\n");
}

int cli_quantize(int argc, char **argv)
{
    const char *src = NULL, *out = NULL, *recipe = NULL, *imatrix = NULL;
    for (int i = 0; i < argc; i++) {
        const char *v;
        int f = cli_flag(argc, argv, &i, "--recipe", &v);
        if (f == 0)
            f = cli_flag(argc, argv, &i, "--type", &v);
        const int g = f == 0 ? cli_flag(argc, argv, &i, "--imatrix", &imatrix) : 0;
        enum cli_arg a = f || g ? CLI_ARG_POSITIONAL : cli_arg(argv[i]);
        if (f < 0 || g < 0) {
            quantize_usage(stderr);
            return 2;
        }
        if (f) {
            recipe = v;
        } else if (g) {
            continue;
        } else if (a != CLI_ARG_POSITIONAL) {
            return cli_arg_exit(a, quantize_usage);
        } else if (!src) {
            src = argv[i];
        } else if (!out) {
            out = argv[i];
        } else {
            quantize_usage(stderr);
            return 2;
        }
    }
    if (!src || !out || !recipe) {
        quantize_usage(stderr);
        return 2;
    }
    const char *dir = cli_model_dir(src);
    struct imatrix im = {0};
    struct progress pr = {0};
    struct convert_opts o = {recipe, imatrix ? &im : NULL, quantize_progress, &pr};
    const int rc = !dir || (imatrix && imatrix_read(&im, imatrix) != 0) || convert_write(dir, out, &o) != 0;
    imatrix_free(&im);
    if (rc && pr.open && pr.tty)
        fputc('\n', stderr); /* the failure's message below the progress line */
    if (rc) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        return 1;
    }
    fprintf(stderr, "kapitsa: wrote %s\n", out);
    return 0;
}
