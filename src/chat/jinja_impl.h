/* jinja_impl: the template AST and the value model shared by the parser
 * (jinja_parse.c) and the evaluator (jinja_eval.c). Internal to src/chat. */
#ifndef KP_JINJA_IMPL_H
#define KP_JINJA_IMPL_H

#include "../base/arena.h"
#include "jinja.h"

#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>

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

#endif
