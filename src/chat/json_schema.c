/* json_schema: a schema walked once, each part appending the grammar
 * segments of the values it allows (an object's literal keys between its
 * values, an array's loop, an enum's encoded values as names, primitives as
 * JSON values of their kinds). See json_schema.h. */
#include "json_schema.h"

#include "../base/err.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WS GRAMMAR_WS

struct walk {
    json_t *root;
    struct grammar *g;
    const char *forbid; /* a text no value may contain, or NULL */
    size_t dump;        /* json_dumps' flags for the schema's own texts */
    char *err;
    size_t n_err;
};

static int fail(struct walk *w, const char *fmt, ...) KP_PRINTF(2, 3);

static int fail(struct walk *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err, w->n_err, fmt, ap);
    va_end(ap);
    return -1;
}

/* a segment added: -1 (the grammar's message) when it was not */
static int added(struct walk *w, int32_t seg)
{
    if (seg >= 0)
        return 0;
    snprintf(w->err, w->n_err, "json_schema: %s", err_msg());
    return -1;
}

static int32_t value(struct walk *w, unsigned kinds) { return grammar_value(w->g, kinds, w->forbid); }

/* WS + the value's compact JSON text, as a literal */
static int lit_json(struct walk *w, json_t *v)
{
    char *s = json_dumps(v, w->dump);
    if (!s)
        return fail(w, "json_schema: out of memory");
    char *t = malloc(strlen(s) + 2);
    int rc = t ? 0 : fail(w, "json_schema: out of memory");
    if (t) {
        strcpy(t, WS);
        strcat(t, s);
        rc = added(w, grammar_lit(w->g, t));
    }
    free(t);
    free(s);
    return rc;
}

/* The kind of a primitive type name, 0 for object, array or an unknown one. */
static unsigned primitive(const char *type)
{
    static const struct {
        const char *name;
        unsigned kind;
    } t[] = {{"string", GRAM_V_STRING}, {"number", GRAM_V_NUMBER}, {"integer", GRAM_V_INTEGER},
             {"boolean", GRAM_V_BOOL},  {"null", GRAM_V_NULL}};
    for (size_t i = 0; type && i < sizeof t / sizeof *t; i++)
        if (strcmp(type, t[i].name) == 0)
            return t[i].kind;
    return 0;
}

static int emit(struct walk *w, json_t *s, int depth);

static const char *const known[] = {"type", "properties", "required", "additionalProperties", "items", "enum",
                                     "const", "anyOf", "$ref", "$defs", "definitions", "description", "title",
                                     "default", "examples", "$schema", "$id", "$comment", "strict"};
/* the keywords that bound a value (bounds(), array()) */
static const char *const bounding[] = {"minimum",   "maximum",   "exclusiveMinimum", "exclusiveMaximum", "minLength",
                                       "maxLength", "minItems",  "maxItems",         "format",           "pattern"};

static bool among(const char *key, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(key, list[i]))
            return true;
    return false;
}

/* -1 (w's message) if schema object s has a keyword the grammar cannot enforce */
static int keywords(struct walk *w, json_t *s)
{
    const char *key;
    json_t *v;
    json_object_foreach(s, key, v) {
        (void)v;
        if (!among(key, known, sizeof known / sizeof *known) && !among(key, bounding, sizeof bounding / sizeof *bounding))
            return fail(w, "json_schema: '%.64s' is not supported (it would not be enforced)", key);
    }
    return 0;
}

/* A count keyword of s (minLength, maxItems, ...) into *n: absent leaves it. */
static int count_of(struct walk *w, json_t *s, const char *key, json_int_t *n)
{
    json_t *v = json_object_get(s, key);
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX)
        return fail(w, "json_schema: '%s' must be a count (a non-negative integer)", key);
    *n = json_integer_value(v);
    return 0;
}

static const char *const formats[] = {[GRAM_F_DATE] = "date", [GRAM_F_TIME] = "time", [GRAM_F_DATE_TIME] = "date-time",
                                      [GRAM_F_UUID] = "uuid", [GRAM_F_EMAIL] = "email", [GRAM_F_URI] = "uri"};

/* The bounds schema s puts on value segment seg: a number's range
 * (minimum, maximum, exclusive*), a string's length and format. A pattern
 * is taken beside a format only: the format's strict form (grammar.h) is
 * what the patterns clients write for it (zod's) accept; alone it is
 * refused. */
static int bounds(struct walk *w, json_t *s, int32_t seg)
{
    static const char *const range[4] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    double lo = -HUGE_VAL, hi = HUGE_VAL;
    bool lo_open = false, hi_open = false, ranged = false;
    for (int i = 0; i < 4; i++) {
        json_t *v = json_object_get(s, range[i]);
        if (!v)
            continue;
        if (!json_is_number(v))
            return fail(w, "json_schema: '%s' must be a number", range[i]);
        const double x = json_number_value(v);
        ranged = true;
        if (i < 2 && (x > lo || (x == lo && i == 1))) {
            lo = x;
            lo_open = i == 1;
        } else if (i >= 2 && (x < hi || (x == hi && i == 3))) {
            hi = x;
            hi_open = i == 3;
        }
    }
    if (ranged && grammar_value_range(w->g, seg, lo, lo_open, hi, hi_open) != 0)
        return fail(w, "json_schema: %s", err_msg());
    json_int_t min_len = 0, max_len = UINT32_MAX;
    if (count_of(w, s, "minLength", &min_len) != 0 || count_of(w, s, "maxLength", &max_len) != 0)
        return -1;
    json_t *fv = json_object_get(s, "format");
    enum grammar_format f = GRAM_F_NONE;
    if (fv) {
        const char *name = json_string_value(fv);
        for (size_t i = 1; name && i < sizeof formats / sizeof *formats && !f; i++)
            if (!strcmp(name, formats[i]))
                f = (enum grammar_format)i;
        if (!f)
            return fail(w, "json_schema: format '%.32s' is not supported (date, time, date-time, uuid, email and uri are)",
                        name ? name : "");
    }
    if (json_object_get(s, "pattern") && !f)
        return fail(w, "json_schema: 'pattern' is not supported (it would not be enforced); a format is");
    if ((min_len > 0 || max_len < UINT32_MAX || f) &&
        grammar_value_string(w->g, seg, (uint32_t)min_len, (uint32_t)max_len, f) != 0)
        return fail(w, "json_schema: %s", err_msg());
    return 0;
}

/* One JSON value of the kinds given, bounded as schema s says (NULL: not). */
static int bounded_value(struct walk *w, unsigned kinds, json_t *s)
{
    const int32_t seg = value(w, kinds);
    if (added(w, seg) != 0)
        return -1;
    return s ? bounds(w, s, seg) : 0;
}

/* Whether alternative a of an anyOf is a primitive type alone, with annotations or bounds. */
static bool plain_primitive(json_t *a)
{
    static const char *const not[] = {"enum", "const", "anyOf", "$ref", "properties", "items"};
    if (!primitive(json_string_value(json_object_get(a, "type"))))
        return false;
    for (size_t i = 0; i < sizeof not / sizeof *not; i++)
        if (json_object_get(a, not[i]))
            return false;
    return true;
}

/* Whether schema s has a keyword that bounds a value (bounds()'s). */
static bool has_bounds(json_t *s)
{
    for (size_t i = 0; i < sizeof bounding / sizeof *bounding; i++)
        if (json_object_get(s, bounding[i]))
            return true;
    return false;
}

/* A value of schema s, or null: a choice between the literal and s (no
 * JSON value but null begins with 'n'). */
static int nullable(struct walk *w, json_t *s, int depth)
{
    const int32_t alt = grammar_alt(w->g, "null", NULL);
    if (added(w, alt) != 0)
        return -1;
    grammar_else(w->g, alt, w->g->n_seg);
    if (emit(w, s, depth) != 0)
        return -1;
    grammar_jump(w->g, alt, 0, w->g->n_seg);
    return 0;
}

/* A list of alternatives (type names, or anyOf's schemas): primitives
 * merged into one value's kinds, or one object or array schema with null.
 * Bounds: a type list's are s's; of anyOf's primitives one may have bounds,
 * if no other alternative is of the kind they bound. */
static int union_of(struct walk *w, json_t *s, json_t *list, bool types, int depth)
{
    unsigned kinds = 0, bounded_kinds = 0;
    json_t *other = NULL, *bounded = types ? s : NULL;
    size_t i;
    json_t *a;
    json_array_foreach(list, i, a) {
        const char *name = types ? json_string_value(a) : json_string_value(json_object_get(a, "type"));
        const unsigned k = primitive(name);
        if (k && !types && plain_primitive(a)) {
            if (keywords(w, a) != 0)
                return -1;
            const unsigned cls = k & (GRAM_V_NUMBER | GRAM_V_INTEGER) ? GRAM_V_NUMBER | GRAM_V_INTEGER : k;
            if (has_bounds(a)) {
                if (bounded || (kinds & cls))
                    return fail(w, "json_schema: anyOf: bounds on one primitive alternative only, none other of its kind");
                bounded = a;
                bounded_kinds = cls;
            } else if (cls & bounded_kinds) {
                return fail(w, "json_schema: anyOf: bounds on one primitive alternative only, none other of its kind");
            }
            kinds |= k;
        } else if (k && types) {
            kinds |= k;
        } else if (!other && (!types || (name && (!strcmp(name, "object") || !strcmp(name, "array"))))) {
            other = a;
        } else {
            return fail(w, "json_schema: %s: only primitive types, or one object or array with null, are supported",
                        types ? "a list of types" : "anyOf");
        }
    }
    if (!other)
        return kinds ? bounded_value(w, kinds, bounded)
                     : fail(w, "json_schema: %s is empty", types ? "type" : "anyOf");
    if (kinds != GRAM_V_NULL)
        return fail(w, "json_schema: %s: an object or array may be combined with null only",
                    types ? "a list of types" : "anyOf");
    if (!types)
        return nullable(w, other, depth);
    /* the same schema with its container type alone */
    json_t *one = json_copy(s);
    const int rc = one && json_object_set(one, "type", other) == 0 ? nullable(w, one, depth)
                                                                   : fail(w, "json_schema: out of memory");
    json_decref(one);
    return rc;
}

static int object(struct walk *w, json_t *props, int depth)
{
    if (added(w, grammar_lit(w->g, WS "{")) != 0)
        return -1;
    const char *key;
    json_t *sub;
    bool first = true;
    json_object_foreach(props, key, sub) {
        json_t *k = json_string(key);
        char *ks = k ? json_dumps(k, w->dump) : NULL;
        json_decref(k);
        char *t = ks ? malloc(strlen(ks) + 8) : NULL;
        if (t)
            snprintf(t, strlen(ks) + 8, "%s" WS "%s" WS ":", first ? "" : WS ",", ks);
        const int rc = t ? added(w, grammar_lit(w->g, t)) : fail(w, "json_schema: out of memory");
        free(t);
        free(ks);
        if (rc != 0 || emit(w, sub, depth + 1) != 0)
            return -1;
        first = false;
    }
    return added(w, grammar_lit(w->g, WS "}"));
}

/* An array of items: minItems of them, then up to maxItems, each place
 * after the first minItems a choice between another and the end. Bounded,
 * the items are written out (maxItems copies: a grammar too large for
 * GRAMMAR_MAX_SEG is refused); unbounded, the last copy loops. */
static int array(struct walk *w, json_t *s, json_t *items, int depth)
{
    json_int_t lo = 0, hi = -1;
    if (count_of(w, s, "minItems", &lo) != 0 || count_of(w, s, "maxItems", &hi) != 0)
        return -1;
    if (json_object_get(s, "maxItems") && hi < lo)
        return fail(w, "json_schema: minItems is more than maxItems");
    if (added(w, grammar_lit(w->g, WS "[")) != 0)
        return -1;
    if (hi == 0)
        return added(w, grammar_lit(w->g, WS "]"));
    /* the choices whose "]" (alternative 1; an empty array's: 0) goes past the array */
    int32_t *ends = NULL, n_ends = 0, empty = -1;
    int rc = 0;
    if (lo == 0 && (rc = added(w, empty = grammar_alt(w->g, "]", NULL))) == 0)
        grammar_else(w->g, empty, w->g->n_seg);
    for (json_int_t k = 1; rc == 0; k++) {
        const int32_t item = w->g->n_seg;
        if ((rc = emit(w, items, depth + 1)) != 0)
            break;
        if (k < lo) {
            rc = added(w, grammar_lit(w->g, WS ","));
            continue;
        }
        if (k == hi) {
            rc = added(w, grammar_lit(w->g, WS "]"));
            break;
        }
        const int32_t more = grammar_alt(w->g, ",", "]");
        int32_t *e = more >= 0 ? realloc(ends, (size_t)(n_ends + 1) * sizeof *ends) : NULL;
        if ((rc = added(w, more)) != 0 || (!e && (rc = fail(w, "json_schema: out of memory")) != 0))
            break;
        ends = e;
        ends[n_ends++] = more;
        if (hi < 0) { /* unbounded: another item is this one again */
            grammar_jump(w->g, more, 0, item);
            break;
        }
    }
    for (int32_t i = 0; rc == 0 && i < n_ends; i++)
        grammar_jump(w->g, ends[i], 1, w->g->n_seg);
    if (rc == 0 && empty >= 0)
        grammar_jump(w->g, empty, 0, w->g->n_seg);
    free(ends);
    return rc;
}

/* the schema a local $ref points at ("#/$defs/A", "#/definitions/A/..."), or NULL */
static json_t *resolve(struct walk *w, const char *ref)
{
    if (strncmp(ref, "#/", 2) != 0)
        return NULL;
    json_t *at = w->root;
    char part[256];
    for (const char *p = ref + 2; at && *p;) {
        size_t n = strcspn(p, "/"), o = 0;
        for (size_t i = 0; i < n && o + 1 < sizeof part; i++) { /* JSON pointer escapes: ~1 is /, ~0 is ~ */
            if (p[i] == '~' && i + 1 < n && (p[i + 1] == '0' || p[i + 1] == '1'))
                part[o++] = p[++i] == '1' ? '/' : '~';
            else
                part[o++] = p[i];
        }
        part[o] = 0;
        at = json_object_get(at, part);
        p += n + (p[n] == '/');
    }
    return at;
}

static int emit(struct walk *w, json_t *s, int depth)
{
    if (depth > JSON_SCHEMA_MAX_DEPTH)
        return fail(w, "json_schema: nested deeper than %d levels, or a recursive $ref", JSON_SCHEMA_MAX_DEPTH);
    if (json_is_true(s))
        return added(w, value(w, 127));
    if (!json_is_object(s))
        return fail(w, "json_schema: a schema must be an object");
    if (keywords(w, s) != 0)
        return -1;
    json_t *ref = json_object_get(s, "$ref"), *type = json_object_get(s, "type");
    json_t *en = json_object_get(s, "enum"), *any = json_object_get(s, "anyOf");
    if (ref) {
        json_t *to = json_is_string(ref) ? resolve(w, json_string_value(ref)) : NULL;
        return to ? emit(w, to, depth + 1) : fail(w, "json_schema: $ref '%.64s' does not name a local schema",
                                                  json_is_string(ref) ? json_string_value(ref) : "");
    }
    if (json_object_get(s, "const"))
        return lit_json(w, json_object_get(s, "const"));
    if (en) {
        if (!json_is_array(en) || json_array_size(en) == 0)
            return fail(w, "json_schema: enum must be a non-empty list");
        const size_t n = json_array_size(en);
        char **names = calloc(n, sizeof *names);
        int rc = names ? 0 : fail(w, "json_schema: out of memory");
        for (size_t i = 0; rc == 0 && i < n; i++)
            if (!(names[i] = json_dumps(json_array_get(en, i), w->dump)))
                rc = fail(w, "json_schema: out of memory");
        if (rc == 0)
            rc = added(w, grammar_names(w->g, (const char *const *)names, (int32_t)n, true));
        for (size_t i = 0; names && i < n; i++)
            free(names[i]);
        free(names);
        return rc;
    }
    if (any)
        return json_is_array(any) ? union_of(w, s, any, false, depth) : fail(w, "json_schema: anyOf must be a list");
    if (json_is_array(type))
        return union_of(w, s, type, true, depth);
    const char *t = json_string_value(type);
    json_t *props = json_object_get(s, "properties"), *items = json_object_get(s, "items");
    if (type && !t)
        return fail(w, "json_schema: type must be a string or a list");
    if (t && primitive(t))
        return bounded_value(w, primitive(t), s);
    if ((t && !strcmp(t, "object")) || (!t && props)) {
        if (props && !json_is_object(props))
            return fail(w, "json_schema: properties must be an object");
        return props ? object(w, props, depth) : added(w, value(w, GRAM_V_OBJECT));
    }
    if ((t && !strcmp(t, "array")) || (!t && items))
        return items || json_object_get(s, "minItems") || json_object_get(s, "maxItems")
                   ? array(w, s, items ? items : json_true(), depth)
                   : added(w, value(w, GRAM_V_ARRAY));
    if (t)
        return fail(w, "json_schema: type '%.32s' is not a JSON type", t);
    return bounded_value(w, 127, s); /* no type: any value, bounded where it is a number or a string */
}

int json_schema_append(struct grammar *g, json_t *schema, const char *forbid, char *err, size_t n_err)
{
    /* a format's closing tag is never in the schema's texts either: '/'
     * escaped, "</x>" is written "<\/x>" */
    struct walk w = {schema, g, forbid, JSON_ENCODE_ANY | JSON_COMPACT | (forbid ? JSON_ESCAPE_SLASH : 0), err, n_err};
    const char *t = json_string_value(json_object_get(schema, "type"));
    if (!json_is_object(schema) || !(t ? !strcmp(t, "object") : json_is_object(json_object_get(schema, "properties"))))
        return fail(&w, "json_schema: the schema's top must be an object schema");
    return emit(&w, schema, 0);
}

/* A raw text in the XML format (a parameter's name, or a string value the
 * parser keeps as it is): no newline, no tag. */
static bool xml_raw_ok(const char *t) { return t[0] && !strpbrk(t, "<>\n"); }

/* A parameter the parser reads as a string (its type "string", or none): its
 * raw text, the template's newlines around it. */
static int xml_string(struct walk *w, const char *key, json_t *s)
{
    json_t *en = json_object_get(s, "enum"), *c = json_object_get(s, "const");
    if (!en && !c) {
        if (!json_object_get(s, "type"))
            return fail(w, "json_schema: parameter '%.64s' needs a type in the XML tool-call format", key);
        /* any text up to the closing tag; the call's own would end the call */
        const int32_t v = grammar_until(w->g, "</parameter>", "</tool_call>", NULL);
        if (added(w, v) != 0)
            return -1;
        grammar_jump(w->g, v, 1, GRAMMAR_REFUSE);
        return 0;
    }
    json_t *list = en ? en : c;
    const size_t n = en ? json_array_size(en) : 1;
    const char **names = calloc(n ? n : 1, sizeof *names);
    if (!names)
        return fail(w, "json_schema: out of memory");
    int rc = en && (!json_is_array(en) || n == 0) ? fail(w, "json_schema: enum must be a non-empty list") : 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        names[i] = json_string_value(en ? json_array_get(list, i) : list);
        if (!names[i] || !xml_raw_ok(names[i]))
            rc = fail(w, "json_schema: parameter '%.64s': in the XML tool-call format its values must be strings "
                         "without newlines or <>, or it needs a type", key);
    }
    if (rc == 0)
        rc = added(w, grammar_lit(w->g, "\n")) || added(w, grammar_names(w->g, names, (int32_t)n, false)) ||
                     added(w, grammar_lit(w->g, "\n</parameter>"))
                 ? -1
                 : 0;
    free(names);
    return rc;
}

int json_schema_xml_params(struct grammar *g, json_t *schema, char *err, size_t n_err)
{
    struct walk w = {schema, g, "</", JSON_ENCODE_ANY | JSON_COMPACT | JSON_ESCAPE_SLASH, err, n_err};
    json_t *props = json_object_get(schema, "properties");
    if (!json_is_object(schema) || keywords(&w, schema) != 0)
        return json_is_object(schema) ? -1 : fail(&w, "json_schema: the schema's top must be an object schema");
    const char *t = json_string_value(json_object_get(schema, "type"));
    if ((t && strcmp(t, "object")) || (!t && !props) || (props && !json_is_object(props)))
        return fail(&w, "json_schema: the schema's top must be an object schema with properties");
    const char *key;
    json_t *s;
    json_object_foreach(props, key, s) {
        if (!xml_raw_ok(key) || strlen(key) > 256)
            return fail(&w, "json_schema: parameter '%.64s': its name cannot be written in the XML tool-call format", key);
        char open[300];
        snprintf(open, sizeof open, WS "<parameter=%s>", key);
        if (added(&w, grammar_lit(g, open)) != 0)
            return -1;
        json_t *ty = json_object_get(s, "type");
        if (!json_is_object(s) || keywords(&w, s) != 0)
            return json_is_object(s) ? -1 : fail(&w, "json_schema: parameter '%.64s' must be a schema object", key);
        /* as the parser reads it: a "string" type, or none, keeps the text
         * raw; any other type, or a list of them, is JSON */
        if (!ty || (json_is_string(ty) && !strcmp(json_string_value(ty), "string"))) {
            if (has_bounds(s)) /* the raw text runs to its closing tag: nothing counts or checks it */
                return fail(&w, "json_schema: parameter '%.64s': a string's minLength, maxLength, format or pattern "
                                "is not supported in the XML tool-call format", key);
            if (xml_string(&w, key, s) != 0)
                return -1;
        } else if (emit(&w, s, 1) != 0 || added(&w, grammar_lit(g, WS "</parameter>")) != 0) {
            return -1;
        }
    }
    return 0;
}

int json_schema_grammar(struct grammar *g, json_t *schema, char *err, size_t n_err)
{
    /* one newline and some indentation; a model that would rather stop
     * spends at most this much at each place (a bound on the whole output
     * where every value's spelling is bounded) */
    g->max_ws = 8;
    g->max_nl = 1;
    return json_schema_append(g, schema, NULL, err, n_err);
}
