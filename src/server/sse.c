/* sse: the pending-bytes buffer and response of a server-sent event stream (see sse.h). */
#include "sse.h"

#include "app.h"

#include <stdlib.h>
#include <string.h>

static void sse_put(struct sse *s, const char *a, size_t n)
{
    char *np = realloc(s->p, s->n + n + 1);
    if (!np)
        return;
    memcpy(np + s->n, a, n);
    s->p = np;
    s->n += n;
    s->p[s->n] = 0;
}

void sse_event(struct sse *s, const char *name, json_t *data)
{
    char *d = json_dumps(data, JSON_COMPACT);
    json_decref(data);
    if (!d)
        return;
    if (name) {
        sse_put(s, "event: ", 7);
        sse_put(s, name, strlen(name));
        sse_put(s, "\n", 1);
    }
    sse_put(s, "data: ", 6);
    sse_put(s, d, strlen(d));
    sse_put(s, "\n\n", 2);
    free(d);
}

void sse_raw(struct sse *s, const char *text) { sse_put(s, text, strlen(text)); }

size_t sse_take(struct sse *s, char *out, size_t max)
{
    size_t k = s->n - s->off < max ? s->n - s->off : max;
    if (k == 0)
        return 0;
    memcpy(out, s->p + s->off, k);
    s->off += k;
    if (s->off == s->n)
        s->off = s->n = 0;
    return k;
}

void sse_free(struct sse *s)
{
    free(s->p);
    memset(s, 0, sizeof *s);
}

enum MHD_Result sse_respond(struct MHD_Connection *c, MHD_ContentReaderCallback reader, void *cls,
                            MHD_ContentReaderFreeCallback free_fn)
{
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, reader, cls, free_fn);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    return http_queue(c, MHD_HTTP_OK, r);
}
