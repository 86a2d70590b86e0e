/* spec_opts: the speculative-decoding flags run, chat, serve and bench share:
 * --draft DIR, --spec off|chain|tree|lookup, --spec-tree N,D; and the cache of
 * the tree shape the tuner chose, per machine and model pair. */
#define _XOPEN_SOURCE 700
#include "../base/err.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* The tuning cache: $KAPITSA_CACHE, else $XDG_CACHE_HOME/kapitsa, else
 * ~/.cache/kapitsa; one line per key: key TAB nodes TAB depth TAB tokens/s. */
static int tune_path(char *path, size_t n)
{
    const char *d = getenv("KAPITSA_CACHE"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    char dir[3000];
    if (d && *d)
        snprintf(dir, sizeof dir, "%s", d);
    else if (x && *x)
        snprintf(dir, sizeof dir, "%s/kapitsa", x);
    else if (h && *h)
        snprintf(dir, sizeof dir, "%s/.cache/kapitsa", h);
    else
        return -1;
    snprintf(path, n, "%s/kflash.tsv", dir);
    return 0;
}

void cli_spec_tune_load(struct spec_tuner *t, const struct spec_params *p, const char *key)
{
    char path[3100], line[4096];
    if (!t || !p->tune || tune_path(path, sizeof path) != 0)
        return;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        char *tab = strchr(line, '\t');
        int nodes, depth;
        double tps;
        if (!tab || (size_t)(tab - line) != strlen(key) || strncmp(line, key, strlen(key)) != 0 ||
            sscanf(tab + 1, "%d\t%d\t%lf", &nodes, &depth, &tps) != 3)
            continue;
        for (int32_t i = 0; i < t->n_shape; i++)
            if (t->nodes[i] == nodes && t->depth[i] == depth) {
                /* start from the cached best; the others are re-tried as the tuner goes */
                for (int32_t j = 0; j < t->n_shape; j++)
                    t->tries[j] = 4;
                t->tok_s[i] = tps;
            }
    }
    fclose(f);
}

void cli_spec_tune_save(const struct spec_tuner *t, const struct spec_params *p, const char *key)
{
    char path[3100], tmp[3200], line[4096];
    if (!t || !p->tune || t->step < 8 || tune_path(path, sizeof path) != 0)
        return;
    int32_t b = 0; /* the fastest shape (spec_tuned_shape) */
    for (int32_t i = 1; i < t->n_shape; i++)
        if (t->tok_s[i] > t->tok_s[b])
            b = i;
    const int32_t nodes = t->nodes[b], depth = t->depth[b];
    double best = 0;
    for (int32_t i = 0; i < t->n_shape; i++)
        if (t->nodes[i] == nodes && t->depth[i] == depth)
            best = t->tok_s[i];
    char dir[3100];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = 0;
    char *slash = dir;
    while ((slash = strchr(slash + 1, '/'))) { /* mkdir -p */
        *slash = 0;
        mkdir(dir, 0755);
        *slash = '/';
    }
    mkdir(dir, 0755);
    snprintf(tmp, sizeof tmp, "%s.%d", path, (int)getpid());
    FILE *in = fopen(path, "r"), *out = fopen(tmp, "w");
    if (!out) {
        if (in)
            fclose(in);
        return;
    }
    while (in && fgets(line, sizeof line, in)) /* other keys stay */
        if (!(strncmp(line, key, strlen(key)) == 0 && line[strlen(key)] == '\t'))
            fputs(line, out);
    if (in)
        fclose(in);
    fprintf(out, "%s\t%d\t%d\t%.3f\n", key, nodes, depth, best);
    if (fclose(out) == 0)
        rename(tmp, path);
    else
        remove(tmp);
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
