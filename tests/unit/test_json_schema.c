/* json_schema: a schema with every construct understood (booleans, an enum
 * mixing strings and numbers, integers, an array loop, a $ref'd object with
 * a const, an object-or-null, a union of primitives) accepts the objects it
 * describes, whitespace included, to their last byte, their prefixes left
 * open, and refuses values of the wrong kind, a missing, extra or reordered
 * property, a fraction in an integer; keywords it cannot enforce, a top that
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
        {"{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\", \"minimum\": 0}}}", "minimum"},
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
