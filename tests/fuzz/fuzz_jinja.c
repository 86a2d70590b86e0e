/* libFuzzer target: the template engine. The input is a template, then a NUL
 * byte, then a JSON context (used only if it parses). Parse and render must end
 * in output or a clear error, within the engine's step and size bounds. */
#include "../../src/chat/jinja.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    const unsigned char *z = memchr(data, 0, size);
    size_t tlen = z ? (size_t)(z - data) : size;
    json_t *ctx = z ? json_loadb((const char *)z + 1, size - tlen - 1, 0, NULL) : NULL;
    if (!json_is_object(ctx)) {
        json_decref(ctx);
        ctx = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": null, "
                         "\"add_generation_prompt\": true}", 0, NULL);
    }
    struct jinja_tpl *t = jinja_parse((const char *)data, tlen);
    if (t) {
        size_t n;
        free(jinja_render(t, ctx, &n));
        jinja_free(t);
    }
    json_decref(ctx);
    return 0;
}
