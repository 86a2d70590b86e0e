/* json_schema: a schema with every construct understood (booleans, an enum
 * mixing strings and numbers, integers, an array loop, a $ref'd object with
 * a const, an object-or-null, a union of primitives) accepts the objects it
 * describes, whitespace included (one newline and an indent at a place), to
 * their last byte, their prefixes left open, and refuses values of the wrong
 * kind, a missing, extra or reordered property, a fraction in an integer, a
 * second newline at a place; keywords it cannot enforce, a top that
 * is not an object and a recursive $ref are refused with their name. */
#include "../../src/chat/json_schema.h"
#include "test.h"

#include <string.h>

static const char *schema_text =
    "{\"type\": \"object\", \"additionalProperties\": false, \"required\": [\"ok\", \"color\"],"
    " \"properties\": {\"ok\": {\"type\": \"boolean\", \"description\": \"d\"}, \"color\": {\"enum\": [\"red\", \"green\", 3, 31]},"
    " \"n\": {\"type\": \"integer\"}, \"x\": {\"type\": \"number\"}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}},"
    " \"sub\": {\"$ref\": \"#/$defs/S\"}, \"maybe\": {\"type\": [\"object\", \"null\"], \"properties\": {\"z\": {\"type\": \"null\"}}},"
    " \"u\": {\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"integer\"}]}},"
    " \"$defs\": {\"S\": {\"type\": \"object\", \"properties\": {\"k\": {\"const\": \"v\"}, \"a\": {\"type\": \"array\","
    " \"items\": {\"type\": \"array\", \"items\": {\"type\": \"boolean\"}}}}}}}";

void test_json_schema_grammar(void)
{
    json_t *schema = json_loads(schema_text, 0, NULL);
    struct grammar gm;
    grammar_init(&gm);
    char err[256] = "";
    CHECK(json_schema_grammar(&gm, schema, err, sizeof err) == 0, "%s", err);
    static const char *const ok[] = {
        "{\"ok\":true,\"color\":\"red\",\"n\":-12,\"x\":0.5,\"tags\":[],\"sub\":{\"k\":\"v\",\"a\":[]},\"maybe\":null,\"u\":\"s\"}",
        "{\n  \"ok\": false,\n  \"color\": 31,\n  \"n\": 0,\n  \"x\": -1.5e+3,\n  \"tags\": [\"a\", \"b\\n\\u00e9\"],\n"
        "  \"sub\": {\"k\": \"v\", \"a\": [[true], [], [false, true]]},\n  \"maybe\": {\"z\": null},\n  \"u\": 7\n}",
        "{\"ok\":true,\"color\":3,\"n\":7,\"x\":2,\"tags\":[\"x\"],\"sub\":{\"k\":\"v\",\"a\":[[]]},\"maybe\":{ \"z\" : null },\"u\":-3}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        CHECK(test_verdict(&gm, ok[i]) == 1, "'%s' refused or left open: %d", ok[i],
              test_verdict(&gm, ok[i]));
        char buf[512];
        for (size_t k = 0; k < strlen(ok[i]); k++) {
            memcpy(buf, ok[i], k);
            buf[k] = 0;
            CHECK(test_verdict(&gm, buf) == 0, "prefix '%s': %d", buf, test_verdict(&gm, buf));
        }
    }
    /* whitespace: one newline and an indent at a place, no more */
    CHECK(test_verdict(&gm, "{\n\n") == -1 && test_verdict(&gm, "{\"ok\":\n \ntrue") == -1,
          "two newlines at one place accepted");
    CHECK(test_verdict(&gm, "{\"ok\":\n         true") == -1, "a newline and 9 spaces accepted (8 bytes at a place)");
    /* each differs from the first valid object in one place */
    static const char *const bad[] = {
        "{\"ok\":1,", "{\"ok\":\"true\",", "{\"ok\":true,\"color\":\"blue\",", "{\"ok\":true,\"color\":\"red\",\"n\":1.5,",
        "{\"ok\":true,\"color\":\"red\",\"n\":1e3,", "{\"ok\":true,\"color\":\"red\",\"n\":-,",
        "{\"ok\":true,\"color\":\"red\",\"n\":1234567890123456,", "{\"ok\":true,\"color\":\"red\",\"n\":-12,\"x\":1e100,",
        "{\"ok\":true,\"color\":\"red\",\"n\":-12,\"x\":\"0.5\",",
        "{\"ok\":true,\"color\":\"red\",\"n\":-12,\"x\":0.5,\"tags\":[1],",
        "{\"ok\":true,\"color\":\"red\",\"n\":-12,\"x\":0.5,\"tags\":[\"a\",],",
        "{\"ok\":true,\"color\":\"red\",\"n\":-12,\"x\":0.5,\"tags\":[],\"sub\":{\"k\":\"w\"",
        "{\"ok\":true,\"color\":\"red\",\"n\":-12,\"x\":0.5,\"tags\":[],\"sub\":{\"a\":[],\"k\":\"v\"}",
        "{\"ok\":true,\"color\":\"red\",\"n\":-12,\"x\":0.5,\"tags\":[],\"sub\":{\"k\":\"v\",\"a\":[[1]]}",
        "{\"ok\":true,\"color\":\"red\",\"n\":-12,\"x\":0.5,\"tags\":[],\"sub\":{\"k\":\"v\",\"a\":[]},\"maybe\":3",
        "{\"ok\":true,\"color\":\"red\",\"n\":-12,\"x\":0.5,\"tags\":[],\"sub\":{\"k\":\"v\",\"a\":[]},\"maybe\":{}",
        "{\"ok\":true,\"color\":\"red\",\"n\":-12,\"x\":0.5,\"tags\":[],\"sub\":{\"k\":\"v\",\"a\":[]},\"maybe\":null,\"u\":true",
        "{\"ok\":true,\"color\":\"red\",\"n\":-12,\"x\":0.5,\"tags\":[],\"sub\":{\"k\":\"v\",\"a\":[]},\"maybe\":null,\"u\":1.5",
        "{\"ok\":true,\"color\":\"red\",\"n\":-12,\"x\":0.5,\"tags\":[],\"sub\":{\"k\":\"v\",\"a\":[]},\"maybe\":null,\"u\":1}}",
        "{\"ok\":true,\"color\":\"red\",\"n\":-12,\"x\":0.5,\"tags\":[],\"sub\":{\"k\":\"v\",\"a\":[]},\"maybe\":null,\"u\":1,\"w\":2}",
        "{\"color\":\"red\",\"ok\":true,", "[]", "{}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(test_verdict(&gm, bad[i]) == -1, "'%s' accepted", bad[i]);
    grammar_free(&gm);
    json_decref(schema);

    static const struct {
        const char *schema, *why;
    } refused[] = {
        {"{\"type\": \"object\", \"properties\": {\"s\": {\"type\": \"string\", \"pattern\": \"^a\"}}}", "pattern"},
        {"{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\", \"minimum\": 2, \"maximum\": 1}}}", "range"},
        {"{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\", \"minimum\": 1e16}}}", "15 integer digits"},
        {"{\"type\": \"object\", \"properties\": {\"s\": {\"type\": \"string\", \"format\": \"ipv6\"}}}", "ipv6"},
        {"{\"type\": \"object\", \"properties\": {\"s\": {\"type\": \"string\", \"minLength\": 3, \"maxLength\": 2}}}", "at least 3"},
        {"{\"type\": \"object\", \"properties\": {\"s\": {\"type\": \"string\", \"minLength\": -1}}}", "minLength"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\", \"minItems\": 2, \"maxItems\": 1}}}", "minItems"},
        {"{\"type\": \"object\", \"properties\": {\"o\": {\"oneOf\": [{\"type\": \"string\"}]}}}", "oneOf"},
        {"{\"type\": \"array\", \"items\": {\"type\": \"string\"}}", "top"},
        {"{\"type\": \"object\", \"properties\": {\"r\": {\"$ref\": \"#/\"}}}", "recursive"},
        {"{\"type\": \"object\", \"properties\": {\"r\": {\"$ref\": \"#/$defs/none\"}}}", "$ref"},
        {"{\"type\": \"object\", \"properties\": {\"r\": {\"anyOf\": [{\"type\": \"object\"}, {\"type\": \"array\"}]}}}", "anyOf"},
        {"{\"type\": \"object\", \"properties\": {\"t\": {\"type\": \"date\"}}}", "date"},
        {"{\"type\": \"object\", \"properties\": {\"e\": {\"enum\": []}}}", "enum"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        json_t *s = json_loads(refused[i].schema, 0, NULL);
        grammar_init(&gm);
        err[0] = 0;
        CHECK(json_schema_grammar(&gm, s, err, sizeof err) == -1 && strstr(err, refused[i].why),
              "'%s': '%s'", refused[i].schema, err);
        grammar_free(&gm);
        json_decref(s);
    }
    /* a const past what a guard can count: refused, not mismatched */
    char *big = malloc(70000);
    memset(big, 'a', 69999);
    big[69999] = 0;
    json_t *s = json_pack("{s:s,s:{s:{s:s}}}", "type", "object", "properties", "c", "const", big);
    grammar_init(&gm);
    CHECK(json_schema_grammar(&gm, s, err, sizeof err) == -1 && strstr(err, "longer than"), "a 70 KB const: '%s'", err);
    grammar_free(&gm);
    json_decref(s);
    free(big);
}

/* every prefix the grammar takes, up to depth more bytes of alphabet, goes
 * on with some byte or is complete: a guard never leaves the model stuck */
static void no_dead_end(const struct grammar *gm, char *text, size_t n, const char *alphabet, int depth)
{
    if (depth == 0)
        return;
    bool any = false;
    for (const char *a = alphabet; *a; a++) {
        text[n] = *a;
        text[n + 1] = 0;
        const int v = test_verdict(gm, text);
        any |= v >= 0;
        if (v == 0)
            no_dead_end(gm, text, n + 1, alphabet, depth - 1);
    }
    text[n] = 0;
    CHECK(any || test_verdict(gm, text) == 1, "'%s' can go on with no byte", text);
}

/* The bounds a value's schema may set (zod's idioms among them): a
 * number's range, exclusive ends, integers within it; a string's length
 * and formats; an array's item count. Each value in "ok" is taken whole
 * (as {"v":VALUE}), each in "bad" refused, and bounded numbers never lead
 * into a dead end. */
void test_json_schema_bounds(void)
{
    static const struct {
        const char *schema;
        const char *ok[6], *bad[8];
    } t[] = {
        {"{\"type\": \"integer\", \"minimum\": -9007199254740991, \"maximum\": 9007199254740991}",
         {"0", "-12", "999999999999999", "-999999999999999"}, {"1.5", "1e3", "1234567890123456"}},
        {"{\"type\": \"number\", \"minimum\": 0, \"maximum\": 1}", {"0", "1", "0.5", "1.0", "0.999"},
         {"-0.1", "1.01", "2", "-0", "1e0", "10"}},
        {"{\"type\": \"integer\", \"exclusiveMinimum\": 0, \"exclusiveMaximum\": 100}", {"1", "99", "42"},
         {"0", "100", "-1", "1000"}},
        {"{\"type\": \"number\", \"exclusiveMinimum\": -2.5, \"maximum\": -0.5}", {"-0.5", "-2.4", "-1", "-2.49"},
         {"-2.5", "-0.4", "0", "1", "-3"}},
        {"{\"type\": [\"integer\", \"null\"], \"minimum\": 10, \"maximum\": 20}", {"10", "20", "null", "15"},
         {"9", "21", "1", "200", "-15"}},
        {"{\"anyOf\": [{\"type\": \"integer\", \"minimum\": 5}, {\"type\": \"null\"}]}", {"5", "null", "600"}, {"4", "-5"}},
        {"{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 4}", {"\"ab\"", "\"abcd\"", "\"\\u00e9\\n\"", "\"\xc3\xa9t\xc3\xa9\""},
         {"\"a\"", "\"abcde\"", "\"\"", "\"\xf0\x9f\x98\x80\xf0\x9f\x98\x80x\""}},
        {"{\"type\": \"string\", \"format\": \"date\", \"pattern\": \"^\\\\d{4}-\\\\d{2}-\\\\d{2}$\"}",
         {"\"2024-02-29\"", "\"1999-12-31\"", "\"2000-01-01\""},
         {"\"2023-02-29\"", "\"1999-13-01\"", "\"1999-04-31\"", "\"1999-00-10\"", "\"1999-1-10\"", "\"99-01-01\"", "\"1999-01-01T\""}},
        {"{\"type\": \"string\", \"format\": \"date-time\"}", {"\"2024-05-06T07:08:09Z\"", "\"2024-05-06T23:59:59.123Z\""},
         {"\"2024-05-06 07:08:09Z\"", "\"2024-05-06T24:00:00Z\"", "\"2024-05-06T07:08:09\"", "\"2024-05-06T07:08:09+02:00\"",
          "\"2024-05-06T07:08:09.Z\""}},
        {"{\"type\": \"string\", \"format\": \"time\"}", {"\"00:00:00Z\"", "\"23:59:59.999999999Z\""},
         {"\"24:00:00Z\"", "\"12:60:00Z\"", "\"12:00Z\"", "\"12:00:00.1234567890Z\""}},
        {"{\"type\": \"string\", \"format\": \"uuid\"}", {"\"123e4567-e89b-42d3-a456-426614174000\""},
         {"\"123e4567-e89b-92d3-a456-426614174000\"", "\"123e4567-e89b-42d3-c456-426614174000\"", "\"123E4567-e89b-42d3-a456-426614174000\"",
          "\"123e4567e89b42d3a456426614174000\""}},
        {"{\"type\": \"string\", \"format\": \"email\", \"maxLength\": 12}", {"\"a@b.cc\"", "\"a.b+c@x-y.io\""},
         {"\"a@b\"", "\"a@b.c\"", "\"a..b@c.de\"", "\"@b.cc\"", "\"a@b.c1\"", "\"a@-b.cc\"", "\"abcdefgh@b.cc\""}},
        {"{\"type\": \"string\", \"format\": \"uri\"}", {"\"https://example.com/a?b=c#d\"", "\"urn:x\""},
         {"\"example.com\"", "\"1http://x\"", "\"http:\"", "\"http://a b\""}},
        {"{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"minItems\": 1, \"maxItems\": 3}", {"[1]", "[1,2,3]", "[ 1 , 2 ]"},
         {"[]", "[1,2,3,4]", "[1,]"}},
        {"{\"type\": \"array\", \"items\": {\"type\": \"boolean\"}, \"minItems\": 2}", {"[true,false]", "[true,true,true,false]"},
         {"[]", "[true]"}},
        {"{\"type\": \"array\", \"maxItems\": 1}", {"[]", "[{\"a\":[1]}]"}, {"[1,2]"}},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        char text[512];
        snprintf(text, sizeof text, "{\"type\": \"object\", \"properties\": {\"v\": %s}}", t[i].schema);
        json_error_t je;
        json_t *schema = json_loads(text, 0, &je);
        CHECK(schema, "%s: %s", t[i].schema, je.text);
        struct grammar gm;
        grammar_init(&gm);
        char err[256] = "";
        CHECK(json_schema_grammar(&gm, schema, err, sizeof err) == 0, "%s: %s", t[i].schema, err);
        for (size_t k = 0; k < 6 && t[i].ok[k]; k++) {
            snprintf(text, sizeof text, "{\"v\": %s}", t[i].ok[k]);
            CHECK(test_verdict(&gm, text) == 1, "%s: '%s' not taken", t[i].schema, text);
        }
        for (size_t k = 0; k < 8 && t[i].bad[k]; k++) {
            snprintf(text, sizeof text, "{\"v\": %s}", t[i].bad[k]);
            CHECK(test_verdict(&gm, text) == -1, "%s: '%s' taken", t[i].schema, text);
        }
        if (strstr(t[i].schema, "imum")) {
            strcpy(text, "{\"v\":");
            no_dead_end(&gm, text, strlen(text), "-0123456789.e}nul", 5);
        }
        grammar_free(&gm);
        json_decref(schema);
    }
}
