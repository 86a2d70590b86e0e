/* spec_opts: the speculative-decoding flags run, chat, serve and bench share:
 * --draft DIR, --spec off|chain|tree|lookup, --spec-tree N,D; and the cache of
 * the tree shape the tuner chose, per machine and model pair. */
#define _XOPEN_SOURCE 700
#include "../base/err.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cli_spec_flag(int argc, char **argv, int *i, struct cli_spec *o)
{
    const char *v;
    int f;
    if ((f = cli_flag(argc, argv, i, "--draft", &o->draft)) != 0)
        return f;
    if ((f = cli_flag(argc, argv, i, "--spec", &v)) != 0) {
        if (f < 0)
            return -1;
        static const char *const names[] = {"off", "chain", "tree", "lookup"};
        for (int k = 0; k < 4; k++)
            if (strcmp(v, names[k]) == 0) {
                o->mode = k;
                o->mode_given = 1;
                return 1;
            }
        fprintf(stderr, "kapitsa: --spec takes off, chain, tree or lookup\n");
        return -1;
    }
    if ((f = cli_flag(argc, argv, i, "--spec-tree", &v)) != 0) {
        int n, d;
        if (f < 0 || sscanf(v, "%d,%d", &n, &d) != 2 || n < 1 || d < 1 || n > SPEC_MAX_NODES || d > SPEC_MAX_DEPTH) {
            fprintf(stderr, "kapitsa: --spec-tree needs N,D with N <= %d, D <= %d\n", SPEC_MAX_NODES, SPEC_MAX_DEPTH);
            return -1;
        }
        o->n_nodes = n;
        o->depth = d;
        return 1;
    }
    return 0;
}

int cli_spec_params(const struct cli_spec *o, struct spec_params *p, const char **draft)
{
    *p = spec_defaults();
    if (o->n_nodes) {
        p->n_nodes = o->n_nodes;
        p->depth = o->depth;
    }
    int mode = o->mode_given ? o->mode : o->draft ? 2 : 0;
    *draft = mode == 1 || mode == 2 ? o->draft : NULL;
    if (*draft && !(*draft = cli_model_dir(*draft)))
        return -1;
    if ((mode == 1 || mode == 2) && !o->draft)
        return err_set("--spec %s needs --draft DIR (a small model with the same tokenizer)",
                       mode == 1 ? "chain" : "tree");
    p->mode = mode == 0 ? SPEC_OFF : mode == 1 ? SPEC_CHAIN : SPEC_TREE;
    p->tune = mode == 2 && !o->n_nodes; /* a fixed --spec-tree is not tuned */
    if (mode == 1)
        p->ngram = false;
    return 0;
}

int cli_spec_tune_path(char *path, size_t n)
{
    const char *d = getenv("KAPITSA_CACHE"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (d && *d)
        snprintf(path, n, "%s/kflash.tsv", d);
    else if (x && *x)
        snprintf(path, n, "%s/kapitsa/kflash.tsv", x);
    else if (h && *h)
        snprintf(path, n, "%s/.cache/kapitsa/kflash.tsv", h);
    else
        return -1;
    return 0;
}

void cli_spec_key(char *key, size_t n, const char *model, const char *draft, int32_t threads)
{
    char host[256] = "?", a[4096], b[4096];
    gethostname(host, sizeof host - 1);
    if (!realpath(model, a))
        snprintf(a, sizeof a, "%s", model);
    if (!draft)
        snprintf(b, sizeof b, "-");
    else if (!realpath(draft, b))
        snprintf(b, sizeof b, "%s", draft);
    snprintf(key, n, "%s|%s|%s|%d", host, a, b, threads);
}
