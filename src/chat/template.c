/* template: chat template loading and rendering with transformers' variables
 * (see template.h). */
#include "template.h"

#include "../base/err.h"
#include "jinja.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct chat_template {
    struct jinja_tpl *tpl;
    json_t *tokens; /* special tokens as template variables */
    enum chat_format format;
};

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *nb = cap < (64u << 20) ? realloc(buf, cap *= 2) : NULL;
        if (!nb)
            free(buf);
        buf = nb;
    }
    fclose(f);
    if (buf) /* n < cap here; the tool-format probe reads it as a C string */
        buf[n] = 0;
    *len = n;
    return buf;
}

/* "<|im_end|>" or {"content": "<|im_end|>", ...} */
static json_t *token_str(json_t *v)
{
    if (json_is_string(v))
        return json_incref(v);
    json_t *c = json_object_get(v, "content");
    return json_is_string(c) ? json_incref(c) : NULL;
}

/* A template parsed from src[0..len) with cfg's special tokens (cfg may be
 * NULL: none); what names the source in errors. */
static struct chat_template *template_new(json_t *cfg, const char *src, size_t len, const char *what)
{
    struct chat_template *ct = calloc(1, sizeof *ct);
    if (!ct) {
        err_set("template: out of memory");
        return NULL;
    }
    ct->tokens = json_object();
    static const char *const names[] = {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
                                        "mask_token"};
    for (size_t i = 0; cfg && i < sizeof names / sizeof names[0]; i++) {
        json_t *t = token_str(json_object_get(cfg, names[i]));
        if (t)
            json_object_set_new(ct->tokens, names[i], t);
    }
    json_t *extra = cfg ? json_object_get(cfg, "additional_special_tokens") : NULL;
    if (json_is_array(extra))
        json_object_set(ct->tokens, "additional_special_tokens", extra);
    ct->format = strstr(src, "<function=") ? CHAT_FMT_XML : strstr(src, "<TOOLCALL>") ? CHAT_FMT_TOOLCALL : CHAT_FMT_JSON;
    ct->tpl = jinja_parse(src, len);
    if (!ct->tpl) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s", err_msg());
        err_set("template: %s: %s", what, msg);
        chat_template_free(ct);
        return NULL;
    }
    return ct;
}

/* cfg's "chat_template": a string, or the "default" of a list of named
 * templates; NULL when there is none. */
static json_t *config_template(json_t *cfg)
{
    json_t *tpl = json_object_get(cfg, "chat_template");
    if (json_is_array(tpl)) {
        size_t i;
        json_t *e, *found = NULL;
        json_array_foreach(tpl, i, e) if (json_is_string(json_object_get(e, "name")) &&
                                          strcmp(json_string_value(json_object_get(e, "name")), "default") == 0)
            found = json_object_get(e, "template");
        tpl = found;
    }
    return json_is_string(tpl) ? tpl : NULL;
}

struct chat_template *chat_template_from_config(json_t *cfg, const char *what)
{
    json_t *tpl = config_template(cfg);
    if (!tpl) {
        err_set("template: %s has no chat_template", what);
        return NULL;
    }
    return template_new(cfg, json_string_value(tpl), json_string_length(tpl), what);
}

struct chat_template *chat_template_load(const char *dir, const char *file)
{
    char path[4096];
    json_error_t je;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_t *cfg = dir ? json_load_file(path, 0, &je) : NULL;
    if (dir && !cfg && !file) {
        err_set("template: %s: %s", path, je.text);
        return NULL;
    }
    struct chat_template *ct = NULL;
    if (!file && config_template(cfg)) {
        ct = chat_template_from_config(cfg, path);
    } else {
        const char *what = file;
        if (!file) {
            snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
            what = path;
        }
        size_t len = 0;
        char *src = read_file(what, &len);
        if (!src && file)
            err_set("template: cannot read %s", file);
        else if (!src)
            err_set("template: %s/tokenizer_config.json has no chat_template and there is no %s", dir, path);
        else
            ct = template_new(cfg, src, len, what);
        free(src);
    }
    json_decref(cfg);
    return ct;
}

void chat_template_free(struct chat_template *ct)
{
    if (!ct)
        return;
    jinja_free(ct->tpl);
    json_decref(ct->tokens);
    free(ct);
}

char *chat_template_render(const struct chat_template *ct, json_t *messages, json_t *tools, bool add_generation_prompt,
                           json_t *kwargs, size_t *len)
{
    json_t *ctx = json_deep_copy(ct->tokens);
    json_object_set(ctx, "messages", messages);
    json_object_set(ctx, "tools", tools ? tools : json_null());
    json_object_set_new(ctx, "documents", json_null());
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt));
    if (json_is_object(kwargs))
        json_object_update(ctx, kwargs);
    char *out = jinja_render(ct->tpl, ctx, len);
    json_decref(ctx);
    return out;
}

enum chat_format chat_template_tool_format(const struct chat_template *ct) { return ct->format; }

json_t *chat_content_text(json_t *content)
{
    if (json_is_string(content))
        return json_incref(content);
    size_t i, n = 0;
    json_t *part;
    char *text = NULL;
    json_array_foreach(content, i, part) {
        json_t *t = json_object_get(part, "text");
        if (!json_is_string(t))
            continue;
        char *nt = realloc(text, n + json_string_length(t) + 1);
        if (!nt)
            break;
        text = nt;
        memcpy(text + n, json_string_value(t), json_string_length(t));
        n += json_string_length(t);
    }
    json_t *r = json_stringn(text ? text : "", n);
    free(text);
    return r;
}

json_t *chat_messages_from_openai(json_t *messages)
{
    json_t *m = json_deep_copy(messages);
    size_t i, j;
    json_t *msg, *call;
    json_array_foreach(m, i, msg) {
        json_t *content = json_object_get(msg, "content");
        if (json_is_null(content)) { /* an assistant turn with only tool calls */
            json_object_set_new(msg, "content", json_string(""));
        } else if (json_is_array(content)) { /* content parts: the text ones, joined */
            json_object_set_new(msg, "content", chat_content_text(content));
        }
        json_array_foreach(json_object_get(msg, "tool_calls"), j, call) {
            json_t *fn = json_object_get(call, "function");
            json_t *args = json_object_get(fn, "arguments");
            if (!json_is_string(args))
                continue;
            json_t *parsed = json_loads(json_string_value(args), JSON_DECODE_ANY, NULL);
            if (json_is_object(parsed))
                json_object_set_new(fn, "arguments", parsed);
            else
                json_decref(parsed);
        }
    }
    return m;
}
