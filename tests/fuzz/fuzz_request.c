/* libFuzzer target: the request parsers. The first byte picks the API
 * (Anthropic Messages, OpenAI Responses, OpenAI chat completions), the rest is
 * the JSON body; its messages and tools are converted as the server does and
 * rendered through kapitsa-tiny's chat template (Qwen3's), which must neither
 * crash nor leak whatever the structure of the messages. */
#include "../../src/chat/template.h"
#include "../../src/server/convert.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    static struct chat_template *ct;
    static int loaded;
    if (!loaded) {
        loaded = 1;
        ct = chat_template_load("models/kapitsa-tiny", NULL);
    }
    if (size < 1)
        return 0;
    json_error_t e;
    json_t *body = json_loadb((const char *)data + 1, size - 1, 0, &e);
    if (!json_is_object(body)) {
        json_decref(body);
        return 0;
    }
    char err[256];
    json_t *msgs = NULL, *tools = NULL;
    switch (data[0] % 3) {
    case 0:
        msgs = convert_anthropic_messages(body, err, sizeof err);
        tools = convert_anthropic_tools(json_object_get(body, "tools"));
        break;
    case 1:
        msgs = convert_responses_input(body, err, sizeof err);
        tools = convert_responses_tools(json_object_get(body, "tools"));
        break;
    default:
        msgs = json_is_array(json_object_get(body, "messages")) ? json_incref(json_object_get(body, "messages")) : NULL;
        tools = json_is_array(json_object_get(body, "tools")) ? json_incref(json_object_get(body, "tools")) : NULL;
        break;
    }
    if (msgs) {
        json_t *ready = chat_messages_from_openai(msgs);
        size_t len = 0;
        char *text = ct && ready ? chat_template_render(ct, ready, tools, true, NULL, &len) : NULL;
        free(text);
        json_decref(ready);
    }
    json_decref(msgs);
    json_decref(tools);
    json_decref(body);
    return 0;
}
