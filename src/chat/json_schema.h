/* json_schema: a JSON schema (response_format json_schema; the subset OpenAI's
 * structured outputs take in strict mode) as a grammar for constrained
 * decoding. The output is one JSON object the schema describes, every
 * property present, in the schema's order.
 *
 * Understood: type (one, or a list of primitives, or one object or array
 * type with "null"), properties, required, additionalProperties, items,
 * enum, const, anyOf (the same combinations as type lists; one primitive
 * alternative may carry bounds), local $ref into $defs or definitions (not
 * recursive), the annotations (description, title, default, examples,
 * $schema, $id, $comment, strict), and bounds the grammar enforces: minimum,
 * maximum, exclusiveMinimum, exclusiveMaximum (a bounded number is written
 * without exponent), minLength, maxLength, minItems, maxItems (the items
 * written out up to maxItems), format date, time, date-time, uuid, email,
 * uri (grammar.h's strict forms), and pattern beside such a format only.
 * A keyword that would constrain values further (pattern alone, another
 * format, oneOf, ...) is refused rather than left unenforced. Every number
 * is a finite double and every integer exact (json_guard.h). */
#ifndef KP_JSON_SCHEMA_H
#define KP_JSON_SCHEMA_H

#include "../grammar/grammar.h"

#include <jansson.h>
#include <stddef.h>

#define JSON_SCHEMA_MAX_DEPTH 32

/* Builds the grammar of schema (whose top is an object schema) into g
 * (grammar_init'ed, empty). -1 with a message in err naming what is not
 * supported. */
int json_schema_grammar(struct grammar *g, json_t *schema, char *err, size_t n_err);
/* Appends to g the segments of one object that schema describes (a strict
 * tool's parameters), the segment appended next following them. forbid:
 * NULL, or a text no part of the object may contain (a format's closing
 * tag, as grammar_json's; the schema's own texts then escape '/'). */
int json_schema_append(struct grammar *g, json_t *schema, const char *forbid, char *err, size_t n_err);
/* Appends to g a strict tool's parameters in the XML tool-call format (the
 * Qwen3-Coder template's): each property of object schema in order, as
 * <parameter=NAME> blocks the parser reads back as the schema's values. A
 * property of type "string" is raw text (an enum or const its raw strings);
 * one of another type, or a list of types, one JSON value of its schema
 * (no "</" in its strings: '/' escaped); one without a type only an enum or
 * const of strings. -1 with a message in err for what cannot be written. */
int json_schema_xml_params(struct grammar *g, json_t *schema, char *err, size_t n_err);

#endif
