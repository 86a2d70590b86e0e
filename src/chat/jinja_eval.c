/* jinja_eval: rendering a parsed template (see jinja.h). Values follow Python:
 * str() and repr() of lists/dicts as Python prints them, tojson as json.dumps
 * with ensure_ascii=False, truthiness, int/float arithmetic, code-point string
 * indexing. Errors unwind with longjmp to jinja_render; every allocation is in
 * the render's arena, so nothing leaks on any path. */
#define _GNU_SOURCE
#include "../base/err.h"
#include "../base/utf8.h"
#include "jinja_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

enum { F_NAMESPACE, F_RANGE, F_DICT, F_RAISE, F_STRFTIME, F_LEN };

/* ---- scopes ---- */

static struct jval *lookup(struct rctx *r, struct frame *f, const char *n, size_t len)
{
    (void)r;
    for (; f; f = f->parent) {
        struct jval *v = jv_dict_find(&f->vars, n, len);
        if (v)
            return v;
    }
    return NULL;
}

static void assign(struct rctx *r, struct frame *f, const char *n, size_t len, struct jval v)
{
    jv_dict_set(r, &f->vars, mk_str(n, len), v);
}

static struct jval eval(struct rctx *r, struct frame *f, const struct node *n);
static void exec_list(struct rctx *r, struct frame *f, const struct node_list *l);

static int64_t as_int(struct rctx *r, struct jval v, int32_t line)
{
    if (v.t == J_INT)
        return v.i;
    if (v.t == J_BOOL)
        return v.b;
    jv_rerr(r, line, "expected an integer, got %s", jv_type_name(v));
}

static double as_num(struct jval v) { return v.t == J_FLOAT ? v.f : v.t == J_BOOL ? v.b : (double)v.i; }
static bool is_num(struct jval v) { return v.t == J_INT || v.t == J_FLOAT || v.t == J_BOOL; }

static bool equal(struct jval a, struct jval b)
{
    if (is_num(a) && is_num(b))
        return as_num(a) == as_num(b);
    if (a.t != b.t)
        return false;
    switch (a.t) {
    case J_UNDEF:
    case J_NONE: return true;
    case J_STR: return a.s.n == b.s.n && memcmp(a.s.p, b.s.p, a.s.n) == 0;
    case J_LIST:
        if (a.l->n != b.l->n)
            return false;
        for (int32_t i = 0; i < a.l->n; i++)
            if (!equal(a.l->v[i], b.l->v[i]))
                return false;
        return true;
    case J_DICT:
        if (a.d->n != b.d->n)
            return false;
        for (int32_t i = 0; i < a.d->n; i++) {
            struct jval *o = jv_dict_find(b.d, a.d->k[i].s.p, a.d->k[i].s.n);
            if (!o || !equal(a.d->v[i], *o))
                return false;
        }
        return true;
    default: return a.m == b.m;
    }
}

static int compare(struct rctx *r, struct jval a, struct jval b, int32_t line)
{
    if (is_num(a) && is_num(b)) {
        double x = as_num(a), y = as_num(b);
        return x < y ? -1 : x > y;
    }
    if (a.t == J_STR && b.t == J_STR) {
        size_t m = a.s.n < b.s.n ? a.s.n : b.s.n;
        int c = memcmp(a.s.p, b.s.p, m);
        return c ? (c < 0 ? -1 : 1) : (a.s.n < b.s.n ? -1 : a.s.n > b.s.n);
    }
    jv_rerr(r, line, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a), jv_type_name(b));
}

static bool contains(struct rctx *r, struct jval hay, struct jval needle, int32_t line)
{
    switch (hay.t) {
    case J_STR:
        if (needle.t != J_STR)
            jv_rerr(r, line, "'in <string>' requires string as left operand, not %s", jv_type_name(needle));
        return needle.s.n == 0 || memmem(hay.s.p, hay.s.n, needle.s.p, needle.s.n) != NULL;
    case J_LIST:
        for (int32_t i = 0; i < hay.l->n; i++)
            if (equal(hay.l->v[i], needle))
                return true;
        return false;
    case J_DICT: return needle.t == J_STR && jv_dict_find(hay.d, needle.s.p, needle.s.n) != NULL;
    case J_UNDEF: return false;
    default: jv_rerr(r, line, "argument of type '%s' is not iterable", jv_type_name(hay));
    }
}

/* The items a for loop or a filter walks: list items, dict keys, string characters. */
static struct jval iterable(struct rctx *r, struct jval v, int32_t line)
{
    if (v.t == J_LIST)
        return v;
    struct jval l = jv_mk_list(r, 8);
    if (v.t == J_DICT) {
        for (int32_t i = 0; i < v.d->n; i++)
            jv_list_add(r, l.l, v.d->k[i]);
    } else if (v.t == J_STR) {
        size_t i = 0;
        while (i < v.s.n) {
            size_t j = jv_cp_offset(v.s.p + i, v.s.n - i, 1);
            jv_list_add(r, l.l, mk_str(v.s.p + i, j));
            i += j;
        }
    } else if (v.t != J_UNDEF) {
        jv_rerr(r, line, "'%s' object is not iterable", jv_type_name(v));
    }
    return l;
}

static struct jval getattr_(struct rctx *r, struct jval obj, const char *name, size_t len, int32_t line)
{
    if (obj.t == J_DICT) {
        struct jval *v = jv_dict_find(obj.d, name, len);
        if (v)
            return *v;
    }
    if (obj.t == J_UNDEF)
        jv_rerr(r, line, "'%.*s' is undefined", (int)len, name); /* attribute of an undefined value */
    if (obj.t == J_STR || obj.t == J_DICT || obj.t == J_LIST) {
        static const char *const str_m[] = {"split", "strip", "lstrip", "rstrip", "replace", "startswith", "endswith",
                                            "upper", "lower", "title", "capitalize", "find", "count", "join",
                                            "splitlines", "format", "isdigit", "isalpha", "isspace", NULL};
        static const char *const dict_m[] = {"items", "keys", "values", "get", NULL};
        const char *const *ms = obj.t == J_STR ? str_m : obj.t == J_DICT ? dict_m : NULL;
        for (int i = 0; ms && ms[i]; i++)
            if (strlen(ms[i]) == len && memcmp(ms[i], name, len) == 0) {
                struct jval m = {.t = J_METHOD, .s = {ms[i], len}};
                m.self = jv_ralloc(r, sizeof *m.self);
                *m.self = obj;
                return m;
            }
    }
    return JV_UNDEF;
}

static struct jval getitem(struct rctx *r, struct jval obj, struct jval key, int32_t line)
{
    if (obj.t == J_DICT) {
        if (key.t == J_STR) {
            struct jval *v = jv_dict_find(obj.d, key.s.p, key.s.n);
            return v ? *v : JV_UNDEF;
        }
        return JV_UNDEF;
    }
    if (obj.t == J_LIST || obj.t == J_STR) {
        if (key.t == J_STR)
            return getattr_(r, obj, key.s.p, key.s.n, line);
        int64_t i = as_int(r, key, line);
        int64_t n = obj.t == J_LIST ? obj.l->n : (int64_t)jv_cp_count(obj.s.p, obj.s.n);
        if (i < 0)
            i += n;
        if (i < 0 || i >= n)
            return JV_UNDEF;
        if (obj.t == J_LIST)
            return obj.l->v[i];
        size_t b = jv_cp_offset(obj.s.p, obj.s.n, (size_t)i);
        return mk_str(obj.s.p + b, jv_cp_offset(obj.s.p + b, obj.s.n - b, 1));
    }
    if (obj.t == J_UNDEF)
        jv_rerr(r, line, "cannot index an undefined value");
    return JV_UNDEF;
}

static struct jval slice(struct rctx *r, struct jval obj, const struct node *n, struct frame *f)
{
    int64_t len = obj.t == J_LIST ? obj.l->n : obj.t == J_STR ? (int64_t)jv_cp_count(obj.s.p, obj.s.n) : -1;
    if (len < 0)
        jv_rerr(r, n->line, "'%s' object is not subscriptable", jv_type_name(obj));
    int64_t step = n->d ? as_int(r, eval(r, f, n->d), n->line) : 1;
    if (step == 0)
        jv_rerr(r, n->line, "slice step cannot be zero");
    struct jval lo_v = n->b ? eval(r, f, n->b) : JV_NONE, hi_v = n->c ? eval(r, f, n->c) : JV_NONE;
    int64_t lo, hi;
    if (lo_v.t == J_NONE)
        lo = step > 0 ? 0 : len - 1;
    else {
        lo = as_int(r, lo_v, n->line);
        if (lo < 0)
            lo += len;
        lo = step > 0 ? (lo < 0 ? 0 : lo > len ? len : lo) : (lo < -1 ? -1 : lo > len - 1 ? len - 1 : lo);
    }
    if (hi_v.t == J_NONE)
        hi = step > 0 ? len : -1;
    else {
        hi = as_int(r, hi_v, n->line);
        if (hi < 0)
            hi += len;
        hi = step > 0 ? (hi < 0 ? 0 : hi > len ? len : hi) : (hi < -1 ? -1 : hi > len - 1 ? len - 1 : hi);
    }
    if (obj.t == J_LIST) {
        struct jval l = jv_mk_list(r, 8);
        l.tuple = obj.tuple;
        for (int64_t i = lo; step > 0 ? i < hi : i > hi;) {
            jv_list_add(r, l.l, obj.l->v[i]);
            if (__builtin_add_overflow(i, step, &i))
                break;
        }
        return l;
    }
    struct sbuf b = {0};
    for (int64_t i = lo; step > 0 ? i < hi : i > hi;) {
        size_t o = jv_cp_offset(obj.s.p, obj.s.n, (size_t)i);
        jv_sb_put(r, &b, obj.s.p + o, jv_cp_offset(obj.s.p + o, obj.s.n - o, 1));
        if (__builtin_add_overflow(i, step, &i))
            break;
    }
    return mk_str(b.p ? b.p : "", b.n);
}

static struct jval arith(struct rctx *r, const char *op, struct jval a, struct jval b, int32_t line)
{
    if (op[0] == '~') {
        struct sbuf s = {0};
        jv_put_str(r, &s, a);
        jv_put_str(r, &s, b);
        return mk_str(s.p ? s.p : "", s.n);
    }
    if (op[0] == '+' && a.t == J_STR && b.t == J_STR) {
        char *p = jv_ralloc(r, a.s.n + b.s.n + 1);
        memcpy(p, a.s.p, a.s.n);
        memcpy(p + a.s.n, b.s.p, b.s.n);
        return mk_str(p, a.s.n + b.s.n);
    }
    if (op[0] == '+' && a.t == J_LIST && b.t == J_LIST) {
        struct jval l = jv_mk_list(r, a.l->n + b.l->n);
        for (int32_t i = 0; i < a.l->n; i++)
            jv_list_add(r, l.l, a.l->v[i]);
        for (int32_t i = 0; i < b.l->n; i++)
            jv_list_add(r, l.l, b.l->v[i]);
        return l;
    }
    if (op[0] == '*' && op[1] == 0 && ((a.t == J_STR && b.t == J_INT) || (a.t == J_INT && b.t == J_STR))) {
        struct jval s = a.t == J_STR ? a : b;
        int64_t k = a.t == J_INT ? a.i : b.i;
        struct sbuf o = {0};
        for (int64_t i = 0; i < k; i++)
            jv_sb_put(r, &o, s.s.p, s.s.n);
        return mk_str(o.p ? o.p : "", o.n);
    }
    if (op[0] == '%' && a.t == J_STR)
        jv_rerr(r, line, "printf-style string formatting is not supported");
    if (!is_num(a) || !is_num(b)) {
        if (op[0] == '+' && a.t == J_STR)
            jv_rerr(r, line, "can only concatenate str (not \"%s\") to str", jv_type_name(b));
        jv_rerr(r, line, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_type_name(a), jv_type_name(b));
    }
    bool ints = a.t != J_FLOAT && b.t != J_FLOAT;
    double x = as_num(a), y = as_num(b);
    int64_t xi = ints ? as_int(r, a, line) : 0, yi = ints ? as_int(r, b, line) : 0, ri;
    switch (op[0]) {
    case '+':
        if (!ints)
            return mk_float(x + y);
        if (__builtin_add_overflow(xi, yi, &ri))
            jv_rerr(r, line, "integer overflow");
        return mk_int(ri);
    case '-':
        if (!ints)
            return mk_float(x - y);
        if (__builtin_sub_overflow(xi, yi, &ri))
            jv_rerr(r, line, "integer overflow");
        return mk_int(ri);
    case '*':
        if (op[1] == '*') {
            double pw = pow(x, y);
            if (ints && yi >= 0) {
                if (!(fabs(pw) < 9.2e18))
                    jv_rerr(r, line, "integer overflow");
                return mk_int((int64_t)pw);
            }
            return mk_float(pw);
        }
        if (!ints)
            return mk_float(x * y);
        if (__builtin_mul_overflow(xi, yi, &ri))
            jv_rerr(r, line, "integer overflow");
        return mk_int(ri);
    case '/':
        if (y == 0)
            jv_rerr(r, line, "division by zero");
        if (op[1] == '/') {
            if (!ints)
                return mk_float(floor(x / y));
            if (xi == INT64_MIN && yi == -1)
                jv_rerr(r, line, "integer overflow");
            int64_t q = xi / yi;
            if ((xi % yi != 0) && ((xi < 0) != (yi < 0)))
                q--;
            return mk_int(q);
        }
        return mk_float(x / y);
    case '%':
        if (y == 0)
            jv_rerr(r, line, "modulo by zero");
        if (ints) {
            if (yi == -1)
                return mk_int(0);
            int64_t m = xi % yi;
            if (m != 0 && ((m < 0) != (yi < 0)))
                m += yi;
            return mk_int(m);
        }
        return mk_float(x - floor(x / y) * y);
    }
    jv_rerr(r, line, "unknown operator %s", op);
}

/* ---- calls: macros, globals, methods, filters, tests ---- */

struct args {
    int32_t n;
    struct jval v[8];
    int32_t nk;
    struct {
        const char *k;
        size_t kn;
        struct jval v;
    } kw[8];
};

static void eval_args(struct rctx *r, struct frame *f, const struct node *n, struct args *a, struct jval *first)
{
    a->n = a->nk = 0;
    if (first)
        a->v[a->n++] = *first;
    if (n->args.n + a->n > 8 || n->kwargs.n / 2 > 8)
        jv_rerr(r, n->line, "too many arguments");
    for (int32_t i = 0; i < n->args.n; i++)
        a->v[a->n++] = eval(r, f, n->args.v[i]);
    for (int32_t i = 0; i + 1 < n->kwargs.n; i += 2) {
        a->kw[a->nk].k = n->kwargs.v[i]->s;
        a->kw[a->nk].kn = n->kwargs.v[i]->len;
        a->kw[a->nk++].v = eval(r, f, n->kwargs.v[i + 1]);
    }
}

/* positional i, or keyword `name`, or JV_UNDEF */
static struct jval arg(const struct args *a, int32_t i, const char *name)
{
    if (i < a->n)
        return a->v[i];
    for (int32_t k = 0; k < a->nk; k++)
        if (strlen(name) == a->kw[k].kn && memcmp(name, a->kw[k].k, a->kw[k].kn) == 0)
            return a->kw[k].v;
    return JV_UNDEF;
}

static struct jval call_macro(struct rctx *r, const struct node *m, const struct args *a, int32_t line)
{
    if (++r->depth > MAX_DEPTH)
        jv_rerr(r, line, "recursion deeper than %d", MAX_DEPTH);
    struct frame *fr = jv_ralloc(r, sizeof *fr);
    fr->parent = r->globals;
    for (int32_t i = 0; i < m->args.n; i++) {
        const struct node *p = m->args.v[i];
        struct jval v = arg(a, i, "");
        for (int32_t k = 0; k < a->nk; k++)
            if (a->kw[k].kn == p->len && memcmp(a->kw[k].k, p->s, p->len) == 0)
                v = a->kw[k].v;
        if (v.t == J_UNDEF && p->a)
            v = eval(r, fr, p->a);
        assign(r, fr, p->s, p->len, v);
    }
    struct sbuf *saved = r->out, b = {0};
    r->out = &b;
    exec_list(r, fr, &m->body);
    r->out = saved;
    r->depth--;
    return mk_str(b.p ? b.p : "", b.n);
}

static struct jval call_method(struct rctx *r, struct jval m, const struct args *a, int32_t line)
{
    struct jval s = *m.self;
    const char *name = m.s.p;
    if (s.t == J_DICT) {
        if (!strcmp(name, "get")) {
            struct jval k = arg(a, 0, "key"), d = a->n > 1 ? a->v[1] : JV_NONE;
            struct jval *v = k.t == J_STR ? jv_dict_find(s.d, k.s.p, k.s.n) : NULL;
            return v ? *v : d;
        }
        struct jval l = jv_mk_list(r, s.d->n);
        for (int32_t i = 0; i < s.d->n; i++) {
            if (!strcmp(name, "keys"))
                jv_list_add(r, l.l, s.d->k[i]);
            else if (!strcmp(name, "values"))
                jv_list_add(r, l.l, s.d->v[i]);
            else {
                struct jval t = jv_mk_list(r, 2);
                t.tuple = true;
                jv_list_add(r, t.l, s.d->k[i]);
                jv_list_add(r, t.l, s.d->v[i]);
                jv_list_add(r, l.l, t);
            }
        }
        return l;
    }
    /* string methods */
    struct jval x = arg(a, 0, "");
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        if (x.t != J_UNDEF && x.t != J_NONE && x.t != J_STR)
            jv_rerr(r, line, "%s arg must be None or str", name);
        return jv_strip(s, x.t == J_STR ? &x : NULL, name[0] != 'r', name[0] != 'l');
    }
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        if (x.t != J_STR)
            jv_rerr(r, line, "%s first arg must be str", name);
        if (x.s.n > s.s.n)
            return mk_bool(false);
        return mk_bool(memcmp(name[0] == 's' ? s.s.p : s.s.p + s.s.n - x.s.n, x.s.p, x.s.n) == 0);
    }
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") || !strcmp(name, "capitalize")) {
        char *p = jv_ralloc(r, s.s.n * 4 + 1);
        size_t o = 0, i = 0, bad;
        uint32_t cp;
        bool word_start = true;
        while (i < s.s.n) {
            size_t l = utf8_seq((const unsigned char *)s.s.p + i, s.s.n - i, &bad, &cp);
            if (!l) {
                p[o++] = s.s.p[i++];
                continue;
            }
            bool up = name[0] == 'u' || ((name[0] == 't' || name[0] == 'c') && word_start);
            if (name[0] == 'c' && i > 0)
                up = false;
            uint32_t c2 = up ? (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp) : (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
            o += utf8_put(c2, p + o);
            word_start = !utf8proc_isupper((utf8proc_int32_t)cp) && !utf8proc_islower((utf8proc_int32_t)cp);
            i += l;
        }
        return mk_str(p, o);
    }
    if (!strcmp(name, "replace")) {
        struct jval to = arg(a, 1, "");
        if (x.t != J_STR || to.t != J_STR)
            jv_rerr(r, line, "replace() arguments must be str");
        int64_t max = a->n > 2 ? as_int(r, a->v[2], line) : -1;
        struct sbuf b = {0};
        size_t i = 0;
        int64_t done = 0;
        while (i <= s.s.n) {
            const char *hit = (max < 0 || done < max) && x.s.n ? memmem(s.s.p + i, s.s.n - i, x.s.p, x.s.n) : NULL;
            if (!hit) {
                jv_sb_put(r, &b, s.s.p + i, s.s.n - i);
                break;
            }
            jv_sb_put(r, &b, s.s.p + i, (size_t)(hit - s.s.p) - i);
            jv_sb_put(r, &b, to.s.p, to.s.n);
            i = (size_t)(hit - s.s.p) + x.s.n;
            done++;
        }
        return mk_str(b.p ? b.p : "", b.n);
    }
    if (!strcmp(name, "split")) {
        struct jval l = jv_mk_list(r, 8);
        int64_t max = a->n > 1 ? as_int(r, a->v[1], line) : -1;
        if (x.t == J_STR) {
            if (x.s.n == 0)
                jv_rerr(r, line, "empty separator");
            size_t i = 0;
            int64_t k = 0;
            for (;;) {
                const char *hit = max < 0 || k < max ? memmem(s.s.p + i, s.s.n - i, x.s.p, x.s.n) : NULL;
                if (!hit) {
                    jv_list_add(r, l.l, mk_str(s.s.p + i, s.s.n - i));
                    break;
                }
                jv_list_add(r, l.l, mk_str(s.s.p + i, (size_t)(hit - s.s.p) - i));
                i = (size_t)(hit - s.s.p) + x.s.n;
                k++;
            }
        } else { /* whitespace runs */
            size_t i = 0, sl;
            while (i < s.s.n) {
                while (i < s.s.n && jv_is_py_space_at(s.s.p, s.s.n, i, &sl))
                    i += sl;
                if (i >= s.s.n)
                    break;
                size_t b = i;
                while (i < s.s.n && !jv_is_py_space_at(s.s.p, s.s.n, i, &sl))
                    i++;
                jv_list_add(r, l.l, mk_str(s.s.p + b, i - b));
            }
        }
        return l;
    }
    if (!strcmp(name, "splitlines")) {
        struct jval l = jv_mk_list(r, 8);
        size_t b = 0;
        for (size_t i = 0; i < s.s.n; i++)
            if (s.s.p[i] == '\n' || s.s.p[i] == '\r') {
                jv_list_add(r, l.l, mk_str(s.s.p + b, i - b));
                if (s.s.p[i] == '\r' && i + 1 < s.s.n && s.s.p[i + 1] == '\n')
                    i++;
                b = i + 1;
            }
        if (b < s.s.n)
            jv_list_add(r, l.l, mk_str(s.s.p + b, s.s.n - b));
        return l;
    }
    if (!strcmp(name, "find") || !strcmp(name, "count")) {
        if (x.t != J_STR)
            jv_rerr(r, line, "%s() argument must be str", name);
        if (name[0] == 'f') {
            const char *hit = memmem(s.s.p, s.s.n, x.s.p, x.s.n);
            return mk_int(hit ? (int64_t)jv_cp_count(s.s.p, (size_t)(hit - s.s.p)) : -1);
        }
        int64_t c = 0;
        for (const char *p = s.s.p; x.s.n && (p = memmem(p, s.s.n - (size_t)(p - s.s.p), x.s.p, x.s.n)); p += x.s.n)
            c++;
        return mk_int(x.s.n ? c : (int64_t)jv_cp_count(s.s.p, s.s.n) + 1);
    }
    if (!strcmp(name, "join")) {
        struct jval items = iterable(r, x, line);
        struct sbuf b = {0};
        for (int32_t i = 0; i < items.l->n; i++) {
            if (i)
                jv_sb_put(r, &b, s.s.p, s.s.n);
            if (items.l->v[i].t != J_STR)
                jv_rerr(r, line, "sequence item %d: expected str instance, %s found", i, jv_type_name(items.l->v[i]));
            jv_sb_put(r, &b, items.l->v[i].s.p, items.l->v[i].s.n);
        }
        return mk_str(b.p ? b.p : "", b.n);
    }
    if (!strcmp(name, "isdigit") || !strcmp(name, "isalpha") || !strcmp(name, "isspace")) {
        if (s.s.n == 0)
            return mk_bool(false);
        for (size_t i = 0; i < s.s.n; i++) {
            unsigned char c = (unsigned char)s.s.p[i];
            bool ok = name[2] == 'd' ? (c >= '0' && c <= '9') : name[2] == 'a' ? (c >= 0x80 || ((c | 32) >= 'a' && (c | 32) <= 'z')) : (c == ' ' || (c >= 9 && c <= 13));
            if (!ok)
                return mk_bool(false);
        }
        return mk_bool(true);
    }
    jv_rerr(r, line, "'str' object has no attribute '%s'", name);
}

static struct jval call_global(struct rctx *r, int fn, const struct args *a, int32_t line)
{
    switch (fn) {
    case F_NAMESPACE:
    case F_DICT: {
        struct jval d = jv_mk_dict(r);
        d.ns = fn == F_NAMESPACE;
        if (a->n > 0 && a->v[0].t == J_DICT)
            for (int32_t i = 0; i < a->v[0].d->n; i++)
                jv_dict_set(r, d.d, a->v[0].d->k[i], a->v[0].d->v[i]);
        for (int32_t k = 0; k < a->nk; k++)
            jv_dict_set(r, d.d, mk_str(a->kw[k].k, a->kw[k].kn), a->kw[k].v);
        return d;
    }
    case F_RANGE: {
        int64_t lo = 0, hi, st = 1;
        if (a->n == 1)
            hi = as_int(r, a->v[0], line);
        else if (a->n >= 2) {
            lo = as_int(r, a->v[0], line);
            hi = as_int(r, a->v[1], line);
            if (a->n > 2)
                st = as_int(r, a->v[2], line);
        } else
            jv_rerr(r, line, "range expected at least 1 argument");
        if (st == 0)
            jv_rerr(r, line, "range() arg 3 must not be zero");
        int64_t span;
        if (__builtin_sub_overflow(hi, lo, &span) || (st != -1 && span / st > 100000) || (st == -1 && span < -100000))
            jv_rerr(r, line, "range too large");
        struct jval l = jv_mk_list(r, 8);
        for (int64_t i = lo; st > 0 ? i < hi : i > hi;) {
            jv_list_add(r, l.l, mk_int(i));
            if (__builtin_add_overflow(i, st, &i))
                break;
        }
        return l;
    }
    case F_RAISE: {
        struct jval m = jv_to_str(r, arg(a, 0, "message"));
        jv_rerr(r, line, "%.*s", (int)m.s.n, m.s.p);
    }
    case F_STRFTIME: {
        struct jval fmt = arg(a, 0, "format");
        if (fmt.t != J_STR)
            jv_rerr(r, line, "strftime_now needs a format string");
        char f[128], out[256];
        snprintf(f, sizeof f, "%.*s", (int)fmt.s.n, fmt.s.p);
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        size_t n = strftime(out, sizeof out, f, &tmv);
        char *p = jv_ralloc(r, n + 1);
        memcpy(p, out, n);
        return mk_str(p, n);
    }
    default: {
        struct jval v = arg(a, 0, "");
        if (v.t == J_STR)
            return mk_int((int64_t)jv_cp_count(v.s.p, v.s.n));
        if (v.t == J_LIST)
            return mk_int(v.l->n);
        if (v.t == J_DICT)
            return mk_int(v.d->n);
        jv_rerr(r, line, "object of type '%s' has no len()", jv_type_name(v));
    }
    }
}

static struct jval do_filter(struct rctx *r, const char *name, size_t len, const struct args *a, int32_t line)
{
    struct jval v = a->v[0];
#define IS(s) (len == sizeof(s) - 1 && memcmp(name, s, len) == 0)
    if (IS("safe")) /* transformers renders without autoescape */
        return v;
    if (IS("tojson")) {
        struct jval ind = arg(a, 1, "indent"), sk = arg(a, 99, "sort_keys");
        struct sbuf b = {0};
        jv_put_json(r, &b, v, ind.t == J_INT ? (int)ind.i : -1, 0, jv_truthy(sk), line);
        return mk_str(b.p, b.n);
    }
    if (IS("string"))
        return jv_to_str(r, v);
    if (IS("trim")) {
        if (v.t != J_STR)
            v = jv_to_str(r, v);
        struct jval chars = arg(a, 1, "chars");
        return jv_strip(v, chars.t == J_STR ? &chars : NULL, true, true);
    }
    if (IS("length") || IS("count"))
        return call_global(r, F_LEN, a, line);
    if (IS("default") || IS("d")) {
        struct jval d = arg(a, 1, "default_value"), boolean = arg(a, 2, "boolean");
        if (v.t == J_UNDEF || (jv_truthy(boolean) && !jv_truthy(v)))
            return d.t == J_UNDEF ? mk_str("", 0) : d;
        return v;
    }
    if (IS("items")) {
        if (v.t == J_UNDEF)
            return jv_mk_list(r, 1);
        if (v.t != J_DICT)
            jv_rerr(r, line, "items filter needs a mapping, got %s", jv_type_name(v));
        struct jval m = {.t = J_METHOD, .s = {"items", 5}, .self = &v};
        struct args none = {0};
        return call_method(r, m, &none, line);
    }
    if (IS("list"))
        return iterable(r, v, line);
    if (IS("first") || IS("last")) {
        struct jval l = iterable(r, v, line);
        return l.l->n ? l.l->v[IS("first") ? 0 : l.l->n - 1] : JV_UNDEF;
    }
    if (IS("join")) {
        struct jval sep = arg(a, 1, "d");
        struct jval items = iterable(r, v, line);
        struct sbuf b = {0};
        for (int32_t i = 0; i < items.l->n; i++) {
            if (i && sep.t == J_STR)
                jv_sb_put(r, &b, sep.s.p, sep.s.n);
            jv_put_str(r, &b, items.l->v[i]);
        }
        return mk_str(b.p ? b.p : "", b.n);
    }
    if (IS("upper") || IS("lower") || IS("capitalize") || IS("title") || IS("replace")) {
        struct jval s = jv_to_str(r, v);
        struct jval m = {.t = J_METHOD, .s = {IS("upper") ? "upper" : IS("lower") ? "lower" : IS("title") ? "title" : IS("replace") ? "replace" : "capitalize", len}, .self = &s};
        struct args rest = *a;
        memmove(rest.v, rest.v + 1, sizeof(struct jval) * (size_t)(rest.n - 1));
        rest.n--;
        if (IS("capitalize")) { /* Jinja: first upper, rest lower */
            struct jval lo = call_method(r, (struct jval){.t = J_METHOD, .s = {"lower", 5}, .self = &s}, &rest, line);
            m.self = &lo;
        }
        return call_method(r, m, &rest, line);
    }
    if (IS("int")) {
        if (v.t == J_STR) {
            char buf[64];
            snprintf(buf, sizeof buf, "%.*s", (int)(v.s.n < 63 ? v.s.n : 63), v.s.p);
            return mk_int(strtoll(buf, NULL, 10));
        }
        return mk_int(is_num(v) ? (int64_t)as_num(v) : 0);
    }
    if (IS("float"))
        return mk_float(is_num(v) ? as_num(v) : v.t == J_STR ? strtod(jv_to_str(r, v).s.p, NULL) : 0.0);
    if (IS("abs"))
        return v.t == J_INT ? mk_int(v.i < 0 ? -v.i : v.i) : mk_float(fabs(as_num(v)));
    if (IS("map")) {
        struct jval at = arg(a, 99, "attribute"), l = iterable(r, v, line), o = jv_mk_list(r, l.l->n);
        if (at.t != J_STR)
            jv_rerr(r, line, "map filter supports attribute= only");
        for (int32_t i = 0; i < l.l->n; i++)
            jv_list_add(r, o.l, getitem(r, l.l->v[i], at, line));
        return o;
    }
    if (IS("selectattr") || IS("rejectattr")) {
        struct jval at = arg(a, 1, "attr"), l = iterable(r, v, line), o = jv_mk_list(r, l.l->n);
        for (int32_t i = 0; i < l.l->n; i++)
            if (jv_truthy(getitem(r, l.l->v[i], at, line)) == IS("selectattr"))
                jv_list_add(r, o.l, l.l->v[i]);
        return o;
    }
    jv_rerr(r, line, "no filter named '%.*s'", (int)len, name);
#undef IS
}

static bool do_test(struct rctx *r, const char *name, size_t len, struct jval v, const struct args *a, int32_t line)
{
#define IS(s) (len == sizeof(s) - 1 && memcmp(name, s, len) == 0)
    if (IS("defined"))
        return v.t != J_UNDEF;
    if (IS("undefined"))
        return v.t == J_UNDEF;
    if (IS("none"))
        return v.t == J_NONE;
    if (IS("string"))
        return v.t == J_STR;
    if (IS("mapping"))
        return v.t == J_DICT;
    if (IS("iterable"))
        return v.t == J_LIST || v.t == J_DICT || v.t == J_STR;
    if (IS("sequence"))
        return v.t == J_LIST || v.t == J_DICT || v.t == J_STR;
    if (IS("number"))
        return v.t == J_INT || v.t == J_FLOAT;
    if (IS("integer"))
        return v.t == J_INT;
    if (IS("float"))
        return v.t == J_FLOAT;
    if (IS("boolean"))
        return v.t == J_BOOL;
    if (IS("true"))
        return v.t == J_BOOL && v.b;
    if (IS("false"))
        return v.t == J_BOOL && !v.b;
    if (IS("callable"))
        return v.t == J_MACRO || v.t == J_FUNC || v.t == J_METHOD;
    if (IS("even") || IS("odd"))
        return (as_int(r, v, line) % 2 == 0) == IS("even");
    if (IS("divisibleby")) {
        int64_t d = as_int(r, arg(a, 0, "num"), line);
        return d != 0 && as_int(r, v, line) % d == 0;
    }
    if (IS("eq") || IS("equalto") || IS("=="))
        return equal(v, arg(a, 0, "other"));
    if (IS("ne") || IS("!="))
        return !equal(v, arg(a, 0, "other"));
    if (IS("in"))
        return contains(r, arg(a, 0, "seq"), v, line);
    if (IS("lower") || IS("upper")) {
        if (v.t != J_STR)
            return false;
        for (size_t i = 0; i < v.s.n; i++)
            if (IS("lower") ? (v.s.p[i] >= 'A' && v.s.p[i] <= 'Z') : (v.s.p[i] >= 'a' && v.s.p[i] <= 'z'))
                return false;
        return true;
    }
    jv_rerr(r, line, "no test named '%.*s'", (int)len, name);
#undef IS
}

/* ---- expressions ---- */

static struct jval eval_inner(struct rctx *r, struct frame *f, const struct node *n);

static struct jval eval(struct rctx *r, struct frame *f, const struct node *n)
{
    if (++r->eval_depth > MAX_EVAL_DEPTH)
        jv_rerr(r, n->line, "expression nested too deeply");
    struct jval v = eval_inner(r, f, n);
    r->eval_depth--;
    return v;
}

static struct jval eval_inner(struct rctx *r, struct frame *f, const struct node *n)
{
    r->line = n->line;
    if (++r->steps > MAX_STEPS)
        jv_rerr(r, n->line, "template ran more than %d steps", MAX_STEPS);
    switch (n->kind) {
    case N_STR: return mk_str(n->s, n->len);
    case N_INT: return mk_int(n->i);
    case N_FLOAT: return mk_float(n->f);
    case N_BOOL: return mk_bool(n->i != 0);
    case N_NONE: return JV_NONE;
    case N_NAME: {
        struct jval *v = lookup(r, f, n->s, n->len);
        if (v)
            return *v;
        static const char *const globals[] = {"namespace", "range", "dict", "raise_exception", "strftime_now", "len"};
        for (int i = 0; i < 6; i++)
            if (strlen(globals[i]) == n->len && memcmp(globals[i], n->s, n->len) == 0)
                return (struct jval){.t = J_FUNC, .fn = i};
        return JV_UNDEF;
    }
    case N_LIST:
    case N_TUPLE: {
        struct jval l = jv_mk_list(r, n->args.n);
        l.tuple = n->kind == N_TUPLE;
        for (int32_t i = 0; i < n->args.n; i++)
            jv_list_add(r, l.l, eval(r, f, n->args.v[i]));
        return l;
    }
    case N_DICT: {
        struct jval d = jv_mk_dict(r);
        for (int32_t i = 0; i + 1 < n->args.n; i += 2) {
            struct jval k = eval(r, f, n->args.v[i]);
            if (k.t != J_STR)
                k = jv_to_str(r, k);
            jv_dict_set(r, d.d, k, eval(r, f, n->args.v[i + 1]));
        }
        return d;
    }
    case N_ATTR: {
        struct jval o = eval(r, f, n->a);
        if (o.t == J_UNDEF)
            jv_rerr(r, n->line, "'%.*s' is undefined", (int)(n->a->kind == N_NAME ? n->a->len : 5),
                 n->a->kind == N_NAME ? n->a->s : "value");
        if (o.t == J_LIST && n->s[0] >= '0' && n->s[0] <= '9')
            return getitem(r, o, mk_int(atoll(n->s)), n->line);
        return getattr_(r, o, n->s, n->len, n->line);
    }
    case N_ITEM: return getitem(r, eval(r, f, n->a), eval(r, f, n->b), n->line);
    case N_SLICE: return slice(r, eval(r, f, n->a), n, f);
    case N_CALL: {
        struct jval c = eval(r, f, n->a);
        struct args a;
        eval_args(r, f, n, &a, NULL);
        if (c.t == J_MACRO)
            return call_macro(r, c.m, &a, n->line);
        if (c.t == J_FUNC)
            return call_global(r, c.fn, &a, n->line);
        if (c.t == J_METHOD)
            return call_method(r, c, &a, n->line);
        if (n->a->kind == N_ATTR) {
            struct jval o = eval(r, f, n->a->a);
            jv_rerr(r, n->line, "'%s object' has no attribute '%.*s'", jv_type_name(o), (int)n->a->len, n->a->s);
        }
        jv_rerr(r, n->line, "'%s' object is not callable", jv_type_name(c));
    }
    case N_FILTER: {
        struct jval v = eval(r, f, n->a);
        struct args a;
        eval_args(r, f, n, &a, &v);
        return do_filter(r, n->s, n->len, &a, n->line);
    }
    case N_TEST: {
        struct jval v = eval(r, f, n->a);
        struct args a;
        eval_args(r, f, n, &a, NULL);
        return mk_bool(do_test(r, n->s, n->len, v, &a, n->line) != (n->i != 0));
    }
    case N_NOT: return mk_bool(!jv_truthy(eval(r, f, n->a)));
    case N_NEG: {
        struct jval v = eval(r, f, n->a);
        if (!is_num(v))
            jv_rerr(r, n->line, "bad operand type for unary -: '%s'", jv_type_name(v));
        if (!n->i)
            return v;
        if (v.t == J_FLOAT)
            return mk_float(-v.f);
        int64_t x = as_int(r, v, n->line);
        if (x == INT64_MIN)
            jv_rerr(r, n->line, "integer overflow");
        return mk_int(-x);
    }
    case N_AND: {
        struct jval a = eval(r, f, n->a);
        return jv_truthy(a) ? eval(r, f, n->b) : a;
    }
    case N_OR: {
        struct jval a = eval(r, f, n->a);
        return jv_truthy(a) ? a : eval(r, f, n->b);
    }
    case N_COND: return jv_truthy(eval(r, f, n->b)) ? eval(r, f, n->a) : n->c ? eval(r, f, n->c) : JV_UNDEF;
    case N_BINOP: {
        struct jval a = eval(r, f, n->a), b = eval(r, f, n->b);
        const char *op = n->s;
        if (!strcmp(op, "=="))
            return mk_bool(equal(a, b));
        if (!strcmp(op, "!="))
            return mk_bool(!equal(a, b));
        if (!strcmp(op, "in"))
            return mk_bool(contains(r, b, a, n->line));
        if (!strcmp(op, "not in"))
            return mk_bool(!contains(r, b, a, n->line));
        if (op[0] == '<' || op[0] == '>') {
            int c = compare(r, a, b, n->line);
            return mk_bool(op[0] == '<' ? (op[1] ? c <= 0 : c < 0) : (op[1] ? c >= 0 : c > 0));
        }
        return arith(r, op, a, b, n->line);
    }
    default: jv_rerr(r, n->line, "not an expression");
    }
}

/* ---- statements ---- */

static void bind_targets(struct rctx *r, struct frame *f, const struct node_list *t, struct jval v, int32_t line)
{
    if (t->n == 1) {
        assign(r, f, t->v[0]->s, t->v[0]->len, v);
        return;
    }
    if (v.t != J_LIST || v.l->n != t->n)
        jv_rerr(r, line, "cannot unpack %s into %d values", jv_type_name(v), t->n);
    for (int32_t i = 0; i < t->n; i++)
        assign(r, f, t->v[i]->s, t->v[i]->len, v.l->v[i]);
}

static void exec_for(struct rctx *r, struct frame *f, const struct node *n)
{
    struct jval items = iterable(r, eval(r, f, n->a), n->line);
    struct frame *fr = jv_ralloc(r, sizeof *fr);
    fr->parent = f;
    /* the inline `if` filters items before loop.* counts them */
    struct jval kept = items;
    if (n->d) {
        kept = jv_mk_list(r, items.l->n);
        for (int32_t i = 0; i < items.l->n; i++) {
            bind_targets(r, fr, &n->args, items.l->v[i], n->line);
            if (jv_truthy(eval(r, fr, n->d)))
                jv_list_add(r, kept.l, items.l->v[i]);
        }
    }
    int32_t len = kept.l->n;
    /* one loop object updated in place, like Jinja's LoopContext */
    struct jval loop = jv_mk_dict(r);
    static const char *const keys[] = {"index", "index0", "revindex", "revindex0", "first", "last", "length",
                                       "previtem", "nextitem"};
    for (int k = 0; k < 9; k++)
        jv_dict_set(r, loop.d, mk_cstr(keys[k]), JV_UNDEF);
    for (int32_t i = 0; i < len; i++) {
        if (++r->steps > MAX_STEPS)
            jv_rerr(r, n->line, "template ran more than %d steps", MAX_STEPS);
        fr->vars.n = 0; /* a fresh scope per iteration, as Jinja's */
        struct jval *lv = loop.d->v;
        lv[0] = mk_int(i + 1);
        lv[1] = mk_int(i);
        lv[2] = mk_int(len - i);
        lv[3] = mk_int(len - i - 1);
        lv[4] = mk_bool(i == 0);
        lv[5] = mk_bool(i == len - 1);
        lv[6] = mk_int(len);
        lv[7] = i > 0 ? kept.l->v[i - 1] : JV_UNDEF;
        lv[8] = i + 1 < len ? kept.l->v[i + 1] : JV_UNDEF;
        assign(r, fr, "loop", 4, loop);
        bind_targets(r, fr, &n->args, kept.l->v[i], n->line);
        exec_list(r, fr, &n->body);
        if (r->loop_ctl == 1) {
            r->loop_ctl = 0;
            break;
        }
        r->loop_ctl = 0;
    }
    if (len == 0 && n->other.n)
        exec_list(r, f, &n->other);
}

static void exec_node(struct rctx *r, struct frame *f, const struct node *n)
{
    r->line = n->line;
    if (++r->steps > MAX_STEPS)
        jv_rerr(r, n->line, "template ran more than %d steps", MAX_STEPS);
    switch (n->kind) {
    case N_TEXT: jv_sb_put(r, r->out, n->s, n->len); break;
    case N_OUT: jv_put_str(r, r->out, eval(r, f, n->a)); break;
    case N_IF: exec_list(r, f, jv_truthy(eval(r, f, n->a)) ? &n->body : &n->other); break;
    case N_FOR: exec_for(r, f, n); break;
    case N_SET: {
        struct jval v = eval(r, f, n->a);
        if (n->args.n == 1 && n->args.v[0]->kind == N_ATTR) {
            const struct node *t = n->args.v[0];
            struct jval *ns = lookup(r, f, t->a->s, t->a->len);
            if (!ns || ns->t != J_DICT || !ns->ns)
                jv_rerr(r, n->line, "cannot assign attribute on non-namespace object");
            jv_dict_set(r, ns->d, mk_str(t->s, t->len), v);
        } else {
            bind_targets(r, f, &n->args, v, n->line);
        }
        break;
    }
    case N_MACRO: assign(r, f, n->s, n->len, (struct jval){.t = J_MACRO, .m = n}); break;
    case N_BREAK: r->loop_ctl = 1; break;
    case N_CONTINUE: r->loop_ctl = 2; break;
    default: jv_rerr(r, n->line, "not a statement");
    }
}

static void exec_list(struct rctx *r, struct frame *f, const struct node_list *l)
{
    for (int32_t i = 0; i < l->n && !r->loop_ctl; i++)
        exec_node(r, f, l->v[i]);
}

char *jinja_render(const struct jinja_tpl *t, json_t *ctx, size_t *len)
{
    struct arena a = {.limit = 512u << 20};
    struct rctx r = {.a = &a};
    struct sbuf out = {0};
    char *result = NULL;
    if (setjmp(r.jb)) {
        arena_free(&a);
        return NULL;
    }
    r.out = &out;
    r.globals = jv_ralloc(&r, sizeof *r.globals);
    const char *k;
    json_t *v;
    json_object_foreach(ctx, k, v) assign(&r, r.globals, k, strlen(k), jv_from_json(&r, v));
    exec_list(&r, r.globals, &t->body);
    result = malloc(out.n + 1);
    if (!result) {
        arena_free(&a);
        err_set("jinja: out of memory");
        return NULL;
    }
    if (out.n)
        memcpy(result, out.p, out.n);
    result[out.n] = 0;
    if (len)
        *len = out.n;
    arena_free(&a);
    return result;
}
