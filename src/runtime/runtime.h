/* runtime: everything a served model needs, opened from one source and
 * closed together: the device's backend, the model, its tokenizer and chat
 * template, and an optional draft model for KFlash.
 *
 * A source is a model folder (transformers' config.json, safetensors,
 * tokenizer.json, tokenizer_config.json) or a GGUF file, which holds all of
 * them (src/model/gguf_hf.h, gguf_vocab.h); the command line resolves
 * catalog names and hub ids to one of those first (hub_model_dir). This is
 * the one place that knows what a source holds: the server and every
 * command open models through it.
 *
 * Ownership: struct runtime owns everything it opened; runtime_close frees
 * it all (also after a failed runtime_open). The tokenizer and template
 * returned alone are the caller's (tok_free, chat_template_free). */
#ifndef KP_RUNTIME_H
#define KP_RUNTIME_H

#include "../chat/template.h"
#include "../model/model.h"
#include "../tokenizer/tokenizer.h"

#include <stdbool.h>
#include <stdint.h>

struct runtime_opts {
    const char *device;  /* cpu, cuda, cuda:N (device_open) */
    int32_t threads;     /* cpu threads; <= 0: one a core */
    bool precise;        /* a GPU's fp32-level products (kapitsa check) */
    const char *model;   /* the source; NULL: the backend alone (kapitsa check loads its own) */
    const char *draft;   /* a draft model's source, or NULL */
    bool tokenizer;      /* open the tokenizer */
    bool chat_template;  /* open the chat template */
    /* a backend that wraps the device's and takes it over (freeing it on
     * failure, NULL with err_set()), loading the model through itself:
     * imatrix's collector; NULL: the device's as it is */
    struct backend *(*wrap)(struct backend *inner);
    /* the model's and the draft's loads as they go (model_opts.progress); NULL: none */
    void (*progress)(void *ctx, const char *source, int64_t done, int64_t total);
    void *progress_ctx;
};

struct runtime {
    struct backend *be;
    struct model m, dm;       /* the model; the draft when d_loaded */
    bool loaded, d_loaded;
    struct tokenizer *tok;    /* NULL unless asked for */
    struct chat_template *ct; /* NULL unless asked for */
};

/* 0 with everything o asks for open; -1 with err_set() naming the source and
 * what is wrong (call runtime_close either way). */
int runtime_open(struct runtime *rt, const struct runtime_opts *o);
void runtime_close(struct runtime *rt);

/* A source's tokenizer / chat template alone (tokenize, render, bench):
 * NULL with err_set(). file: a template file to use instead, or NULL. */
struct tokenizer *runtime_tokenizer(const char *source);
struct chat_template *runtime_template(const char *source, const char *file);

#endif
