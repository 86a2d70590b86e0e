/* kapitsa show: what a model is without loading it onto a device: its
 * architecture, parameter count, the types its tensors are stored in (a GGUF's
 * quantisation, tensor by tensor), its context, whether it has a chat
 * template, its files, and the draft the catalog pairs it with. The headers
 * are read; the weights are mapped and never touched. */
#define _GNU_SOURCE
#include "../base/err.h"
#include "../base/path.h"
#include "../hub/catalog.h"
#include "../model/config.h"
#include "../model/gguf.h"
#include "../model/gguf_hf.h"
#include "../model/safetensors.h"
#include "../runtime/runtime.h"
#include "cli.h"

#include <dirent.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void show_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa show [MODEL] [--json]\n"
               "  MODEL: a folder, a .gguf file, a catalog name or a hub id (default: the embedded kapitsa-tiny);\n"
               "  -m|--model MODEL names it too\n");
}

/* The tensor count of each storage type, in a JSON object {type: count}. */
static void show_count_type(json_t *types, enum dtype t)
{
    const char *name = dtype_name(t);
    json_object_set_new(types, name, json_integer(json_integer_value(json_object_get(types, name)) + 1));
}

/* A file of the model: {name, bytes} into files. */
static void show_file(json_t *files, const char *path)
{
    struct stat sb;
    const char *slash = strrchr(path, '/');
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
        json_array_append_new(files, json_pack("{s:s,s:I}", "name", slash ? slash + 1 : path, "bytes",
                                               (json_int_t)sb.st_size));
}

/* A folder's config, tensors and files into r; 0, or -1 with err_set(). */
static int show_folder(const char *dir, struct model_config *c, json_t *r)
{
    struct safetensors st = {0};
    if (config_load(c, dir) != 0 || st_open_dir(&st, dir) != 0) {
        st_close(&st);
        return -1;
    }
    json_t *types = json_object_get(r, "dtypes"), *files = json_object_get(r, "files");
    int64_t params = 0;
    for (int32_t i = 0; i < st.n_tensors; i++) {
        int64_t n = 1;
        for (int32_t d = 0; d < st.tensors[i].n_dim; d++)
            n *= st.tensors[i].shape[d];
        params += n;
        show_count_type(types, st.tensors[i].type);
    }
    st_close(&st);
    json_object_set_new(r, "format", json_string("safetensors"));
    json_object_set_new(r, "parameters", json_integer(params));
    struct dirent **names = NULL;
    const int n = scandir(dir, &names, NULL, alphasort);
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX + 256];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        if (names[i]->d_name[0] != '.')
            show_file(files, path);
        free(names[i]);
    }
    free(names);
    return 0;
}

/* A GGUF's config, tensors and files into r; 0, or -1 with err_set(). */
static int show_gguf(const char *path, struct model_config *c, json_t *r)
{
    struct gguf g = {0};
    json_t *cfg = NULL, *gen = NULL;
    int rc = -1;
    if (gguf_open(&g, path) != 0 || !(cfg = gguf_hf_config(&g)) || !(gen = gguf_hf_generation(&g)) ||
        config_parse(c, cfg, path, gen, path) != 0)
        goto fail;
    json_t *types = json_object_get(r, "dtypes"), *files = json_object_get(r, "files");
    int64_t params = 0;
    for (int64_t i = 0; i < g.n_tensors; i++) {
        int64_t n = 1;
        for (int32_t k = 0; k < g.tensors[i].n_dim; k++)
            n *= g.tensors[i].ne[k];
        params += n;
        show_count_type(types, g.tensors[i].type);
    }
    for (int32_t i = 0; i < g.n_files; i++)
        show_file(files, g.files[i].path);
    json_object_set_new(r, "format", json_string("gguf"));
    json_object_set_new(r, "parameters", json_integer(params));
    rc = 0;
fail:
    json_decref(cfg);
    json_decref(gen);
    gguf_close(&g);
    return rc;
}

/* The draft the catalog pairs with ref (a catalog name or hub id), or the
 * embedded model's own; NULL when there is none. */
static char *show_draft(const char *ref, const char *path)
{
    char tiny[PATH_MAX + 64], a[PATH_MAX], b[PATH_MAX];
    if (path_data("kapitsa-tiny", tiny, sizeof tiny) == 0 && realpath(tiny, a) && realpath(path, b) &&
        strcmp(a, b) == 0)
        return strdup("kapitsa-tiny-draft");
    struct catalog cat;
    char *draft = NULL;
    if (ref && catalog_load(&cat, NULL) == 0) {
        const struct catalog_model *m = catalog_find(&cat, ref);
        if (m && m->draft)
            draft = strdup(m->draft);
        catalog_free(&cat);
    }
    err_clear();
    return draft;
}

/* The model's report as a JSON object; NULL with err_set(). */
static json_t *show_model(const char *ref)
{
    const char *path = cli_model_dir(ref);
    if (!path)
        return NULL;
    struct model_config c;
    char real[PATH_MAX];
    const char *slash = strrchr(path, '/');
    /* every key in the order the report reads; the readers below fill them */
    json_t *r = json_pack("{s:s,s:s,s:n,s:n,s:n,s:{},s:n,s:n,s:n,s:[]}", "model", ref ? ref : slash ? slash + 1 : path,
                          "path", realpath(path, real) ? real : path, "format", "architecture", "parameters", "dtypes",
                          "context", "chat_template", "draft", "files");
    if (!r || (gguf_hf_is_gguf(path) ? show_gguf(path, &c, r) : show_folder(path, &c, r)) != 0) {
        json_decref(r);
        return NULL;
    }
    json_t *arch = json_pack("{s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "model_type", c.model_type, "layers",
                             c.n_layer, "attention_layers", c.n_attn_layer, "recurrent_layers", c.n_rec_layer,
                             "hidden_size", c.hidden_size, "heads", c.n_head, "kv_heads", c.n_kv_head, "head_dim",
                             c.head_dim, "vocab_size", c.vocab_size);
    if (c.n_expert > 0) {
        json_object_set_new(arch, "experts", json_integer(c.n_expert));
        json_object_set_new(arch, "experts_per_token", json_integer(c.n_expert_used));
    }
    json_object_set_new(r, "architecture", arch);
    json_object_set_new(r, "context", json_integer(c.max_position));
    struct chat_template *ct = runtime_template(path, NULL);
    json_object_set_new(r, "chat_template", json_boolean(ct != NULL));
    chat_template_free(ct);
    err_clear();
    char *draft = show_draft(ref, path);
    json_object_set_new(r, "draft", draft ? json_string(draft) : json_null());
    free(draft);
    return r;
}

/* n as people say it: 10.3M, 0.60B. */
static void show_count(char *out, size_t n, int64_t v)
{
    if (v >= 1000000000)
        snprintf(out, n, "%.2fB", (double)v / 1e9);
    else if (v >= 1000000)
        snprintf(out, n, "%.1fM", (double)v / 1e6);
    else
        snprintf(out, n, "%lld", (long long)v);
}

static void show_print(const json_t *r)
{
    const json_t *a = json_object_get(r, "architecture"), *v;
    const char *k;
    char num[32];
    printf("model          %s\n", json_string_value(json_object_get(r, "model")));
    printf("path           %s (%s)\n", json_string_value(json_object_get(r, "path")),
           json_string_value(json_object_get(r, "format")));
    printf("architecture   %s: %d layers", json_string_value(json_object_get(a, "model_type")),
           (int)json_integer_value(json_object_get(a, "layers")));
    const json_int_t n_attn = json_integer_value(json_object_get(a, "attention_layers")),
                     n_rec = json_integer_value(json_object_get(a, "recurrent_layers"));
    if (n_rec > 0)
        printf(" (%d attention, %d recurrent)", (int)n_attn, (int)n_rec);
    printf(", hidden %d, %d heads / %d KV heads, head_dim %d", (int)json_integer_value(json_object_get(a, "hidden_size")),
           (int)json_integer_value(json_object_get(a, "heads")), (int)json_integer_value(json_object_get(a, "kv_heads")),
           (int)json_integer_value(json_object_get(a, "head_dim")));
    if ((v = json_object_get(a, "experts")))
        printf(", %d experts (%d a token)", (int)json_integer_value(v),
               (int)json_integer_value(json_object_get(a, "experts_per_token")));
    printf(", vocabulary %d\n", (int)json_integer_value(json_object_get(a, "vocab_size")));
    show_count(num, sizeof num, json_integer_value(json_object_get(r, "parameters")));
    printf("parameters     %s (%lld)\n", num, (long long)json_integer_value(json_object_get(r, "parameters")));
    printf("weights        ");
    const char *sep = "";
    json_object_foreach((json_t *)json_object_get(r, "dtypes"), k, v) {
        printf("%s%s %d tensors", sep, k, (int)json_integer_value(v));
        sep = ", ";
    }
    printf("\ncontext        %lld tokens (max_position_embeddings)\n",
           (long long)json_integer_value(json_object_get(r, "context")));
    printf("chat template  %s\n", json_is_true(json_object_get(r, "chat_template")) ? "yes" : "none (run --chat and serve need one)");
    const json_t *d = json_object_get(r, "draft");
    printf("draft          %s\n", json_is_string(d) ? json_string_value(d) : "none known");
    printf("files\n");
    size_t i;
    json_array_foreach((json_t *)json_object_get(r, "files"), i, v) {
        const double bytes = (double)json_integer_value(json_object_get(v, "bytes"));
        printf("  %-40s %10.1f %s\n", json_string_value(json_object_get(v, "name")),
               bytes < 1e6 ? bytes / 1e3 : bytes / 1e6, bytes < 1e6 ? "KB" : "MB");
    }
}

int cli_show(int argc, char **argv)
{
    const char *ref = NULL;
    int json = 0;
    for (int i = 0; i < argc; i++) {
        int f;
        if (cli_switch(argv[i], "--json")) {
            json = 1;
            continue;
        }
        if ((f = cli_flag(argc, argv, &i, "-m|--model", &ref)) != 0) {
            if (f < 0)
                return 2;
            continue;
        }
        const enum cli_arg a = cli_arg(argv[i]);
        if (a != CLI_ARG_POSITIONAL)
            return cli_arg_exit(a, show_usage);
        if (ref)
            return cli_arg_reject(argv[i], show_usage);
        ref = argv[i];
    }
    json_t *r = show_model(ref);
    if (!r) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        return 1;
    }
    if (json) {
        json_dumpf(r, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        putchar('\n');
    } else {
        show_print(r);
    }
    json_decref(r);
    return 0;
}
