/* The Responses API's store: what is kept comes back, the least recently used
 * goes first past the count or the size bound, output items are found by id. */
#include "test.h"

#include "../../src/server/resp_store.h"

#include <stdbool.h>
#include <string.h>

/* A response "resp_<n>" with one message item "msg_<n>" whose text is pad long. */
static json_t *response(int n, size_t pad)
{
    char id[32], item[32], text[4096];
    snprintf(id, sizeof id, "resp_%d", n);
    snprintf(item, sizeof item, "msg_%d", n);
    memset(text, 'x', pad);
    text[pad] = 0;
    return json_pack("{s:s,s:s,s:[{s:s,s:s,s:[{s:s,s:s}]}]}", "id", id, "object", "response", "output", "id", item,
                     "type", "message", "content", "type", "output_text", "text", text);
}

static int put(struct resp_store *s, int n, size_t pad)
{
    json_t *r = response(n, pad), *in = json_pack("[{s:s,s:i}]", "role", "user", "content", n);
    int rc = resp_store_put(s, r, in);
    json_decref(r);
    json_decref(in);
    return rc;
}

static bool has(struct resp_store *s, const char *id)
{
    json_t *r = resp_store_get(s, id, NULL);
    json_decref(r);
    return r != NULL;
}

void test_resp_store(void)
{
    struct resp_store *s = resp_store_new(3, 1000);
    CHECK(s, "new");
    CHECK(put(s, 1, 10) == 0 && put(s, 2, 10) == 0 && put(s, 3, 10) == 0, "puts");
    json_t *in = NULL, *r = resp_store_get(s, "resp_2", &in);
    CHECK(r && !strcmp(json_string_value(json_object_get(r, "id")), "resp_2"), "get gives the response");
    CHECK(json_integer_value(json_object_get(json_array_get(in, 0), "content")) == 2, "and its input");
    json_decref(r);
    json_decref(in);
    json_t *item = resp_store_find_item(s, "msg_1"); /* resp_1 is now the most recent, resp_3 the least */
    CHECK(item && !strcmp(json_string_value(json_object_get(item, "type")), "message"), "an output item by id");
    json_decref(item);
    CHECK(!resp_store_find_item(s, "msg_9") && !resp_store_get(s, "resp_9", NULL), "unknown ids");

    CHECK(put(s, 4, 10) == 0, "a fourth");
    CHECK(!has(s, "resp_3") && has(s, "resp_1") && has(s, "resp_2") && has(s, "resp_4"),
          "past the count the least recently used went");

    const size_t before = resp_store_bytes(s);
    CHECK(put(s, 5, 750) == 0, "a large one");
    CHECK(has(s, "resp_5") && resp_store_bytes(s) <= 1000 && resp_store_bytes(s) > 750, "it fits: %zu bytes (was %zu)",
          resp_store_bytes(s), before);
    CHECK(has(s, "resp_1") + has(s, "resp_2") + has(s, "resp_4") <= 1, "past the size (not only the count) older ones went");

    CHECK(put(s, 6, 2000) == -1 && !has(s, "resp_6") && has(s, "resp_5"), "one past the size bound is refused alone");
    CHECK(put(s, 5, 20) == 0 && has(s, "resp_5") && resp_store_bytes(s) < 200, "the same id again replaces it");
    resp_store_free(s);
}
