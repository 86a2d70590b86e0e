/* parser: streaming split of model output into text, reasoning and tool calls
 * (see parser.h). A small state machine over a byte buffer: TEXT, REASONING,
 * TOOL (inside a tool-call tag, buffered until it closes). Whitespace at the
 * edges of each segment is held until something else follows, so that stray
 * newlines around tags never reach the client and byte-at-a-time feeding
 * produces the same text as one feed. */
#define _GNU_SOURCE
#include "parser.h"

#include "../base/err.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

enum pstate { P_TEXT, P_REASONING, P_TOOL };

struct buf {
    char *p;
    size_t n, cap;
};

struct chat_parser {
    enum chat_format fmt;
    json_t *tools;
    chat_event_fn fn;
    void *ctx;
    enum pstate st;
    struct buf in;      /* bytes not yet decided */
    struct buf ws;      /* trailing whitespace of the current text/reasoning segment, held */
    struct buf tool;    /* body of the open tool call */
    bool skip_ws;       /* drop whitespace at the start of the segment */
    bool seen_text;     /* non-whitespace answer text was emitted (then <think> is just text) */
    int32_t n_calls;
    const char *open, *close;
};

static int buf_add(struct buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->n + n + 1)
            nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np)
            return err_set("parser: out of memory");
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

static void buf_drop(struct buf *b, size_t n)
{
    memmove(b->p, b->p + n, b->n - n);
    b->n -= n;
    if (b->p)
        b->p[b->n] = 0;
}

struct chat_parser *chat_parser_new(enum chat_format fmt, bool in_reasoning, json_t *tools, chat_event_fn fn,
                                    void *ctx)
{
    struct chat_parser *p = calloc(1, sizeof *p);
    if (!p) {
        err_set("parser: out of memory");
        return NULL;
    }
    p->fmt = fmt;
    p->tools = tools ? json_incref(tools) : NULL;
    p->fn = fn;
    p->ctx = ctx;
    p->st = in_reasoning ? P_REASONING : P_TEXT;
    p->skip_ws = true;
    p->open = fmt == CHAT_FMT_TOOLCALL ? "<TOOLCALL>" : "<tool_call>";
    p->close = fmt == CHAT_FMT_TOOLCALL ? "</TOOLCALL>" : "</tool_call>";
    return p;
}

void chat_parser_free(struct chat_parser *p)
{
    if (!p)
        return;
    json_decref(p->tools);
    free(p->in.p);
    free(p->ws.p);
    free(p->tool.p);
    free(p);
}

int32_t chat_parser_n_tool_calls(const struct chat_parser *p) { return p->n_calls; }

static void emit(struct chat_parser *p, enum chat_event_kind k, const char *s, size_t n)
{
    struct chat_event ev = {k, s, n, p->n_calls, NULL};
    if (n || k >= CHAT_EV_TOOL_START)
        p->fn(p->ctx, &ev);
}

/* Text or reasoning bytes of the current segment: leading whitespace dropped
 * when skip_ws, trailing whitespace held in p->ws. */
static int emit_segment(struct chat_parser *p, const char *s, size_t n)
{
    enum chat_event_kind k = p->st == P_REASONING ? CHAT_EV_REASONING : CHAT_EV_TEXT;
    size_t i = 0;
    if (p->skip_ws) {
        while (i < n && isspace((unsigned char)s[i]))
            i++;
        if (i == n)
            return 0;
        p->skip_ws = false;
    }
    size_t e = n;
    while (e > i && isspace((unsigned char)s[e - 1]))
        e--;
    if (e > i) {
        emit(p, k, p->ws.p, p->ws.n);
        p->ws.n = 0;
        emit(p, k, s + i, e - i);
        if (k == CHAT_EV_TEXT)
            p->seen_text = true;
    }
    return buf_add(&p->ws, s + e, n - e);
}

/* the segment ends: its held trailing whitespace is dropped, the next starts fresh */
static void end_segment(struct chat_parser *p)
{
    p->ws.n = 0;
    p->skip_ws = true;
}

/* ---- tool-call bodies ---- */

static const char *skip_space(const char *s, const char *e)
{
    while (s < e && isspace((unsigned char)*s))
        s++;
    return s;
}

static void emit_call(struct chat_parser *p, const char *name, json_t *args)
{
    json_t *empty = args ? NULL : json_object();
    char *a = json_dumps(args ? args : empty, 0); /* Python json.dumps spacing */
    struct chat_event ev = {CHAT_EV_TOOL_START, NULL, 0, p->n_calls, name};
    p->fn(p->ctx, &ev);
    if (a)
        emit(p, CHAT_EV_TOOL_ARGS, a, strlen(a));
    emit(p, CHAT_EV_TOOL_END, NULL, 0);
    free(a);
    json_decref(empty);
    p->n_calls++;
}

/* {"name": ..., "arguments": {...} or "..."}: 1 if it was a call */
static int json_call(struct chat_parser *p, json_t *o)
{
    json_t *name = json_object_get(o, "name"), *args = json_object_get(o, "arguments");
    if (!json_is_string(name))
        return 0;
    json_t *parsed = NULL;
    if (json_is_string(args)) /* arguments sent as a JSON string */
        parsed = json_loads(json_string_value(args), 0, NULL);
    if (args && !json_is_object(args) && !json_is_object(parsed)) {
        json_decref(parsed);
        return 0;
    }
    emit_call(p, json_string_value(name), parsed ? parsed : args);
    json_decref(parsed);
    return 1;
}

/* The schema type of a tool's parameter, or NULL. */
static const char *param_type(struct chat_parser *p, const char *fn, const char *param)
{
    size_t i;
    json_t *t;
    json_array_foreach(p->tools, i, t) {
        json_t *f = json_object_get(t, "function");
        if (!f)
            f = t;
        if (!json_is_string(json_object_get(f, "name")) || strcmp(json_string_value(json_object_get(f, "name")), fn))
            continue;
        json_t *ty = json_object_get(json_object_get(json_object_get(json_object_get(f, "parameters"), "properties"),
                                                     param), "type");
        return json_is_string(ty) ? json_string_value(ty) : json_is_array(ty) ? "any" : NULL;
    }
    return NULL;
}

/* A parameter's text converted by its schema type; strings stay strings. */
static json_t *xml_value(const char *type, const char *s, size_t n)
{
    if (type && strcmp(type, "string") != 0) {
        json_t *v = json_loadb(s, n, JSON_DECODE_ANY, NULL);
        if (v)
            return v;
        if (!strcmp(type, "boolean") && (n == 4 || n == 5) && (!strncmp(s, "True", 4) || !strncmp(s, "False", 5)))
            return json_boolean(s[0] == 'T');
        if (!strcmp(type, "null") && n == 4 && !strncmp(s, "None", 4))
            return json_null();
    }
    return json_stringn(s, n);
}

/* <function=N> <parameter=P> v </parameter> ... </function>: 1 if it was a call */
static int xml_call(struct chat_parser *p, const char *s, const char *e)
{
    s = skip_space(s, e);
    if ((size_t)(e - s) < 10 || strncmp(s, "<function=", 10) != 0)
        return 0;
    const char *ne = memchr(s + 10, '>', (size_t)(e - s - 10));
    if (!ne)
        return 0;
    char *name = strndup(s + 10, (size_t)(ne - s - 10));
    json_t *args = json_object();
    const char *q = ne + 1;
    int ok = 1;
    for (;;) {
        q = skip_space(q, e);
        if (q >= e || !strncmp(q, "</function>", 11))
            break; /* a missing </function> at the end is tolerated */
        if ((size_t)(e - q) < 11 || strncmp(q, "<parameter=", 11) != 0) {
            ok = 0;
            break;
        }
        const char *pe = memchr(q + 11, '>', (size_t)(e - q - 11));
        if (!pe) {
            ok = 0;
            break;
        }
        char *pname = strndup(q + 11, (size_t)(pe - q - 11));
        const char *v = pe + 1, *ve = memmem(v, (size_t)(e - v), "</parameter>", 12);
        const char *next = ve ? ve + 12 : e;
        if (!ve) { /* unclosed: up to the next parameter, the function's end, or the end */
            const char *np = memmem(v, (size_t)(e - v), "<parameter=", 11), *nf = memmem(v, (size_t)(e - v), "</function>", 11);
            ve = np && (!nf || np < nf) ? np : nf ? nf : e;
            next = ve;
        }
        if (v < ve && *v == '\n') /* the template puts the value on its own lines */
            v++;
        if (ve > v && ve[-1] == '\n')
            ve--;
        json_object_set_new(args, pname, xml_value(param_type(p, name, pname), v, (size_t)(ve - v)));
        free(pname);
        q = next;
    }
    if (ok)
        emit_call(p, name, args);
    free(name);
    json_decref(args);
    return ok;
}

/* Turns a closed (or, at the end, unclosed) tool-call body into events; if it
 * is not a valid call, the tags and body go out as text. */
static int finish_tool(struct chat_parser *p, bool closed)
{
    const char *s = p->tool.p ? p->tool.p : "", *e = s + p->tool.n;
    int done = 0;
    if (p->fmt == CHAT_FMT_XML) {
        done = xml_call(p, s, e);
    } else {
        json_t *j = json_loadb(s, (size_t)(e - s), 0, NULL);
        if (p->fmt == CHAT_FMT_JSON && json_is_object(j)) {
            done = json_call(p, j);
        } else if (p->fmt == CHAT_FMT_TOOLCALL && json_is_array(j) && json_array_size(j) > 0) {
            size_t i;
            json_t *c;
            done = 1;
            json_array_foreach(j, i, c) if (!json_is_object(c) || !json_is_string(json_object_get(c, "name"))) done = 0;
            json_array_foreach(j, i, c) if (done) json_call(p, c);
        }
        json_decref(j);
    }
    if (!done && closed) { /* not a call: the user sees it as it was written */
        emit(p, CHAT_EV_TEXT, p->open, strlen(p->open));
        emit(p, CHAT_EV_TEXT, s, (size_t)(e - s));
        emit(p, CHAT_EV_TEXT, p->close, strlen(p->close));
        p->seen_text = true;
    } else if (!done) { /* a call cut short (max_tokens): its text, without the markup that opened it */
        while (s < e && strchr(" \t\r\n", *s))
            s++;
        emit(p, CHAT_EV_TEXT, s, (size_t)(e - s));
        p->seen_text |= s < e;
    }
    p->tool.n = 0;
    return 0;
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of tag. */
static size_t partial_suffix(const char *s, size_t n, const char *tag)
{
    size_t t = strlen(tag);
    for (size_t k = t - 1; k > 0; k--)
        if (k <= n && memcmp(s + n - k, tag, k) == 0)
            return k;
    return 0;
}

static int process(struct chat_parser *p, bool final)
{
    for (;;) {
        char *s = p->in.p ? p->in.p : (char *)"";
        size_t n = p->in.n;
        if (n == 0)
            return 0;
        if (p->st == P_TOOL) {
            char *c = memmem(s, n, p->close, strlen(p->close));
            if (!c) {
                size_t hold = final ? 0 : partial_suffix(s, n, p->close);
                if (buf_add(&p->tool, s, n - hold) != 0)
                    return -1;
                buf_drop(&p->in, n - hold);
                if (final)
                    return finish_tool(p, false);
                return 0;
            }
            if (buf_add(&p->tool, s, (size_t)(c - s)) != 0)
                return -1;
            buf_drop(&p->in, (size_t)(c - s) + strlen(p->close));
            finish_tool(p, true);
            p->st = P_TEXT;
            end_segment(p);
            continue;
        }
        /* TEXT or REASONING: the earliest tag that changes state */
        const char *tags[3];
        int nt = 0;
        tags[nt++] = p->open;
        if (p->st == P_REASONING)
            tags[nt++] = "</think>";
        else if (!p->seen_text)
            tags[nt++] = "<think>";
        char *best = NULL;
        int which = -1;
        for (int i = 0; i < nt; i++) {
            char *h = memmem(s, n, tags[i], strlen(tags[i]));
            if (h && !strcmp(tags[i], "<think>")) /* opens reasoning only before any answer text */
                for (const char *c = s; c < h && h; c++)
                    if (!isspace((unsigned char)*c))
                        h = NULL;
            if (h && (!best || h < best)) {
                best = h;
                which = i;
            }
        }
        if (!best) {
            size_t hold = 0;
            for (int i = 0; !final && i < nt; i++) {
                size_t h = partial_suffix(s, n, tags[i]);
                hold = h > hold ? h : hold;
            }
            if (emit_segment(p, s, n - hold) != 0)
                return -1;
            buf_drop(&p->in, n - hold);
            if (final) {
                end_segment(p);
                return 0;
            }
            return 0;
        }
        if (emit_segment(p, s, (size_t)(best - s)) != 0)
            return -1;
        const char *tag = tags[which];
        buf_drop(&p->in, (size_t)(best - s) + strlen(tag));
        end_segment(p);
        if (tag == p->open)
            p->st = P_TOOL; /* also ends an unclosed <think> */
        else if (!strcmp(tag, "</think>"))
            p->st = P_TEXT;
        else
            p->st = P_REASONING;
    }
}

int chat_parser_feed(struct chat_parser *p, const char *text, size_t len)
{
    if (buf_add(&p->in, text, len) != 0)
        return -1;
    return process(p, false);
}

int chat_parser_finish(struct chat_parser *p)
{
    int rc = process(p, true);
    if (rc == 0 && p->st == P_TOOL && p->tool.n)
        rc = finish_tool(p, false);
    return rc;
}
