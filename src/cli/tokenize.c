/* kapitsa tokenize / detokenize: the tokenizer from the command line, for
 * debugging prompts (src/tokenizer). */
#include "../base/err.h"
#include "../runtime/runtime.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads all of stdin into a new buffer. */
static char *read_stdin(size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, stdin);
        n += r;
        if (r == 0)
            break;
        if (n == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb)
                free(buf);
            buf = nb;
        }
    }
    *len = n;
    return buf;
}

static void print_json_str(const char *s, size_t n)
{
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void tokenize_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa tokenize -m|--model DIR [--ids|--pieces] TEXT   (TEXT '-' reads stdin)\n");
}

static void detokenize_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa detokenize -m|--model DIR ID...\n");
}

int cli_tokenize(int argc, char **argv)
{
    const char *dir = NULL, *text = NULL;
    int ids_only = 0, pieces = 0;
    for (int i = 0; i < argc; i++) {
        int f = cli_flag(argc, argv, &i, "-m|--model", &dir);
        enum cli_arg a;
        if (f < 0)
            return 2;
        if (f)
            continue;
        if (cli_switch(argv[i], "--ids"))
            ids_only = 1;
        else if (cli_switch(argv[i], "--pieces"))
            pieces = 1;
        else if ((a = cli_arg(argv[i])) != CLI_ARG_POSITIONAL)
            return cli_arg_exit(a, tokenize_usage);
        else if (!text)
            text = argv[i];
        else
            return tokenize_usage(stderr), 2;
    }
    if (!dir || !text)
        return tokenize_usage(stderr), 2;
    struct tokenizer *t = runtime_tokenizer(dir);
    if (!t) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        return 1;
    }
    size_t len;
    char *owned = NULL;
    if (strcmp(text, "-") == 0) {
        owned = read_stdin(&len);
        text = owned ? owned : "";
    } else {
        len = strlen(text);
    }
    struct tok_ids ids = {0};
    int rc = tok_encode(t, text, len, &ids);
    if (rc != 0) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
    } else if (ids_only) {
        putchar('[');
        for (int32_t i = 0; i < ids.n; i++)
            printf(i ? ", %d" : "%d", ids.ids[i]);
        printf("]\n");
    } else {
        for (int32_t i = 0; i < ids.n; i++) {
            printf("%d\t", ids.ids[i]);
            if (pieces) {
                const char *p = tok_piece(t, ids.ids[i]);
                print_json_str(p, strlen(p));
            } else {
                size_t n;
                char *s = tok_decode(t, &ids.ids[i], 1, false, &n);
                print_json_str(s, n);
                free(s);
            }
            putchar('\n');
        }
    }
    tok_ids_free(&ids);
    free(owned);
    tok_free(t);
    return rc ? 1 : 0;
}

int cli_detokenize(int argc, char **argv)
{
    const char *dir = NULL;
    int32_t *ids = calloc((size_t)argc + 1, sizeof *ids), n = 0;
    for (int i = 0; i < argc; i++) {
        int f = cli_flag(argc, argv, &i, "-m|--model", &dir);
        enum cli_arg a = f ? CLI_ARG_POSITIONAL : cli_arg(argv[i]);
        if (f < 0 || a != CLI_ARG_POSITIONAL) {
            free(ids);
            return f < 0 ? 2 : cli_arg_exit(a, detokenize_usage);
        }
        if (f)
            continue;
        char *end;
        long v = strtol(argv[i], &end, 10);
        if (!*argv[i] || *end || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "kapitsa detokenize: '%s' is not a token id\n", argv[i]);
            free(ids);
            return 2;
        }
        ids[n++] = (int32_t)v;
    }
    if (!dir) {
        detokenize_usage(stderr);
        free(ids);
        return 2;
    }
    struct tokenizer *t = runtime_tokenizer(dir);
    size_t len = 0;
    char *s = t ? tok_decode(t, ids, n, false, &len) : NULL;
    int rc = s ? 0 : 1;
    if (s) {
        fwrite(s, 1, len, stdout);
        putchar('\n');
    } else {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
    }
    free(s);
    free(ids);
    tok_free(t);
    return rc;
}
