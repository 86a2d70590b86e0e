/* jinja_impl: the template AST and the value model shared by the parser
 * (jinja_parse.c), the evaluator (jinja_eval.c) and the values' operations
 * (jinja_value.c). Internal to src/chat. */
#ifndef KP_JINJA_IMPL_H
#define KP_JINJA_IMPL_H

#include "../base/arena.h"
#include "../base/err.h"
#include "jinja.h"

#include <jansson.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* ---- AST ---- */

enum node_kind {
    /* statements */
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_MACRO, N_BREAK, N_CONTINUE,
    /* expressions */
    N_STR, N_INT, N_FLOAT, N_BOOL, N_NONE, N_NAME, N_LIST, N_TUPLE, N_DICT,
    N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_NOT, N_NEG, N_BINOP, N_AND, N_OR, N_COND,
};

struct node;

struct node_list {
    int32_t n, cap;
    struct node **v;
};

struct node {
    enum node_kind kind;
    int32_t line;
    const char *s;      /* TEXT, STR, NAME, ATTR name, FILTER/TEST/BINOP name, MACRO name */
    size_t len;         /* of s */
    int64_t i;          /* INT, BOOL; TEST negated */
    double f;           /* FLOAT */
    struct node *a, *b, *c; /* operands: ATTR/ITEM/SLICE/CALL/FILTER/TEST target a; SLICE a[b:c] + d; COND a if b else c */
    struct node *d;     /* SLICE step; FOR filter condition */
    struct node_list args;   /* CALL/FILTER/TEST args, LIST/TUPLE items, DICT k,v,k,v; FOR/SET targets; MACRO params */
    struct node_list kwargs; /* name nodes (N_NAME) and values alternately: k,v,k,v */
    struct node_list body;   /* IF: then, FOR/MACRO body */
    struct node_list other;  /* IF: else (elif nests an IF), FOR: else */
};

/* ---- values ---- */

enum jt { J_UNDEF, J_NONE, J_BOOL, J_INT, J_FLOAT, J_STR, J_LIST, J_DICT, J_MACRO, J_FUNC, J_METHOD };

struct jlist;
struct jdict;

struct jval {
    enum jt t;
    bool ns;          /* J_DICT: a namespace() (attributes assignable) */
    bool tuple;       /* J_LIST: a tuple (prints with parentheses) */
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        struct jlist *l;
        struct jdict *d;
        const struct node *m; /* MACRO */
        int fn;               /* FUNC: builtin id */
    };
    struct jval *self;       /* METHOD: receiver; s holds the method name */
};

struct jlist {
    int32_t n, cap;
    struct jval *v;
};

struct jdict {
    int32_t n, cap;
    struct jval *k; /* string keys */
    struct jval *v;
};

struct jinja_tpl {
    struct arena arena;
    struct node_list body;
};

/* ---- rendering (jinja_eval.c), and the values' operations it shares with
 * jinja_value.c ---- */

#define MAX_STEPS 5000000
#define MAX_OUTPUT (64u << 20)
#define MAX_DEPTH 200
#define MAX_EVAL_DEPTH 400 /* expression nesting: left-deep operator chains recurse */

struct sbuf {
    char *p;
    size_t n, cap;
};

struct frame {
    struct frame *parent;
    struct jdict vars;
};

struct rctx {
    struct arena *a;
    jmp_buf jb;
    struct sbuf *out;
    struct frame *globals;
    int64_t steps;
    int depth;
    int eval_depth;
    int loop_ctl; /* 1 break, 2 continue */
    int32_t line; /* of the node being run, for errors without one */
};

#define JV_UNDEF ((struct jval){.t = J_UNDEF})
#define JV_NONE ((struct jval){.t = J_NONE})

static inline struct jval mk_bool(bool b) { return (struct jval){.t = J_BOOL, .b = b}; }
static inline struct jval mk_int(int64_t i) { return (struct jval){.t = J_INT, .i = i}; }
static inline struct jval mk_float(double f) { return (struct jval){.t = J_FLOAT, .f = f}; }
static inline struct jval mk_str(const char *p, size_t n) { return (struct jval){.t = J_STR, .s = {p, n}}; }
static inline struct jval mk_cstr(const char *p) { return mk_str(p, strlen(p)); }

/* jinja_value.c: errors (a longjmp to jinja_render, the message set), the
 * render's arena, the output buffer, lists and dicts, Python's str() / repr()
 * / json.dumps, and strings by code point */
_Noreturn void jv_rerr(struct rctx *r, int32_t line, const char *fmt, ...) KP_PRINTF(3, 4);
void *jv_ralloc(struct rctx *r, size_t n);
void jv_sb_put(struct rctx *r, struct sbuf *b, const char *s, size_t n);
struct jval jv_mk_list(struct rctx *r, int32_t cap);
void jv_list_add(struct rctx *r, struct jlist *l, struct jval v);
struct jval jv_mk_dict(struct rctx *r);
struct jval *jv_dict_find(const struct jdict *d, const char *k, size_t n);
void jv_dict_set(struct rctx *r, struct jdict *d, struct jval k, struct jval v);
struct jval jv_from_json(struct rctx *r, json_t *j);
bool jv_truthy(struct jval v);
const char *jv_type_name(struct jval v);
void jv_put_str(struct rctx *r, struct sbuf *b, struct jval v);
struct jval jv_to_str(struct rctx *r, struct jval v);
void jv_put_json(struct rctx *r, struct sbuf *b, struct jval v, int indent, int level, bool sort_keys, int32_t line);
size_t jv_cp_count(const char *s, size_t n);
size_t jv_cp_offset(const char *s, size_t n, size_t k);
bool jv_is_py_space_at(const char *s, size_t n, size_t i, size_t *len);
struct jval jv_strip(struct jval s, const struct jval *chars, bool left, bool right);

#endif
