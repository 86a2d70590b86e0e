/* jinja_parse: lexer and recursive-descent parser for the chat-template subset
 * of Jinja2 (see jinja.h). Whitespace handling follows Jinja's lexer with
 * trim_blocks and lstrip_blocks on (transformers' settings): the first newline
 * after a block or comment tag is dropped, spaces and tabs between a line start
 * and a block or comment tag are dropped; "-" strips all whitespace on its
 * side, "+" keeps it; one trailing newline of the template is dropped. */
#include "../base/err.h"
#include "jinja_impl.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

enum tok_kind { T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP, T_EOF };

struct tok {
    enum tok_kind kind;
    const char *s; /* TEXT/NAME/OP: source; STRING: decoded (arena) */
    size_t len;
    int32_t line;
};

struct parser {
    struct arena *a;
    struct tok *t;
    int32_t n, cap, pos;
    int32_t depth; /* nesting of expressions and blocks, bounded: the parser recurses */
    jmp_buf jb;
};

#define MAX_NESTING 100

static _Noreturn void perr(struct parser *p, int32_t line, const char *msg, const char *what, size_t wlen)
{
    err_set("jinja: line %d: %s%s%.*s%s", line, msg, what ? " '" : "", (int)(what ? wlen : 0), what ? what : "",
            what ? "'" : "");
    longjmp(p->jb, 1);
}

static void enter(struct parser *p)
{
    if (++p->depth > MAX_NESTING)
        perr(p, p->t[p->pos].line, "template nested too deeply", NULL, 0);
}

static void *palloc(struct parser *p, size_t n)
{
    void *m = arena_alloc(p->a, n);
    if (!m)
        perr(p, 0, "out of memory", NULL, 0);
    return m;
}

static void push_tok(struct parser *p, enum tok_kind k, const char *s, size_t len, int32_t line)
{
    if (p->n == p->cap) {
        int32_t nc = p->cap ? p->cap * 2 : 256;
        struct tok *nt = palloc(p, (size_t)nc * sizeof *nt);
        if (p->n)
            memcpy(nt, p->t, (size_t)p->n * sizeof *nt);
        p->t = nt;
        p->cap = nc;
    }
    p->t[p->n++] = (struct tok){k, s, len, line};
}

static int32_t count_lines(const char *s, size_t n)
{
    int32_t l = 0;
    for (size_t i = 0; i < n; i++)
        l += s[i] == '\n';
    return l;
}

/* Decodes a Python/Jinja string literal body (between quotes) into the arena. */
static const char *unescape(struct parser *p, const char *s, size_t n, size_t *out_len, int32_t line)
{
    char *o = palloc(p, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 == n) {
            o[k++] = s[i];
            continue;
        }
        char c = s[++i];
        switch (c) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case '\n': break;
        default:
            if (c == 'u' || c == 'x' || c == 'U') {
                int nd = c == 'x' ? 2 : c == 'u' ? 4 : 8;
                unsigned v = 0;
                if (i + (size_t)nd >= n + 1)
                    perr(p, line, "bad escape in string literal", NULL, 0);
                for (int d = 0; d < nd; d++) {
                    char h = s[i + 1 + (size_t)d];
                    if (!isxdigit((unsigned char)h))
                        perr(p, line, "bad escape in string literal", NULL, 0);
                    v = v * 16 + (unsigned)(isdigit((unsigned char)h) ? h - '0' : (tolower((unsigned char)h) - 'a' + 10));
                }
                i += (size_t)nd;
                /* UTF-8 encode */
                if (v < 0x80)
                    o[k++] = (char)v;
                else if (v < 0x800) {
                    o[k++] = (char)(0xc0 | (v >> 6));
                    o[k++] = (char)(0x80 | (v & 0x3f));
                } else if (v < 0x10000) {
                    o[k++] = (char)(0xe0 | (v >> 12));
                    o[k++] = (char)(0x80 | ((v >> 6) & 0x3f));
                    o[k++] = (char)(0x80 | (v & 0x3f));
                } else {
                    o[k++] = (char)(0xf0 | (v >> 18));
                    o[k++] = (char)(0x80 | ((v >> 12) & 0x3f));
                    o[k++] = (char)(0x80 | ((v >> 6) & 0x3f));
                    o[k++] = (char)(0x80 | (v & 0x3f));
                }
            } else { /* unknown escapes stay as written, as in Python */
                o[k++] = '\\';
                o[k++] = c;
            }
        }
    }
    *out_len = k;
    return o;
}

/* Tokenises the inside of a tag up to its closer; returns the offset after it. */
static size_t lex_tag(struct parser *p, const char *src, size_t n, size_t i, char closer, int32_t *line, bool *strip_after)
{
    static const char *const ops2[] = {"==", "!=", "<=", ">=", "//", "**"};
    for (;;) {
        while (i < n && (src[i] == ' ' || src[i] == '\t' || src[i] == '\n' || src[i] == '\r')) {
            *line += src[i] == '\n';
            i++;
        }
        if (i >= n)
            perr(p, *line, "unterminated tag", NULL, 0);
        if (src[i] == '-' && i + 2 < n + 0 && src[i + 1] == closer && src[i + 2] == '}') {
            *strip_after = true;
            return i + 3;
        }
        if (src[i] == '+' && i + 2 < n && src[i + 1] == closer && src[i + 2] == '}')
            return i + 3;
        if (src[i] == closer && i + 1 < n && src[i + 1] == '}') {
            *strip_after = false;
            return i + 2;
        }
        char c = src[i];
        size_t b = i;
        if (isalpha((unsigned char)c) || c == '_') {
            while (i < n && (isalnum((unsigned char)src[i]) || src[i] == '_'))
                i++;
            push_tok(p, T_NAME, src + b, i - b, *line);
        } else if (isdigit((unsigned char)c)) {
            bool fl = false;
            while (i < n && (isdigit((unsigned char)src[i]) || src[i] == '_'))
                i++;
            if (i + 1 < n && src[i] == '.' && isdigit((unsigned char)src[i + 1])) {
                fl = true;
                i++;
                while (i < n && isdigit((unsigned char)src[i]))
                    i++;
            }
            if (i < n && (src[i] == 'e' || src[i] == 'E')) {
                size_t j = i + 1;
                if (j < n && (src[j] == '+' || src[j] == '-'))
                    j++;
                if (j < n && isdigit((unsigned char)src[j])) {
                    fl = true;
                    i = j;
                    while (i < n && isdigit((unsigned char)src[i]))
                        i++;
                }
            }
            push_tok(p, fl ? T_FLOAT : T_INT, src + b, i - b, *line);
        } else if (c == '\'' || c == '"') {
            i++;
            while (i < n && src[i] != c) {
                if (src[i] == '\\')
                    i++;
                else if (src[i] == '\n')
                    (*line)++;
                i++;
            }
            if (i >= n)
                perr(p, *line, "unterminated string literal", NULL, 0);
            size_t ul;
            const char *u = unescape(p, src + b + 1, i - b - 1, &ul, *line);
            push_tok(p, T_STRING, u, ul, *line);
            i++;
        } else {
            size_t l = 1;
            for (size_t k = 0; k < sizeof ops2 / sizeof ops2[0]; k++)
                if (i + 1 < n && src[i] == ops2[k][0] && src[i + 1] == ops2[k][1])
                    l = 2;
            if (!strchr("+-*/%~<>=!()[]{}.,:|", c))
                perr(p, *line, "unexpected character", src + i, 1);
            push_tok(p, T_OP, src + i, l, *line);
            i += l;
        }
    }
}

static void lex(struct parser *p, const char *src, size_t n)
{
    if (n && src[n - 1] == '\n') /* keep_trailing_newline=False */
        n--;
    size_t i = 0;
    int32_t line = 1;
    bool strip_next = false, trim_nl = false;
    while (i <= n) {
        /* next tag opener */
        size_t j = i;
        const char *open = NULL;
        while (j + 1 < n) {
            if (src[j] == '{' && (src[j + 1] == '{' || src[j + 1] == '%' || src[j + 1] == '#')) {
                open = src + j;
                break;
            }
            j++;
        }
        size_t tb = i, te = open ? j : n;
        if (strip_next)
            while (tb < te && isspace((unsigned char)src[tb]))
                tb++;
        else if (trim_nl && tb < te && src[tb] == '\n')
            tb++;
        else if (trim_nl && tb + 1 < te && src[tb] == '\r' && src[tb + 1] == '\n')
            tb += 2;
        int32_t text_line = line + count_lines(src + i, tb - i);
        line += count_lines(src + i, te - i);
        if (!open) {
            if (te > tb)
                push_tok(p, T_TEXT, src + tb, te - tb, text_line);
            break;
        }
        char kind = open[1];
        size_t k = j + 2;
        char mod = k < n ? src[k] : 0;
        if (mod == '-') {
            while (te > tb && isspace((unsigned char)src[te - 1]))
                te--;
            k++;
        } else if (mod == '+') {
            k++;
        } else if (kind != '{') { /* lstrip_blocks: spaces/tabs from the line start */
            size_t s = te;
            while (s > tb && (src[s - 1] == ' ' || src[s - 1] == '\t'))
                s--;
            if ((s == 0) || (s > 0 && src[s - 1] == '\n') || (s == tb && tb > 0 && src[tb - 1] == '\n'))
                te = s;
        }
        if (te > tb)
            push_tok(p, T_TEXT, src + tb, te - tb, text_line);
        bool strip_after = false;
        if (kind == '#') {
            size_t e = k;
            while (e + 1 < n && !(src[e] == '#' && src[e + 1] == '}'))
                e++;
            if (e + 1 >= n)
                perr(p, line, "unterminated comment", NULL, 0);
            strip_after = e > k && src[e - 1] == '-';
            line += count_lines(src + k, e - k);
            i = e + 2;
            strip_next = strip_after;
            trim_nl = true;
            continue;
        }
        push_tok(p, kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, open, 2, line);
        i = lex_tag(p, src, n, k, kind == '{' ? '}' : '%', &line, &strip_after);
        push_tok(p, kind == '{' ? T_VAR_END : T_BLOCK_END, src + i - 2, 2, line);
        strip_next = strip_after;
        trim_nl = kind == '%';
    }
    push_tok(p, T_EOF, "", 0, line);
}

/* ---- parser ---- */

static struct tok *peek(struct parser *p) { return &p->t[p->pos]; }
static struct tok *next(struct parser *p) { return &p->t[p->pos < p->n - 1 ? p->pos++ : p->pos]; }

static bool is_op(const struct tok *t, const char *op)
{
    return t->kind == T_OP && t->len == strlen(op) && memcmp(t->s, op, t->len) == 0;
}

static bool is_name(const struct tok *t, const char *name)
{
    return t->kind == T_NAME && t->len == strlen(name) && memcmp(t->s, name, t->len) == 0;
}

static void expect_op(struct parser *p, const char *op)
{
    struct tok *t = next(p);
    if (!is_op(t, op))
        perr(p, t->line, "expected", op, strlen(op));
}

static struct node *mk(struct parser *p, enum node_kind k, int32_t line)
{
    struct node *n = palloc(p, sizeof *n);
    n->kind = k;
    n->line = line;
    return n;
}

/* The next token, a name (or an integer, with ints: x.0), as a node of kind
 * k carrying it, over a (NULL: none); what is the error when it is not one. */
static struct node *mk_named(struct parser *p, enum node_kind k, struct node *a, bool ints, const char *what)
{
    struct tok *t = next(p);
    if (t->kind != T_NAME && !(ints && t->kind == T_INT))
        perr(p, t->line, what, NULL, 0);
    struct node *n = mk(p, k, t->line);
    n->a = a;
    n->s = t->s;
    n->len = t->len;
    return n;
}

static void list_push(struct parser *p, struct node_list *l, struct node *n)
{
    if (l->n == l->cap) {
        int32_t nc = l->cap ? l->cap * 2 : 4;
        struct node **nv = palloc(p, (size_t)nc * sizeof *nv);
        if (l->n)
            memcpy(nv, l->v, (size_t)l->n * sizeof *nv);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = n;
}

static struct node *parse_expr(struct parser *p);
static struct node *parse_unary(struct parser *p);
static struct node *parse_unary_inner(struct parser *p, struct tok *t);

/* (args, kw=args) after the opening parenthesis */
static void parse_args(struct parser *p, struct node *call)
{
    while (!is_op(peek(p), ")")) {
        struct tok *t = peek(p);
        if (t->kind == T_NAME && is_op(&p->t[p->pos + 1], "=")) {
            next(p);
            next(p);
            struct node *k = mk(p, N_NAME, t->line);
            k->s = t->s;
            k->len = t->len;
            list_push(p, &call->kwargs, k);
            list_push(p, &call->kwargs, parse_expr(p));
        } else {
            list_push(p, &call->args, parse_expr(p));
        }
        if (!is_op(peek(p), ","))
            break;
        next(p);
    }
    expect_op(p, ")");
}

static struct node *parse_primary(struct parser *p)
{
    struct tok *t = next(p);
    struct node *n;
    switch (t->kind) {
    case T_NAME:
        if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") || is_name(t, "False")) {
            n = mk(p, N_BOOL, t->line);
            n->i = t->s[0] == 't' || t->s[0] == 'T';
        } else if (is_name(t, "none") || is_name(t, "None")) {
            n = mk(p, N_NONE, t->line);
        } else {
            n = mk(p, N_NAME, t->line);
            n->s = t->s;
            n->len = t->len;
        }
        return n;
    case T_STRING: {
        n = mk(p, N_STR, t->line);
        n->s = t->s;
        n->len = t->len;
        while (peek(p)->kind == T_STRING) { /* adjacent literals concatenate */
            struct tok *u = next(p);
            char *c = palloc(p, n->len + u->len + 1);
            memcpy(c, n->s, n->len);
            memcpy(c + n->len, u->s, u->len);
            n->s = c;
            n->len += u->len;
        }
        return n;
    }
    case T_INT: {
        n = mk(p, N_INT, t->line);
        for (size_t i = 0; i < t->len; i++)
            if (t->s[i] != '_' && (__builtin_mul_overflow(n->i, 10, &n->i) ||
                                   __builtin_add_overflow(n->i, t->s[i] - '0', &n->i)))
                perr(p, t->line, "integer literal too large", t->s, t->len);
        return n;
    }
    case T_FLOAT: {
        char buf[64];
        size_t k = 0;
        for (size_t i = 0; i < t->len && k < sizeof buf - 1; i++)
            if (t->s[i] != '_')
                buf[k++] = t->s[i];
        buf[k] = 0;
        n = mk(p, N_FLOAT, t->line);
        n->f = strtod(buf, NULL);
        return n;
    }
    case T_OP:
        if (is_op(t, "(")) {
            if (is_op(peek(p), ")")) {
                next(p);
                return mk(p, N_TUPLE, t->line);
            }
            struct node *e = parse_expr(p);
            if (!is_op(peek(p), ",")) {
                expect_op(p, ")");
                return e;
            }
            n = mk(p, N_TUPLE, t->line);
            list_push(p, &n->args, e);
            while (is_op(peek(p), ",")) {
                next(p);
                if (is_op(peek(p), ")"))
                    break;
                list_push(p, &n->args, parse_expr(p));
            }
            expect_op(p, ")");
            return n;
        }
        if (is_op(t, "[")) {
            n = mk(p, N_LIST, t->line);
            while (!is_op(peek(p), "]")) {
                list_push(p, &n->args, parse_expr(p));
                if (!is_op(peek(p), ","))
                    break;
                next(p);
            }
            expect_op(p, "]");
            return n;
        }
        if (is_op(t, "{")) {
            n = mk(p, N_DICT, t->line);
            while (!is_op(peek(p), "}")) {
                list_push(p, &n->args, parse_expr(p));
                expect_op(p, ":");
                list_push(p, &n->args, parse_expr(p));
                if (!is_op(peek(p), ","))
                    break;
                next(p);
            }
            expect_op(p, "}");
            return n;
        }
        break;
    default:
        break;
    }
    perr(p, t->line, "unexpected", t->kind == T_EOF ? "end of template" : t->s, t->kind == T_EOF ? 15 : t->len);
}

static struct node *parse_postfix(struct parser *p, struct node *n)
{
    for (;;) {
        struct tok *t = peek(p);
        if (is_op(t, ".")) {
            next(p);
            n = mk_named(p, N_ATTR, n, true, "expected an attribute name");
        } else if (is_op(t, "[")) {
            next(p);
            struct node *lo = NULL, *hi = NULL, *st = NULL;
            bool slice = false;
            if (!is_op(peek(p), ":"))
                lo = parse_expr(p);
            if (is_op(peek(p), ":")) {
                slice = true;
                next(p);
                if (!is_op(peek(p), "]") && !is_op(peek(p), ":"))
                    hi = parse_expr(p);
                if (is_op(peek(p), ":")) {
                    next(p);
                    if (!is_op(peek(p), "]"))
                        st = parse_expr(p);
                }
            }
            expect_op(p, "]");
            struct node *s = mk(p, slice ? N_SLICE : N_ITEM, t->line);
            s->a = n;
            s->b = lo;
            s->c = hi;
            s->d = st;
            n = s;
        } else if (is_op(t, "(")) {
            next(p);
            struct node *c = mk(p, N_CALL, t->line);
            c->a = n;
            parse_args(p, c);
            n = c;
        } else {
            return n;
        }
    }
}

static struct node *parse_filters(struct parser *p, struct node *n)
{
    for (;;) {
        struct tok *t = peek(p);
        if (is_op(t, "|")) {
            next(p);
            struct node *f = mk_named(p, N_FILTER, n, false, "expected a filter name");
            if (is_op(peek(p), "(")) {
                next(p);
                parse_args(p, f);
            }
            n = f;
        } else if (is_name(t, "is")) {
            next(p);
            struct node *f = mk(p, N_TEST, t->line);
            if (is_name(peek(p), "not")) {
                next(p);
                f->i = 1;
            }
            struct tok *nm = next(p);
            if (nm->kind != T_NAME)
                perr(p, nm->line, "expected a test name", NULL, 0);
            f->a = n;
            f->s = nm->s;
            f->len = nm->len;
            if (is_op(peek(p), "(")) {
                next(p);
                parse_args(p, f);
            } else if (peek(p)->kind == T_STRING || peek(p)->kind == T_INT || peek(p)->kind == T_FLOAT) {
                list_push(p, &f->args, parse_primary(p)); /* e.g. `is divisibleby 3` */
            }
            n = f;
        } else {
            return n;
        }
    }
}

static struct node *parse_unary(struct parser *p)
{
    struct tok *t = peek(p);
    enter(p);
    struct node *r = parse_unary_inner(p, t);
    p->depth--;
    return r;
}

static struct node *parse_unary_inner(struct parser *p, struct tok *t)
{
    if (is_op(t, "-") || is_op(t, "+")) {
        next(p);
        struct node *n = mk(p, N_NEG, t->line);
        n->a = parse_unary(p);
        n->i = t->s[0] == '-';
        return parse_filters(p, n);
    }
    return parse_filters(p, parse_postfix(p, parse_primary(p)));
}

static struct node *binop(struct parser *p, const char *op, struct node *a, struct node *b, int32_t line)
{
    struct node *n = mk(p, N_BINOP, line);
    n->s = op;
    n->len = strlen(op);
    n->a = a;
    n->b = b;
    return n;
}

/* The arithmetic levels, loosest first: a level's operands are the next
 * level's expressions (the last level's, unary ones), its operators left
 * associative. */
static const char *const arith_ops[][4] = {{"~"}, {"+", "-"}, {"*", "/", "//", "%"}, {"**"}};
#define ARITH_LEVELS ((int)(sizeof arith_ops / sizeof arith_ops[0]))

static struct node *parse_arith(struct parser *p, int level)
{
    if (level == ARITH_LEVELS)
        return parse_unary(p);
    struct node *n = parse_arith(p, level + 1);
    for (;;) {
        struct tok *t = peek(p);
        const char *op = NULL;
        for (int i = 0; i < 4 && arith_ops[level][i] && !op; i++)
            if (is_op(t, arith_ops[level][i]))
                op = arith_ops[level][i];
        if (!op)
            return n;
        next(p);
        n = binop(p, op, n, parse_arith(p, level + 1), t->line);
    }
}

static struct node *parse_compare(struct parser *p)
{
    struct node *n = parse_arith(p, 0);
    for (;;) {
        struct tok *t = peek(p);
        const char *op = NULL;
        static const char *const ops[] = {"==", "!=", "<=", ">=", "<", ">"};
        for (size_t i = 0; i < 6 && !op; i++)
            if (is_op(t, ops[i]))
                op = ops[i];
        if (!op && is_name(t, "in"))
            op = "in";
        if (!op && is_name(t, "not") && is_name(&p->t[p->pos + 1], "in")) {
            next(p);
            op = "not in";
        }
        if (!op)
            return n;
        next(p);
        n = binop(p, op, n, parse_arith(p, 0), t->line);
    }
}

static struct node *parse_not(struct parser *p)
{
    if (is_name(peek(p), "not")) {
        enter(p);
        struct node *n = mk(p, N_NOT, next(p)->line);
        n->a = parse_not(p);
        p->depth--;
        return n;
    }
    return parse_compare(p);
}

/* a and b ..., or with is_or a or b ... over and-expressions: left associative */
static struct node *parse_logic(struct parser *p, bool is_or)
{
    struct node *n = is_or ? parse_logic(p, false) : parse_not(p);
    while (is_name(peek(p), is_or ? "or" : "and")) {
        struct node *a = mk(p, is_or ? N_OR : N_AND, next(p)->line);
        a->a = n;
        a->b = is_or ? parse_logic(p, false) : parse_not(p);
        n = a;
    }
    return n;
}

static struct node *parse_expr(struct parser *p)
{
    enter(p);
    struct node *n = parse_logic(p, true);
    while (is_name(peek(p), "if")) {
        struct node *c = mk(p, N_COND, next(p)->line);
        c->a = n;
        c->b = parse_logic(p, true);
        if (is_name(peek(p), "else")) {
            next(p);
            c->c = parse_expr(p);
        }
        n = c;
    }
    p->depth--;
    return n;
}

/* assignment / loop targets: name, name.attr (set only), or a, b */
static void parse_targets(struct parser *p, struct node_list *out, bool allow_attr)
{
    bool paren = is_op(peek(p), "(");
    if (paren)
        next(p);
    for (;;) {
        struct node *n = mk_named(p, N_NAME, NULL, false, "expected a variable name");
        if (allow_attr && is_op(peek(p), ".")) {
            next(p);
            n = mk_named(p, N_ATTR, n, false, "expected an attribute name");
        }
        list_push(p, out, n);
        if (!is_op(peek(p), ","))
            break;
        next(p);
    }
    if (paren)
        expect_op(p, ")");
}

static void expect_block_end(struct parser *p)
{
    struct tok *t = next(p);
    if (t->kind != T_BLOCK_END)
        perr(p, t->line, "expected the end of the tag, found", t->s, t->len);
}

/* Parses nodes until a block tag whose keyword is one of `ends` (NULL-terminated);
 * returns that keyword's index, the tag's keyword consumed. */
static int parse_body(struct parser *p, struct node_list *out, const char *const *ends);

static struct node *parse_if(struct parser *p, int32_t line)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    enter(p);
    struct node *n = mk(p, N_IF, line);
    n->a = parse_expr(p);
    expect_block_end(p);
    int e = parse_body(p, &n->body, ends);
    if (e == 0) {
        list_push(p, &n->other, parse_if(p, p->t[p->pos - 1].line));
        p->depth--;
        return n;
    }
    if (e == 1) {
        static const char *const ends2[] = {"endif", NULL};
        expect_block_end(p);
        parse_body(p, &n->other, ends2);
    }
    expect_block_end(p);
    p->depth--;
    return n;
}

static int parse_body_inner(struct parser *p, struct node_list *out, const char *const *ends);

static int parse_body(struct parser *p, struct node_list *out, const char *const *ends)
{
    enter(p);
    int r = parse_body_inner(p, out, ends);
    p->depth--;
    return r;
}

static int parse_body_inner(struct parser *p, struct node_list *out, const char *const *ends)
{
    for (;;) {
        struct tok *t = next(p);
        if (t->kind == T_EOF) {
            if (ends)
                perr(p, t->line, "missing", ends[0][0] == 'e' && ends[1] == NULL ? ends[0] : "end tag",
                     strlen(ends[0][0] == 'e' && ends[1] == NULL ? ends[0] : "end tag"));
            return -1;
        }
        if (t->kind == T_TEXT) {
            struct node *n = mk(p, N_TEXT, t->line);
            n->s = t->s;
            n->len = t->len;
            list_push(p, out, n);
            continue;
        }
        if (t->kind == T_VAR_BEGIN) {
            struct node *n = mk(p, N_OUT, t->line);
            n->a = parse_expr(p);
            if (next(p)->kind != T_VAR_END)
                perr(p, t->line, "expected '}}'", NULL, 0);
            list_push(p, out, n);
            continue;
        }
        if (t->kind != T_BLOCK_BEGIN)
            perr(p, t->line, "unexpected", t->s, t->len);
        struct tok *kw = next(p);
        if (kw->kind != T_NAME)
            perr(p, kw->line, "expected a statement", NULL, 0);
        for (int i = 0; ends && ends[i]; i++)
            if (is_name(kw, ends[i]))
                return i;
        if (is_name(kw, "if")) {
            list_push(p, out, parse_if(p, kw->line));
        } else if (is_name(kw, "for")) {
            static const char *const ends_for[] = {"else", "endfor", NULL};
            struct node *n = mk(p, N_FOR, kw->line);
            parse_targets(p, &n->args, false);
            if (!is_name(next(p), "in"))
                perr(p, kw->line, "expected 'in' in for loop", NULL, 0);
            n->a = parse_logic(p, true); /* not parse_expr: a trailing `if` filters the loop */
            if (is_name(peek(p), "if")) {
                next(p);
                n->d = parse_expr(p);
            }
            expect_block_end(p);
            if (parse_body(p, &n->body, ends_for) == 0) {
                static const char *const ends_else[] = {"endfor", NULL};
                expect_block_end(p);
                parse_body(p, &n->other, ends_else);
            }
            expect_block_end(p);
            list_push(p, out, n);
        } else if (is_name(kw, "set")) {
            struct node *n = mk(p, N_SET, kw->line);
            parse_targets(p, &n->args, true);
            expect_op(p, "=");
            n->a = parse_expr(p);
            if (is_op(peek(p), ",")) { /* set a, b = x, y */
                struct node *tu = mk(p, N_TUPLE, kw->line);
                list_push(p, &tu->args, n->a);
                while (is_op(peek(p), ",")) {
                    next(p);
                    list_push(p, &tu->args, parse_expr(p));
                }
                n->a = tu;
            }
            expect_block_end(p);
            list_push(p, out, n);
        } else if (is_name(kw, "macro")) {
            static const char *const ends_m[] = {"endmacro", NULL};
            struct node *n = mk(p, N_MACRO, kw->line);
            struct tok *nm = next(p);
            if (nm->kind != T_NAME)
                perr(p, nm->line, "expected a macro name", NULL, 0);
            n->s = nm->s;
            n->len = nm->len;
            expect_op(p, "(");
            while (!is_op(peek(p), ")")) {
                struct node *pn = mk_named(p, N_NAME, NULL, false, "expected a parameter name");
                if (is_op(peek(p), "=")) {
                    next(p);
                    pn->a = parse_expr(p); /* default */
                }
                list_push(p, &n->args, pn);
                if (!is_op(peek(p), ","))
                    break;
                next(p);
            }
            expect_op(p, ")");
            expect_block_end(p);
            parse_body(p, &n->body, ends_m);
            if (peek(p)->kind == T_NAME) /* {% endmacro name %} */
                next(p);
            expect_block_end(p);
            list_push(p, out, n);
        } else if (is_name(kw, "break") || is_name(kw, "continue")) {
            list_push(p, out, mk(p, is_name(kw, "break") ? N_BREAK : N_CONTINUE, kw->line));
            expect_block_end(p);
        } else if (is_name(kw, "generation")) { /* transformers' assistant-mask marker: renders its body */
            static const char *const ends_g[] = {"endgeneration", NULL};
            expect_block_end(p);
            parse_body(p, out, ends_g);
            expect_block_end(p);
        } else {
            perr(p, kw->line, "unknown statement", kw->s, kw->len);
        }
    }
}

static int parse_all(struct parser *p, struct jinja_tpl *t, const char *src, size_t len)
{
    if (setjmp(p->jb))
        return -1;
    lex(p, src, len);
    parse_body(p, &t->body, NULL);
    return 0;
}

struct jinja_tpl *jinja_parse(const char *src, size_t len)
{
    struct jinja_tpl *t = calloc(1, sizeof *t);
    if (!t) {
        err_set("jinja: out of memory");
        return NULL;
    }
    t->arena.limit = 256u << 20;
    struct parser p = {.a = &t->arena};
    /* the AST points into the source: keep a copy as long as the template */
    char *own = arena_strndup(&t->arena, src, len);
    if (!own || parse_all(&p, t, own, len) != 0) {
        if (!own)
            err_set("jinja: out of memory");
        jinja_free(t);
        return NULL;
    }
    return t;
}

void jinja_free(struct jinja_tpl *t)
{
    if (!t)
        return;
    arena_free(&t->arena);
    free(t);
}
