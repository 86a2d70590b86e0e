/* runtime: opening a served model's parts from its source (see runtime.h). */
#include "runtime.h"

#include "../backend/device.h"
#include "../base/err.h"
#include "../model/gguf_hf.h"
#include "../model/gguf_vocab.h"

#include <string.h>

struct tokenizer *runtime_tokenizer(const char *source)
{
    if (!gguf_hf_is_gguf(source))
        return tok_load(source);
    struct gguf g;
    if (gguf_open(&g, source) != 0)
        return NULL;
    json_t *j = gguf_vocab_tokenizer_json(&g);
    struct tokenizer *t = j ? tok_load_json(j, source) : NULL;
    json_decref(j);
    gguf_close(&g);
    return t;
}

struct chat_template *runtime_template(const char *source, const char *file)
{
    if (!gguf_hf_is_gguf(source))
        return chat_template_load(source, file);
    if (file)
        return chat_template_load(NULL, file);
    struct gguf g;
    if (gguf_open(&g, source) != 0)
        return NULL;
    json_t *j = gguf_vocab_tokenizer_config(&g);
    struct chat_template *ct = j ? chat_template_from_config(j, source) : NULL;
    json_decref(j);
    gguf_close(&g);
    return ct;
}

int runtime_open(struct runtime *rt, const struct runtime_opts *o)
{
    memset(rt, 0, sizeof *rt);
    if (!(rt->be = device_open(o->device, o->threads, o->precise)) || (o->wrap && !(rt->be = o->wrap(rt->be))))
        return -1;
    if (!o->model)
        return 0;
    if (o->tokenizer && !(rt->tok = runtime_tokenizer(o->model)))
        return -1;
    if (o->chat_template && !(rt->ct = runtime_template(o->model, NULL)))
        return -1;
    const struct model_opts mo = {.progress = o->progress, .progress_ctx = o->progress_ctx};
    if (model_load(&rt->m, o->model, rt->be, &mo) != 0)
        return -1;
    rt->loaded = true;
    if (o->draft && model_load(&rt->dm, o->draft, rt->be, &mo) != 0)
        return -1;
    rt->d_loaded = o->draft != NULL;
    return 0;
}

void runtime_close(struct runtime *rt)
{
    if (rt->d_loaded)
        model_free(&rt->dm);
    if (rt->loaded)
        model_free(&rt->m);
    chat_template_free(rt->ct);
    tok_free(rt->tok);
    if (rt->be)
        rt->be->ops->free(rt->be);
    memset(rt, 0, sizeof *rt);
}
