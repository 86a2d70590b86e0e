/* resp_store: the Responses API's stored responses (store: true, OpenAI's
 * default), so that a later request may continue one (previous_response_id),
 * refer to one of its output items (item_reference) or fetch it
 * (GET /v1/responses/{id}). Bounded: past a count or a size in bytes, the
 * least recently used responses are forgotten, and a later reference to one
 * gets a 400 as an unknown id would.
 *
 * Entries are kept as JSON text, so that no jansson value is shared between
 * the connections' threads; a mutex guards the table.
 *
 * Ownership: the store owns its copies; what it returns is the caller's. */
#ifndef KP_RESP_STORE_H
#define KP_RESP_STORE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

struct resp_store;

/* NULL when out of memory. */
struct resp_store *resp_store_new(int32_t max_count, size_t max_bytes);
void resp_store_free(struct resp_store *s);

/* Keeps the response object (its "id" and its "output" items, each with an
 * "id") and the input items it answered, both borrowed, evicting the least
 * recently used to make room. -1 with err_set when one response alone is past
 * the size bound (it is then not kept) or out of memory. */
int resp_store_put(struct resp_store *s, json_t *response, json_t *input);
/* The response object with that id (a new reference), and, when input is not
 * NULL, the input items it answered in *input; NULL when unknown or evicted. */
json_t *resp_store_get(struct resp_store *s, const char *id, json_t **input);
/* The output item with that id of a kept response (a new reference), or NULL. */
json_t *resp_store_find_item(struct resp_store *s, const char *item_id);
/* Bytes of JSON text held (for tests and limits). */
size_t resp_store_bytes(struct resp_store *s);

#endif
