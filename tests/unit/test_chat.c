/* Tests of the chat templates: the real templates of every family rendered
 * byte-identically to transformers' apply_chat_template (and raising where it
 * raised), the Qwen3 template from tokenizer_config.json, and hostile or broken
 * templates ending in clear errors. */
#include "../../src/base/err.h"
#include "../../src/chat/jinja.h"
#include "../../src/chat/template.h"
#include "../../src/server/convert.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>

static json_t *load_fixture(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer/%s", test_fixtures(), name);
    return json_load_file(path, 0, NULL);
}

/* Compares one golden case; want_err: the reference raised. */
static void check_render(const struct chat_template *ct, json_t *c, size_t i)
{
    json_t *in = json_object_get(c, "input"), *kw = json_object();
    if (json_object_get(in, "enable_thinking"))
        json_object_set(kw, "enable_thinking", json_object_get(in, "enable_thinking"));
    size_t len;
    char *out = chat_template_render(ct, json_object_get(in, "messages"), json_object_get(in, "tools"),
                                     json_is_true(json_object_get(c, "add_generation_prompt")), kw, &len);
    json_t *want = json_object_get(c, "rendered");
    if (!want) {
        CHECK(out == NULL && strstr(err_msg(), "jinja"), "case %zu should raise like the reference (%s)", i,
              json_string_value(json_object_get(c, "error")));
    } else {
        CHECK(out != NULL, "case %zu: %s", i, err_msg());
        if (out) {
            size_t k = 0;
            const char *w = json_string_value(want);
            while (k < len && k < json_string_length(want) && w[k] == out[k])
                k++;
            CHECK(len == json_string_length(want) && k == len, "case %zu differs at byte %zu: '%.40s' vs '%.40s'", i,
                  k, out + k, w + k);
        }
    }
    free(out);
    json_decref(kw);
}

void test_chat_template_goldens(void)
{
    /* the shared goldens and this project's (tools/reference/template_goldens_ext.py) */
    json_t *g = load_fixture("template_goldens.json"), *ext = load_fixture("template_goldens_ext.json");
    CHECK(g && ext && json_array_size(g) >= 90 && json_array_size(ext) >= 120, "template goldens");
    json_array_extend(g, ext);
    json_decref(ext);
    size_t i;
    json_t *c;
    json_array_foreach(g, i, c) {
        char path[512];
        snprintf(path, sizeof path, "%s/templates/%s", test_fixtures(), json_string_value(json_object_get(c, "template")));
        /* rendered with the Qwen3 tokenizer's special tokens, as the reference did */
        struct chat_template *ct = chat_template_load("models/qwen3-tokenizer", path);
        CHECK(ct != NULL, "%s", err_msg());
        if (ct)
            check_render(ct, c, i);
        chat_template_free(ct);
    }
    json_decref(g);

    g = load_fixture("chat_template_goldens.json");
    struct chat_template *ct = chat_template_load("models/qwen3-tokenizer", NULL);
    CHECK(ct && g && json_array_size(g) > 0, "%s", err_msg());
    json_array_foreach(g, i, c) if (ct) check_render(ct, c, 1000 + i);
    chat_template_free(ct);
    json_decref(g);
}

void test_chat_openai_arguments(void)
{
    json_t *m = json_loads("[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"type\":\"function\","
                           "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": [1, 2.5, \\\"\\u00e9\\\"]}\"}},"
                           "{\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"not json\"}}]}]",
                           0, NULL);
    json_t *n = chat_messages_from_openai(m);
    json_t *calls = json_object_get(json_array_get(n, 0), "tool_calls");
    json_t *a0 = json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments");
    json_t *a1 = json_object_get(json_object_get(json_array_get(calls, 1), "function"), "arguments");
    CHECK(json_is_object(a0) && json_array_size(json_object_get(a0, "a")) == 3, "arguments parsed");
    CHECK(json_is_string(a1), "a non-JSON argument string is kept");
    CHECK(json_is_string(json_object_get(json_object_get(json_array_get(json_object_get(json_array_get(m, 0), "tool_calls"), 0), "function"), "arguments")),
          "the input is not modified");
    json_decref(m);
    json_decref(n);
}

/* An Anthropic assistant turn that thinks twice around a tool call (and a
 * thinking block without text, as the fuzzer sent): one message whose
 * reasoning joins the thinking texts in order; nothing leaks (ASan). */
void test_chat_anthropic_thinking(void)
{
    json_t *body = json_loads("{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                              "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"first \"},"
                              "{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"ls\",\"input\":{}},"
                              "{\"type\":\"thinking\",\"thinking\":\"second\"},{\"type\":\"thinking\"},"
                              "{\"type\":\"text\",\"text\":\"ok\"}]},"
                              "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"no thought\"}]}]}",
                              0, NULL);
    char err[128] = "";
    json_t *m = convert_anthropic_messages(body, err, sizeof err);
    CHECK(json_array_size(m) == 3, "three messages (got %zu) %s", json_array_size(m), err);
    json_t *a = json_array_get(m, 1), *b = json_array_get(m, 2);
    const char *r = json_string_value(json_object_get(a, "reasoning_content"));
    CHECK(r && !strcmp(r, "first second"), "the thinking blocks joined in order (got %s)", r ? r : "none");
    CHECK(!strcmp(json_string_value(json_object_get(a, "content")), "ok"), "the text kept");
    CHECK(json_array_size(json_object_get(a, "tool_calls")) == 1, "the tool call kept");
    CHECK(json_object_get(b, "reasoning_content") == NULL, "no reasoning where the turn did not think");
    json_decref(m);
    json_decref(body);
}

static char *render_src(const char *src, const char *ctx_json)
{
    struct jinja_tpl *t = jinja_parse(src, strlen(src));
    if (!t)
        return NULL;
    json_t *ctx = json_loads(ctx_json ? ctx_json : "{}", 0, NULL);
    size_t n;
    char *out = jinja_render(t, ctx, &n);
    json_decref(ctx);
    jinja_free(t);
    return out;
}

void test_jinja_semantics(void)
{
    struct {
        const char *src, *ctx, *want;
    } cases[] = {
        {"{{ x | tojson }}", "{\"x\": {\"a\": [1, 2.5, true, null, \"\\u00e9\\n\\\"\"]}}",
         "{\"a\": [1, 2.5, true, null, \"\xc3\xa9\\n\\\"\"]}"},
        {"{{ x }}", "{\"x\": {\"a\": [1, \"q\", \"it's\", 1e-05, 1e16, 0.1]}}", "{'a': [1, 'q', \"it's\", 1e-05, 1e+16, 0.1]}"},
        {"{{ x | tojson(indent=2) }}", "{\"x\": {\"a\": [1]}}", "{\n  \"a\": [\n    1\n  ]\n}"},
        {"{% for a, b in x | items %}{{ loop.index }}{{ a }}={{ b }}{% if not loop.last %},{% endif %}{% endfor %}",
         "{\"x\": {\"p\": 1, \"q\": 2}}", "1p=1,2q=2"},
        {"{% set ns = namespace(n=0) %}{% for i in range(5) if i % 2 == 0 %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
         NULL, "6"},
        {"{{ 'a,b,,c'.split(',') }}|{{ '  x  '.strip() }}|{{ 'abc'[::-1] }}|{{ 'héllo'[1:3] }}", NULL,
         "['a', 'b', '', 'c']|x|cba|él"},
        {"{% macro m(a, b=2) %}{{ a + b }}{% endmacro %}{{ m(1) }}{{ m(1, b=5) }}", NULL, "36"},
        {"{%- if x is defined and x is not none -%} yes {%- else -%} no {%- endif %}", "{\"x\": null}", "no"},
        {"  {% if true %}\n  a\n  {% endif %}\nb", NULL, "  a\nb"},
        {"{{ 7 // 2 }} {{ 7 / 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 'ab' * 2 }}", NULL, "3 3.5 2 1024 abab"},
        {"{% for x in [] %}a{% else %}empty{% endfor %}", NULL, "empty"},
        {"{% for x in [1,2,3] %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}", NULL, "1"},
        {"{{ [3,1] | length }}{{ none | default('d') }}{{ undefined_var | default('u') }}{{ '' | default('e', true) }}",
         NULL, "2Noneue"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = render_src(cases[i].src, cases[i].ctx);
        CHECK(out && strcmp(out, cases[i].want) == 0, "case %zu: got '%s' want '%s' (%s)", i, out ? out : "NULL",
              cases[i].want, out ? "" : err_msg());
        free(out);
    }
}

void test_jinja_bad_templates(void)
{
    struct {
        const char *src, *want;
    } cases[] = {
        {"{% if x %}never closed", "missing"},
        {"{{ 1 +", "unterminated tag"},
        {"{% frobnicate %}", "unknown statement 'frobnicate'"},
        {"{{ raise_exception('no system role') }}", "no system role"},
        {"{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursion deeper"},
        {"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "steps"},
        {"{{ range(10000000) }}", "range too large"},
        {"{{ 'x' ~ 1 | nosuchfilter }}", "no filter named 'nosuchfilter'"},
        {"{{ [1] + 'a' }}", "unsupported operand"},
        {"{{ 'a' + [1] }}", "can only concatenate str"},
        {"{{ x.y.z }}", "undefined"},
        {"{% set a.b = 1 %}", "non-namespace"},
        {"{{ 'abc'.nosuch() }}", "has no attribute"},
        {"{{ 1 / 0 }}", "division by zero"},
        {"{# unterminated comment", "unterminated comment"},
        {"{{ \"\\u12\" }}", "bad escape"},
        {"{{ 99999999999999999999 }}", "integer literal too large"},
        {"{{ ((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("
         "1 }}", "nested too deeply"},
        {"{{ not not not not not not not not not not not not not not not not not not not not not not not not not not not "
         "not not not not not not not not not not not not not not not not not not not not not not not not not not not not "
         "not not not not not not not not not not not not not not not not not not not not not not not not not not not not "
         "not not not not not not not not not not not not not not not not not not not 1 }}", "nested too deeply"},
        {"{{ 9223372036854775807 + 1 }}", "integer overflow"},
        {"{{ -(-9223372036854775807 - 1) }}", "integer overflow"},
        {"{{ 2 ** 100 }}", "integer overflow"},
        {"{{ (-9223372036854775807 - 1) // -1 }}", "integer overflow"},
        {"{{ range(9223372036854775806, 9223372036854775807, 10) | length }}{{ x.y }}", "undefined"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err_clear();
        char *out = render_src(cases[i].src, NULL);
        CHECK(out == NULL && strstr(err_msg(), cases[i].want) && strstr(err_msg(), "jinja: line"),
              "case %zu: got '%s', error '%s'", i, out ? out : "NULL", err_msg());
        free(out);
    }
}
