/* json_guard: the recogniser against valid and invalid JSON texts (every
 * prefix of a valid object continues, an invalid text stops where it breaks;
 * a number with more digits than a double holds is invalid). */
#include "test.h"

#include "../../src/grammar/json_guard.h"

#include <string.h>

/* -1: rejected at some byte; 0: accepted, not complete; 1: complete */
static int run(const char *text)
{
    struct json_guard g;
    json_guard_init(&g);
    size_t n = strlen(text);
    for (size_t i = 0; i < n; i++) {
        if (json_guard_done(&g) || json_guard_feed(&g, text + i, 1) != 0)
            return -1;
    }
    return json_guard_done(&g) ? 1 : 0;
}

void test_json_guard_grammar(void)
{
    static const char *const valid[] = {
        "{}",
        "{\"a\":1}",
        " \n{ \"a\" : [ 1 , -2.5e+3 , 0 , 0.25 , 1E9 , -0 , true , false , null ] }",
        "{\"s\":\"esc \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9\\uD83D\"}",
        "{\"\xc3\xa9\":\"\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80\"}",
        "{\"a\":{\"b\":{\"c\":[[],[{}],{}]}},\"d\":\"\"}",
        "{\"n\":[1,2,3],\"m\":{\"x\":-1.5E-7}}",
        "{\"big\":[999999999999999,-999999999999999.9999999999999999e+99,0.0000000000000001E-99]}",
    };
    for (size_t i = 0; i < sizeof valid / sizeof *valid; i++) {
        CHECK(run(valid[i]) == 1, "valid JSON refused or left open: %s", valid[i]);
        /* every proper prefix is open, not complete */
        char buf[256];
        size_t n = strlen(valid[i]);
        for (size_t k = 0; k < n; k++) {
            memcpy(buf, valid[i], k);
            buf[k] = 0;
            CHECK(run(buf) == 0, "prefix %zu of %s: %d", k, valid[i], run(buf));
        }
    }
    static const char *const invalid[] = {
        "[]", "\"x\"", "1", "{\"a\"}", "{\"a\":01}", "{\"a\":1,}", "{,}", "{\"a\":tru}", "{\"a\":\"\x01\"}",
        "{\"a\":\"\\q\"}", "{\"a\":1}}", "{\"a\":1} ", "{\"a\":\"\xff\"}", "{\"a\":\"\xc3(\"}", "{\"a\":-}",
        "{\"a\":1.}", "{\"a\":1e}", "{\"a\":.5}", "{\"a\":+1}", "{a:1}", "{\"a\":\"\\u12g4\"}", "{\"a\" 1}",
        "{\"a\":[1 2]}", "{\"a\":nul}", "{\"a\":[}", "{\"a\":{]}",
        /* numbers past a double (or an exact integer) */
        "{\"a\":3016e6561}", "{\"a\":19.03e+150462524544}", "{\"a\":1e100}", "{\"a\":1234567890123456}",
        "{\"a\":-9007199254740993}", "{\"a\":0.12345678901234567}",
    };
    for (size_t i = 0; i < sizeof invalid / sizeof *invalid; i++)
        CHECK(run(invalid[i]) == -1, "invalid JSON accepted: %s", invalid[i]);
    /* a whitespace run is one newline and an indent at most (each run apart), nesting is bounded */
    char ws[64] = "{\r\n";
    memset(ws + 3, '\t', JSON_GUARD_MAX_INDENT - 1);
    CHECK(run(ws) == 0, "a newline and an indent of %d refused", JSON_GUARD_MAX_INDENT);
    ws[JSON_GUARD_MAX_INDENT + 2] = ' ';
    CHECK(run(ws) == -1, "an indent past %d accepted", JSON_GUARD_MAX_INDENT);
    CHECK(run("{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\" :\n {}\n}") == 1, "pretty-printed JSON refused");
    CHECK(run("{\n\n") == -1 && run("{\"a\": \n \n1") == -1 && run("{\"a\":[1 ,\n\r\n") == -1,
          "a run of two newlines accepted");
    char deep[JSON_GUARD_MAX_DEPTH * 6 + 16];
    size_t o = 0;
    deep[o++] = '{';
    for (int d = 1; d <= JSON_GUARD_MAX_DEPTH; d++)
        o += (size_t)sprintf(deep + o, "\"a\":{");
    deep[o] = 0;
    CHECK(run(deep) == -1, "nesting past %d accepted", JSON_GUARD_MAX_DEPTH);
}
