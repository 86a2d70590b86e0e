/* libFuzzer target: response_format json_schema. Input: a schema (JSON), a
 * NUL, then an output text. A schema must compile or be refused without a
 * crash or leak; for one that compiles, the text fed whole and a byte at a
 * time must get the same verdict, and a text the grammar completes must be
 * JSON (texts with \u escapes or numbers jansson cannot hold left out, as in
 * fuzz_json_guard) that the schema validates, by this file's own reading of
 * it: kinds, consts, enums, unions, every property in the schema's order and
 * no other, array items, local $refs. */
#include "guard_check.h"

#include "../../src/chat/json_schema.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

static bool valid(json_t *root, json_t *s, json_t *v, int depth);

static bool of_type(json_t *root, json_t *s, const char *t, json_t *v, int depth)
{
    if (!strcmp(t, "string"))
        return json_is_string(v);
    if (!strcmp(t, "number"))
        return json_is_number(v);
    if (!strcmp(t, "integer"))
        return json_is_integer(v);
    if (!strcmp(t, "boolean"))
        return json_is_boolean(v);
    if (!strcmp(t, "null"))
        return json_is_null(v);
    if (!strcmp(t, "object")) {
        json_t *props = json_object_get(s, "properties");
        if (!json_is_object(v) || (props && json_object_size(v) != json_object_size(props)))
            return false;
        void *it = json_object_iter(v);
        const char *key;
        json_t *sub;
        json_object_foreach(props, key, sub) {
            if (!it || strcmp(json_object_iter_key(it), key) || !valid(root, sub, json_object_iter_value(it), depth + 1))
                return false;
            it = json_object_iter_next(v, it);
        }
        return true;
    }
    if (!strcmp(t, "array")) {
        json_t *items = json_object_get(s, "items"), *e;
        size_t i;
        if (!json_is_array(v))
            return false;
        json_array_foreach(v, i, e) if (items && !valid(root, items, e, depth + 1)) return false;
        return true;
    }
    return false;
}

static bool valid(json_t *root, json_t *s, json_t *v, int depth)
{
    if (depth > 64)
        return false;
    if (json_is_true(s))
        return true;
    json_t *ref = json_object_get(s, "$ref"), *c = json_object_get(s, "const"), *en = json_object_get(s, "enum");
    json_t *any = json_object_get(s, "anyOf"), *type = json_object_get(s, "type"), *a;
    size_t i;
    if (ref) { /* "#/a/b": this file's walk, without escapes */
        json_t *at = root;
        char *path = strdup(json_string_value(ref) + 2), *save = NULL;
        for (char *p = strtok_r(path, "/", &save); p && at; p = strtok_r(NULL, "/", &save))
            at = json_object_get(at, p);
        free(path);
        return at && valid(root, at, v, depth + 1);
    }
    if (c)
        return json_equal(c, v);
    if (en) {
        json_array_foreach(en, i, a) if (json_equal(a, v)) return true;
        return false;
    }
    if (any) {
        json_array_foreach(any, i, a) if (valid(root, a, v, depth + 1)) return true;
        return false;
    }
    if (json_is_array(type)) {
        json_array_foreach(type, i, a) if (of_type(root, s, json_string_value(a), v, depth)) return true;
        return false;
    }
    if (json_is_string(type))
        return of_type(root, s, json_string_value(type), v, depth);
    if (json_object_get(s, "properties"))
        return of_type(root, s, "object", v, depth);
    if (json_object_get(s, "items"))
        return of_type(root, s, "array", v, depth);
    return true;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    const unsigned char *nul = memchr(data, 0, size);
    if (!nul || memchr(data, '~', (size_t)(nul - data))) /* $ref escapes: not in this file's reading */
        return 0;
    json_t *schema = json_loadb((const char *)data, (size_t)(nul - data), 0, NULL);
    const char *text = (const char *)nul + 1;
    const size_t n = size - (size_t)(nul - data) - 1;
    struct grammar gm;
    grammar_init(&gm);
    char err[256];
    if (schema && json_schema_grammar(&gm, schema, err, sizeof err) == 0) {
        if (guard_takes(&gm, text, n, false) && !json_beyond_jansson(text, n)) {
            json_error_t e;
            json_t *v = json_loadb(text, n, 0, &e);
            if (!v || !valid(schema, schema, v, 0))
                abort();
            json_decref(v);
        }
    }
    grammar_free(&gm);
    json_decref(schema);
    return 0;
}
