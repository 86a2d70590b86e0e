/* kapitsa render: an OpenAI chat request on stdin -> the exact prompt the model
 * sees (src/chat/template.h), or its token ids with --ids. */
#include "../base/err.h"
#include "../runtime/runtime.h"
#include "cli.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void render_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa render -m|--model DIR [--template FILE] [--ids] < request.json\n"
               "  request: {messages, tools?, chat_template_kwargs?, add_generation_prompt? (default true)}\n");
}

int cli_render(int argc, char **argv)
{
    const char *dir = NULL, *file = NULL;
    int ids = 0;
    for (int i = 0; i < argc; i++) {
        int f = cli_flag(argc, argv, &i, "-m|--model", &dir);
        if (f == 0)
            f = cli_flag(argc, argv, &i, "--template", &file);
        if (f < 0)
            return 2;
        if (f)
            continue;
        if (cli_switch(argv[i], "--ids"))
            ids = 1;
        else
            return cli_arg_reject(argv[i], render_usage);
    }
    if (!dir)
        return render_usage(stderr), 2;
    json_error_t je;
    json_t *req = json_loadf(stdin, 0, &je);
    if (!json_is_object(req) || !json_is_array(json_object_get(req, "messages"))) {
        fprintf(stderr, "kapitsa render: stdin is not a chat request with a messages list (%s)\n", req ? "" : je.text);
        json_decref(req);
        return 1;
    }
    struct chat_template *ct = runtime_template(dir, file);
    struct tokenizer *tok = ct && ids ? runtime_tokenizer(dir) : NULL;
    int rc = 1;
    if (!ct || (ids && !tok)) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        goto done;
    }
    json_t *agp = json_object_get(req, "add_generation_prompt");
    json_t *msgs = chat_messages_from_openai(json_object_get(req, "messages"));
    size_t len;
    char *prompt = chat_template_render(ct, msgs, json_object_get(req, "tools"), agp ? json_is_true(agp) : true,
                                       json_object_get(req, "chat_template_kwargs"), &len);
    json_decref(msgs);
    if (!prompt) {
        fprintf(stderr, "kapitsa: %s\n", err_msg());
        goto done;
    }
    if (ids) {
        struct tok_ids t = {0};
        if (tok_encode(tok, prompt, len, &t) == 0) {
            putchar('[');
            for (int32_t i = 0; i < t.n; i++)
                printf(i ? ", %d" : "%d", t.ids[i]);
            printf("]\n");
            rc = 0;
        } else {
            fprintf(stderr, "kapitsa: %s\n", err_msg());
        }
        tok_ids_free(&t);
    } else {
        fwrite(prompt, 1, len, stdout);
        rc = 0;
    }
    free(prompt);
done:
    tok_free(tok);
    chat_template_free(ct);
    json_decref(req);
    return rc;
}
