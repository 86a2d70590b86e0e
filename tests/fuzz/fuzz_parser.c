/* libFuzzer target: the streaming output parser. The first byte picks the
 * format and reasoning start, the rest is fed whole and one byte at a time;
 * the events, with consecutive deltas of one kind merged, must be the same. */
#include "../../src/chat/parser.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct acc {
    char *s;
    size_t n, cap;
    int last;
};

static void on_event(void *ctx, const struct chat_event *ev)
{
    struct acc *a = ctx;
    size_t need = a->n + ev->len + 128;
    if (need > a->cap) {
        a->cap = need * 2;
        a->s = realloc(a->s, a->cap);
        if (!a->s)
            abort();
    }
    int k = (int)ev->kind;
    bool delta = k == CHAT_EV_TEXT || k == CHAT_EV_REASONING || k == CHAT_EV_TOOL_ARGS;
    if (!(delta && a->last == k))
        a->n += (size_t)snprintf(a->s + a->n, 128, "|%d:%d:%.60s:", k, ev->tool_index, ev->name ? ev->name : "");
    if (ev->len)
        memcpy(a->s + a->n, ev->text, ev->len);
    a->n += ev->len;
    a->last = k;
}

static void run(const unsigned char *d, size_t n, enum chat_format fmt, bool reasoning, size_t chunk, struct acc *a)
{
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"properties\":"
                               "{\"n\":{\"type\":\"integer\"},\"o\":{\"type\":\"object\"}}}}}]", 0, NULL);
    a->last = -1;
    struct chat_parser *p = chat_parser_new(fmt, reasoning, tools, on_event, a);
    for (size_t i = 0; i < n; i += chunk)
        chat_parser_feed(p, (const char *)d + i, i + chunk <= n ? chunk : n - i);
    chat_parser_finish(p);
    chat_parser_free(p);
    json_decref(tools);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    if (size < 1)
        return 0;
    enum chat_format fmt = (enum chat_format)(data[0] % 3);
    bool reasoning = data[0] & 4;
    struct acc whole = {0}, bytes = {0};
    run(data + 1, size - 1, fmt, reasoning, size, &whole);
    run(data + 1, size - 1, fmt, reasoning, 1, &bytes);
    if (whole.n != bytes.n || (whole.n && memcmp(whole.s, bytes.s, whole.n) != 0))
        abort();
    free(whole.s);
    free(bytes.s);
    return 0;
}
