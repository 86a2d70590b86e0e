/* sse: server-sent events for the streaming API responses. An adapter appends
 * events to a struct sse as the generation produces them; libmicrohttpd's
 * content reader takes the bytes out (internal to src/server). */
#ifndef KP_SSE_H
#define KP_SSE_H

#include <jansson.h>
#include <microhttpd.h>
#include <stddef.h>

struct sse {
    char *p;
    size_t n, off;
};

/* Appends "event: NAME\ndata: JSON\n\n" (no event line when name is NULL);
 * takes the reference to data. */
void sse_event(struct sse *s, const char *name, json_t *data);
/* Appends raw bytes (e.g. "data: [DONE]\n\n"). */
void sse_raw(struct sse *s, const char *text);
/* Copies up to max pending bytes to out; 0 when nothing is pending. */
size_t sse_take(struct sse *s, char *out, size_t max);
void sse_free(struct sse *s);
/* Queues a text/event-stream response fed by reader; free_fn runs when the
 * stream ends or the client goes away. */
enum MHD_Result sse_respond(struct MHD_Connection *c, MHD_ContentReaderCallback reader, void *cls,
                            MHD_ContentReaderFreeCallback free_fn);

#endif
