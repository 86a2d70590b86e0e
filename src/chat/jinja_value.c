/* jinja_value: the values a template computes with (see jinja_impl.h):
 * lists and dicts in the render's arena, Python's str(), repr() and
 * json.dumps(ensure_ascii=False) of them, strings by code point, and the
 * render's errors, which unwind with longjmp to jinja_render. */
#define _GNU_SOURCE
#include "../base/utf8.h"
#include "jinja_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

_Noreturn void jv_rerr(struct rctx *r, int32_t line, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    err_set("jinja: line %d: %s", line, msg);
    longjmp(r->jb, 1);
}

void *jv_ralloc(struct rctx *r, size_t n)
{
    void *p = arena_alloc(r->a, n);
    if (!p)
        jv_rerr(r, r->line, "render memory limit reached");
    return p;
}

/* ---- output buffer ---- */

void jv_sb_put(struct rctx *r, struct sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 4096;
        while (nc < b->n + n + 1)
            nc *= 2;
        if (nc > MAX_OUTPUT + 4096)
            jv_rerr(r, r->line, "output larger than %u bytes", MAX_OUTPUT);
        char *np = arena_alloc(r->a, nc);
        if (!np)
            jv_rerr(r, r->line, "render memory limit reached");
        if (b->n)
            memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void jv_sb_str(struct rctx *r, struct sbuf *b, const char *s) { jv_sb_put(r, b, s, strlen(s)); }

/* ---- values ---- */



struct jval jv_mk_list(struct rctx *r, int32_t cap)
{
    struct jlist *l = jv_ralloc(r, sizeof *l);
    l->cap = cap > 0 ? cap : 4;
    l->v = jv_ralloc(r, (size_t)l->cap * sizeof *l->v);
    return (struct jval){.t = J_LIST, .l = l};
}

void jv_list_add(struct rctx *r, struct jlist *l, struct jval v)
{
    if (l->n == l->cap) {
        struct jval *nv = jv_ralloc(r, (size_t)l->cap * 2 * sizeof *nv);
        memcpy(nv, l->v, (size_t)l->n * sizeof *nv);
        l->v = nv;
        l->cap *= 2;
    }
    l->v[l->n++] = v;
}

struct jval jv_mk_dict(struct rctx *r)
{
    struct jdict *d = jv_ralloc(r, sizeof *d);
    return (struct jval){.t = J_DICT, .d = d};
}

static bool jv_str_eq(struct jval a, const char *s, size_t n) { return a.t == J_STR && a.s.n == n && memcmp(a.s.p, s, n) == 0; }

struct jval *jv_dict_find(const struct jdict *d, const char *k, size_t n)
{
    for (int32_t i = 0; i < d->n; i++)
        if (jv_str_eq(d->k[i], k, n))
            return &d->v[i];
    return NULL;
}

void jv_dict_set(struct rctx *r, struct jdict *d, struct jval k, struct jval v)
{
    struct jval *old = k.t == J_STR ? jv_dict_find(d, k.s.p, k.s.n) : NULL;
    if (old) {
        *old = v;
        return;
    }
    if (d->n == d->cap) {
        int32_t nc = d->cap ? d->cap * 2 : 8;
        struct jval *nk = jv_ralloc(r, (size_t)nc * sizeof *nk), *nv = jv_ralloc(r, (size_t)nc * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, (size_t)d->n * sizeof *nk);
            memcpy(nv, d->v, (size_t)d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

struct jval jv_from_json(struct rctx *r, json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        struct jval d = jv_mk_dict(r);
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) jv_dict_set(r, d.d, mk_str(k, strlen(k)), jv_from_json(r, v));
        return d;
    }
    case JSON_ARRAY: {
        struct jval l = jv_mk_list(r, (int32_t)json_array_size(j));
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) jv_list_add(r, l.l, jv_from_json(r, v));
        return l;
    }
    case JSON_STRING: return mk_str(json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return mk_int(json_integer_value(j));
    case JSON_REAL: return mk_float(json_real_value(j));
    case JSON_TRUE: return mk_bool(true);
    case JSON_FALSE: return mk_bool(false);
    default: return JV_NONE;
    }
}

bool jv_truthy(struct jval v)
{
    switch (v.t) {
    case J_UNDEF:
    case J_NONE: return false;
    case J_BOOL: return v.b;
    case J_INT: return v.i != 0;
    case J_FLOAT: return v.f != 0;
    case J_STR: return v.s.n > 0;
    case J_LIST: return v.l->n > 0;
    case J_DICT: return v.d->n > 0;
    default: return true;
    }
}

const char *jv_type_name(struct jval v)
{
    static const char *const n[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list", "dict", "Macro",
                                    "builtin_function_or_method", "builtin_function_or_method"};
    if (v.t == J_LIST && v.tuple)
        return "tuple";
    if (v.t == J_DICT && v.ns)
        return "Namespace";
    return n[v.t];
}

/* Python's repr(float): the shortest digits that read back the same. */
static void jv_fmt_float(char *buf, size_t n, double f)
{
    if (isnan(f)) {
        snprintf(buf, n, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, n, f > 0 ? "inf" : "-inf");
        return;
    }
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f)
            break;
    }
    /* tmp is d.ddde[+-]XX: choose fixed or exponent notation as repr does */
    char *e = strchr(tmp, 'e');
    int exp10 = atoi(e + 1);
    char digits[40];
    size_t nd = 0;
    for (char *c = tmp; c < e; c++)
        if (*c >= '0' && *c <= '9')
            digits[nd++] = *c;
    digits[nd] = 0;
    const char *sign = f < 0 ? "-" : "";
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 >= 0) {
            char ip[40], fp[40];
            size_t ni = (size_t)exp10 + 1;
            for (size_t i = 0; i < ni; i++)
                ip[i] = i < nd ? digits[i] : '0';
            ip[ni] = 0;
            size_t nf = nd > ni ? nd - ni : 0;
            memcpy(fp, digits + ni < digits + nd ? digits + ni : "", nf);
            fp[nf] = 0;
            snprintf(buf, n, "%s%s.%s", sign, ip, nf ? fp : "0");
        } else {
            snprintf(buf, n, "%s0.%0*d%s", sign, -exp10 - 1, 0, digits);
            if (-exp10 - 1 == 0) /* %0*d with width 0 prints "0": drop it */
                snprintf(buf, n, "%s0.%s", sign, digits);
        }
    } else {
        char mant[48];
        if (nd > 1)
            snprintf(mant, sizeof mant, "%c.%s", digits[0], digits + 1);
        else
            snprintf(mant, sizeof mant, "%c", digits[0]);
        snprintf(buf, n, "%s%se%c%02d", sign, mant, exp10 < 0 ? '-' : '+', abs(exp10));
    }
}

static bool jv_py_printable(uint32_t cp)
{
    if (cp == ' ')
        return true;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return !(c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF || c == UTF8PROC_CATEGORY_CS ||
             c == UTF8PROC_CATEGORY_CO || c == UTF8PROC_CATEGORY_CN || c == UTF8PROC_CATEGORY_ZL ||
             c == UTF8PROC_CATEGORY_ZP || c == UTF8PROC_CATEGORY_ZS);
}

static void jv_put_repr_str(struct rctx *r, struct sbuf *b, const char *s, size_t n)
{
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    jv_sb_put(r, b, &q, 1);
    size_t i = 0, bad;
    uint32_t cp;
    while (i < n) {
        size_t l = utf8_seq((const unsigned char *)s + i, n - i, &bad, &cp);
        char esc[16];
        if (!l) {
            l = bad;
            cp = 0xfffd;
        }
        if (cp == '\\' || cp == (uint32_t)q) {
            esc[0] = '\\';
            esc[1] = (char)cp;
            jv_sb_put(r, b, esc, 2);
        } else if (cp == '\n')
            jv_sb_str(r, b, "\\n");
        else if (cp == '\r')
            jv_sb_str(r, b, "\\r");
        else if (cp == '\t')
            jv_sb_str(r, b, "\\t");
        else if (!jv_py_printable(cp)) {
            snprintf(esc, sizeof esc, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", cp);
            jv_sb_str(r, b, esc);
        } else {
            jv_sb_put(r, b, s + i, l);
        }
        i += l;
    }
    jv_sb_put(r, b, &q, 1);
}

static void jv_put_repr(struct rctx *r, struct sbuf *b, struct jval v)
{
    if (v.t == J_STR)
        jv_put_repr_str(r, b, v.s.p, v.s.n);
    else
        jv_put_str(r, b, v);
}

/* str(v) as Python prints it */
void jv_put_str(struct rctx *r, struct sbuf *b, struct jval v)
{
    char buf[64];
    switch (v.t) {
    case J_UNDEF: return;
    case J_NONE: jv_sb_str(r, b, "None"); return;
    case J_BOOL: jv_sb_str(r, b, v.b ? "True" : "False"); return;
    case J_INT: snprintf(buf, sizeof buf, "%lld", (long long)v.i); jv_sb_str(r, b, buf); return;
    case J_FLOAT: jv_fmt_float(buf, sizeof buf, v.f); jv_sb_str(r, b, buf); return;
    case J_STR: jv_sb_put(r, b, v.s.p, v.s.n); return;
    case J_LIST:
        jv_sb_str(r, b, v.tuple ? "(" : "[");
        for (int32_t i = 0; i < v.l->n; i++) {
            if (i)
                jv_sb_str(r, b, ", ");
            jv_put_repr(r, b, v.l->v[i]);
        }
        jv_sb_str(r, b, v.tuple ? (v.l->n == 1 ? ",)" : ")") : "]");
        return;
    case J_DICT:
        if (v.ns) {
            jv_sb_str(r, b, "<Namespace ");
        }
        jv_sb_str(r, b, "{");
        for (int32_t i = 0; i < v.d->n; i++) {
            if (i)
                jv_sb_str(r, b, ", ");
            jv_put_repr(r, b, v.d->k[i]);
            jv_sb_str(r, b, ": ");
            jv_put_repr(r, b, v.d->v[i]);
        }
        jv_sb_str(r, b, v.ns ? "}>" : "}");
        return;
    default: jv_sb_str(r, b, "<function>"); return;
    }
}

struct jval jv_to_str(struct rctx *r, struct jval v)
{
    if (v.t == J_STR)
        return v;
    struct sbuf b = {0};
    jv_put_str(r, &b, v);
    return mk_str(b.p ? b.p : "", b.n);
}

static void jv_put_json_str(struct rctx *r, struct sbuf *b, const char *s, size_t n)
{
    jv_sb_str(r, b, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *e = NULL;
        char u[8];
        if (c == '"')
            e = "\\\"";
        else if (c == '\\')
            e = "\\\\";
        else if (c == '\n')
            e = "\\n";
        else if (c == '\r')
            e = "\\r";
        else if (c == '\t')
            e = "\\t";
        else if (c == '\b')
            e = "\\b";
        else if (c == '\f')
            e = "\\f";
        else if (c < 0x20) {
            snprintf(u, sizeof u, "\\u%04x", c);
            e = u;
        }
        if (e) {
            jv_sb_put(r, b, s + run, i - run);
            jv_sb_str(r, b, e);
            run = i + 1;
        }
    }
    jv_sb_put(r, b, s + run, n - run);
    jv_sb_str(r, b, "\"");
}

/* json.dumps(v, ensure_ascii=False, indent=indent, separators default, sort_keys) */
void jv_put_json(struct rctx *r, struct sbuf *b, struct jval v, int indent, int level, bool sort_keys, int32_t line)
{
    char buf[64];
    switch (v.t) {
    case J_NONE:
    case J_UNDEF: jv_sb_str(r, b, "null"); return;
    case J_BOOL: jv_sb_str(r, b, v.b ? "true" : "false"); return;
    case J_INT: snprintf(buf, sizeof buf, "%lld", (long long)v.i); jv_sb_str(r, b, buf); return;
    case J_FLOAT:
        if (isnan(v.f))
            jv_sb_str(r, b, "NaN");
        else if (isinf(v.f))
            jv_sb_str(r, b, v.f > 0 ? "Infinity" : "-Infinity");
        else {
            jv_fmt_float(buf, sizeof buf, v.f);
            jv_sb_str(r, b, buf);
        }
        return;
    case J_STR: jv_put_json_str(r, b, v.s.p, v.s.n); return;
    case J_LIST:
    case J_DICT: {
        bool list = v.t == J_LIST;
        int32_t n = list ? v.l->n : v.d->n;
        if (n == 0) {
            jv_sb_str(r, b, list ? "[]" : "{}");
            return;
        }
        int32_t *order = jv_ralloc(r, sizeof(int32_t) * (size_t)n);
        for (int32_t i = 0; i < n; i++)
            order[i] = i;
        if (!list && sort_keys) /* insertion sort by key bytes (== code point order for UTF-8) */
            for (int32_t i = 1; i < n; i++)
                for (int32_t j = i; j > 0; j--) {
                    struct jval x = v.d->k[order[j - 1]], y = v.d->k[order[j]];
                    size_t m = x.s.n < y.s.n ? x.s.n : y.s.n;
                    int c = memcmp(x.s.p, y.s.p, m);
                    if (c < 0 || (c == 0 && x.s.n <= y.s.n))
                        break;
                    int32_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        jv_sb_str(r, b, list ? "[" : "{");
        for (int32_t k = 0; k < n; k++) {
            int32_t i = order[k];
            if (k)
                jv_sb_str(r, b, indent >= 0 ? "," : ", ");
            if (indent >= 0) {
                jv_sb_str(r, b, "\n");
                for (int s = 0; s < indent * (level + 1); s++)
                    jv_sb_str(r, b, " ");
            }
            if (!list) {
                struct jval key = v.d->k[i];
                if (key.t != J_STR)
                    key = jv_to_str(r, key);
                jv_put_json_str(r, b, key.s.p, key.s.n);
                jv_sb_str(r, b, ": ");
            }
            jv_put_json(r, b, list ? v.l->v[i] : v.d->v[i], indent, level + 1, sort_keys, line);
        }
        if (indent >= 0) {
            jv_sb_str(r, b, "\n");
            for (int s = 0; s < indent * level; s++)
                jv_sb_str(r, b, " ");
        }
        jv_sb_str(r, b, list ? "]" : "}");
        return;
    }
    default: jv_rerr(r, line, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
}

/* ---- strings by code point ---- */

size_t jv_cp_count(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xc0) != 0x80;
    return c;
}

/* byte offset of code point k (k <= count) */
size_t jv_cp_offset(const char *s, size_t n, size_t k)
{
    size_t i = 0;
    while (k > 0 && i < n) {
        i++;
        while (i < n && ((unsigned char)s[i] & 0xc0) == 0x80)
            i++;
        k--;
    }
    return i;
}

bool jv_is_py_space_at(const char *s, size_t n, size_t i, size_t *len)
{
    size_t bad;
    uint32_t cp;
    size_t l = utf8_seq((const unsigned char *)s + i, n - i, &bad, &cp);
    if (!l)
        return false;
    *len = l;
    return (cp >= 9 && cp <= 13) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}

/* str.strip / lstrip / rstrip, with chars (NULL = whitespace) */
struct jval jv_strip(struct jval s, const struct jval *chars, bool left, bool right)
{
    const char *p = s.s.p;
    size_t b = 0, e = s.s.n, l;
    if (chars && chars->t == J_STR) {
        while (left && b < e && memchr(chars->s.p, p[b], chars->s.n))
            b++;
        while (right && e > b && memchr(chars->s.p, p[e - 1], chars->s.n))
            e--;
        return mk_str(p + b, e - b);
    }
    while (left && b < e && jv_is_py_space_at(p, e, b, &l))
        b += l;
    while (right && e > b) {
        size_t k = e - 1;
        while (k > b && ((unsigned char)p[k] & 0xc0) == 0x80)
            k--;
        if (!jv_is_py_space_at(p, e, k, &l))
            break;
        e = k;
    }
    return mk_str(p + b, e - b);
}
