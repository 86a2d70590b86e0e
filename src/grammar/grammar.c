/* grammar: constrained decoding's segments, the guard that walks them a byte
 * at a time, and sampling restricted to the tokens it allows. See
 * grammar.h. */
#include "grammar.h"

#include "../base/err.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void grammar_init(struct grammar *g) { memset(g, 0, sizeof *g); }

void grammar_free(struct grammar *g)
{
    free(g->seg);
    free(g->names);
    free(g->strs);
    memset(g, 0, sizeof *g);
}

void grammar_move(struct grammar *dst, struct grammar *src)
{
    *dst = *src;
    memset(src, 0, sizeof *src);
}

/* s[0..n) and a NUL appended to strs: its offset, or -1 (err_set) */
static int64_t strs_add(struct grammar *g, const char *s, size_t n)
{
    if (n > GRAMMAR_MAX_TEXT) /* a guard counts a text's matched bytes in 16 bits */
        return err_set("grammar: a text of %zu bytes is longer than %d", n, GRAMMAR_MAX_TEXT);
    const size_t base = g->n_strs ? g->n_strs : 1; /* offset 0 stays "" */
    if (base + n + 1 > g->cap_strs) {
        size_t cap = g->cap_strs ? g->cap_strs * 2 : 256;
        while (cap < base + n + 1)
            cap *= 2;
        if (cap > UINT32_MAX)
            return err_set("grammar: its texts are too long");
        char *p = realloc(g->strs, cap);
        if (!p)
            return err_set("grammar: out of memory");
        g->strs = p;
        g->cap_strs = cap;
    }
    g->strs[0] = 0;
    memcpy(g->strs + base, s, n);
    g->strs[base + n] = 0;
    g->n_strs = base + n + 1;
    return (int64_t)base;
}

/* Room for one more element in *arr (n used of *cap, at most max): 0 or -1 (err_set). */
static int grow(void **arr, int32_t n, int32_t *cap, size_t size, int32_t max, const char *what)
{
    if (n < *cap)
        return 0;
    if (n >= max)
        return err_set("grammar: more than %d %s", max, what);
    const int32_t nc = *cap ? (*cap * 2 < max ? *cap * 2 : max) : 16;
    void *p = realloc(*arr, (size_t)nc * size);
    if (!p)
        return err_set("grammar: out of memory");
    *arr = p;
    *cap = nc;
    return 0;
}

static int32_t seg_add(struct grammar *g, enum grammar_kind kind)
{
    if (grow((void **)&g->seg, g->n_seg, &g->cap_seg, sizeof *g->seg, GRAMMAR_MAX_SEG, "segments") != 0)
        return -1;
    struct grammar_seg *s = &g->seg[g->n_seg];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->next = g->n_seg + 1;
    s->alt_else = -1;
    return g->n_seg++;
}

int32_t grammar_lit(struct grammar *g, const char *text)
{
    assert(text[0]);
    const int64_t off = strs_add(g, text, strlen(text));
    const int32_t i = off < 0 ? -1 : seg_add(g, GRAM_LIT);
    if (i >= 0)
        g->seg[i].text = (uint32_t)off;
    return i;
}

int32_t grammar_alt(struct grammar *g, const char *a, const char *b)
{
    const char *lit[GRAMMAR_MAX_ALT] = {a, b};
    const int n = b ? 2 : 1;
    for (int k = 0; k < n; k++)
        assert(lit[k][0] && !strchr(lit[k], GRAMMAR_WS[0]) &&
               (n == 1 || strncmp(lit[k], lit[1 - k], strlen(lit[k])) != 0)); /* neither a prefix of the other */
    int64_t off[GRAMMAR_MAX_ALT];
    for (int k = 0; k < n; k++)
        if ((off[k] = strs_add(g, lit[k], strlen(lit[k]))) < 0)
            return -1;
    const int32_t i = seg_add(g, GRAM_ALT);
    if (i < 0)
        return -1;
    g->seg[i].n = n;
    for (int k = 0; k < n; k++) {
        g->seg[i].alt[k] = (uint32_t)off[k];
        g->seg[i].alt_next[k] = i + 1;
    }
    return i;
}

int32_t grammar_names(struct grammar *g, const char *const *names, int32_t n_names, bool ws)
{
    assert(n_names >= 1);
    const int32_t first = g->n_names;
    for (int32_t j = 0; j < n_names; j++) {
        assert(names[j][0]);
        const int64_t off = strs_add(g, names[j], strlen(names[j]));
        if (off < 0 ||
            grow((void **)&g->names, g->n_names, &g->cap_names, sizeof *g->names, GRAMMAR_MAX_NAMES, "names") != 0)
            return -1;
        g->names[g->n_names++] = (struct grammar_name){(uint32_t)off, -1};
    }
    const int32_t i = seg_add(g, GRAM_NAME);
    if (i >= 0) {
        g->seg[i].text = (uint32_t)first;
        g->seg[i].n = n_names;
        g->seg[i].ws = ws;
    }
    return i;
}

/* how far text t is matched after byte c, from pos bytes: a mismatch restarts
 * the match at c alone, exact when t's first byte does not come again in it */
static uint8_t match_more(const char *t, uint8_t pos, unsigned char c)
{
    return (unsigned char)t[pos] == c ? (uint8_t)(pos + 1) : (uint8_t)((unsigned char)t[0] == c);
}

static bool match_ok(const char *t) { return t[0] && strlen(t) < 256 && !strchr(t + 1, t[0]); }

int32_t grammar_value(struct grammar *g, unsigned kinds, const char *forbid)
{
    assert(kinds && kinds < 128 && (!forbid || match_ok(forbid)));
    const int64_t f = forbid ? strs_add(g, forbid, strlen(forbid)) : 0;
    const int32_t i = f < 0 ? -1 : seg_add(g, GRAM_VALUE);
    if (i >= 0) {
        g->seg[i].n = (int32_t)kinds;
        g->seg[i].deny = (uint32_t)f;
        g->seg[i].lo = -HUGE_VAL;
        g->seg[i].hi = HUGE_VAL;
        g->seg[i].max_len = UINT32_MAX;
    }
    return i;
}

/* the largest magnitude a bounded number reaches: its integer digits (json_guard.h) */
#define NUM_MAX 999999999999999.0

/* x within s's range */
static bool in_range(const struct grammar_seg *s, double x)
{
    return (x > s->lo || (x == s->lo && !s->lo_open)) && (x < s->hi || (x == s->hi && !s->hi_open));
}

/* an integer segment's range rounded in to integers, [*lo, *hi] */
static void int_range(const struct grammar_seg *s, double *lo, double *hi)
{
    *lo = s->lo_open ? floor(s->lo) + 1 : ceil(s->lo);
    *hi = s->hi_open ? ceil(s->hi) - 1 : floor(s->hi);
}

static bool integer_only(const struct grammar_seg *s)
{
    return ((unsigned)s->n & (GRAM_V_NUMBER | GRAM_V_INTEGER)) == GRAM_V_INTEGER;
}

int grammar_value_range(struct grammar *g, int32_t seg, double lo, bool lo_open, double hi, bool hi_open)
{
    assert(seg >= 0 && seg < g->n_seg && g->seg[seg].kind == GRAM_VALUE && !isnan(lo) && !isnan(hi));
    struct grammar_seg *s = &g->seg[seg];
    s->lo = lo;
    s->lo_open = lo_open;
    s->hi = hi;
    s->hi_open = hi_open;
    double a = lo, b = hi;
    if (integer_only(s))
        int_range(s, &a, &b);
    /* some value in range, and one a number of bounded digits reaches */
    if (a > b || (a == b && !integer_only(s) && (lo_open || hi_open)) || a > NUM_MAX || b < -NUM_MAX)
        return err_set("grammar: no number of at most 15 integer digits is in the range %g..%g", lo, hi);
    return 0;
}

int grammar_value_string(struct grammar *g, int32_t seg, uint32_t min_len, uint32_t max_len, enum grammar_format f)
{
    assert(seg >= 0 && seg < g->n_seg && g->seg[seg].kind == GRAM_VALUE);
    struct grammar_seg *s = &g->seg[seg];
    const bool fixed = f != GRAM_F_NONE && f != GRAM_F_EMAIL && f != GRAM_F_URI;
    if (min_len > max_len)
        return err_set("grammar: a string of at least %u and at most %u characters", min_len, max_len);
    if (fixed && (min_len > 0 || max_len < UINT32_MAX))
        return err_set("grammar: a date, time or uuid format has its own length");
    if ((f == GRAM_F_EMAIL && max_len < 6) || (f == GRAM_F_URI && max_len < 3))
        return err_set("grammar: no e-mail address or URI has at most %u characters", max_len);
    s->min_len = min_len;
    s->max_len = max_len;
    s->format = f;
    return 0;
}

void grammar_name_jump(struct grammar *g, int32_t seg, int32_t j, int32_t target)
{
    assert(seg >= 0 && seg < g->n_seg && g->seg[seg].kind == GRAM_NAME && j >= 0 && j < g->seg[seg].n && target >= 0);
    g->names[g->seg[seg].text + (uint32_t)j].next = target;
}

void grammar_else(struct grammar *g, int32_t seg, int32_t target)
{
    assert(seg >= 0 && seg < g->n_seg && g->seg[seg].kind == GRAM_ALT && target >= 0);
    g->seg[seg].alt_else = target;
}


int32_t grammar_json(struct grammar *g, const char *forbid)
{
    assert(!forbid || match_ok(forbid));
    const int64_t f = forbid ? strs_add(g, forbid, strlen(forbid)) : 0;
    const int32_t i = f < 0 ? -1 : seg_add(g, GRAM_JSON);
    if (i >= 0)
        g->seg[i].deny = (uint32_t)f;
    return i;
}

int32_t grammar_until(struct grammar *g, const char *terminator, const char *other, const char *deny)
{
    const char *term[GRAMMAR_MAX_ALT] = {terminator, other};
    const int32_t n = other ? 2 : 1;
    int64_t off[GRAMMAR_MAX_ALT];
    for (int32_t k = 0; k < n; k++) {
        assert(match_ok(term[k]));
        if ((off[k] = strs_add(g, term[k], strlen(term[k]))) < 0)
            return -1;
    }
    const int64_t d = deny ? strs_add(g, deny, strlen(deny)) : 0;
    const int32_t i = d < 0 ? -1 : seg_add(g, GRAM_FREE);
    if (i < 0)
        return -1;
    g->seg[i].deny = (uint32_t)d;
    g->seg[i].n = n;
    for (int32_t k = 0; k < n; k++) {
        g->seg[i].alt[k] = (uint32_t)off[k];
        g->seg[i].alt_next[k] = i + 1;
    }
    return i;
}

void grammar_may_end(struct grammar *g, int32_t seg)
{
    assert(seg >= 0 && seg < g->n_seg && g->seg[seg].kind == GRAM_FREE);
    g->seg[seg].may_end = true;
}

void grammar_jump(struct grammar *g, int32_t seg, int32_t alt, int32_t target)
{
    assert(seg >= 0 && seg < g->n_seg && alt < g->seg[seg].n);
    assert(alt < 0 || g->seg[seg].kind == GRAM_ALT || g->seg[seg].kind == GRAM_FREE);
    assert(target >= 0 || (target == GRAMMAR_REFUSE && alt == 1 && g->seg[seg].kind == GRAM_FREE));
    if (alt < 0)
        g->seg[seg].next = target;
    else
        g->seg[seg].alt_next[alt] = target;
}

/* ---- the guard ---- */

static bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void enter(struct guard *gd, int32_t seg)
{
    gd->seg = seg;
    gd->pos = 0;
    gd->ws = 0;
    gd->nl = 0;
    gd->name = 0;
    memset(gd->tpos, 0, sizeof gd->tpos);
    if (seg < gd->gm->n_seg) {
        const struct grammar_seg *s = &gd->gm->seg[seg];
        if (s->kind == GRAM_ALT)
            gd->alive = (uint8_t)((1u << s->n) - 1);
        if (s->kind == GRAM_JSON)
            json_guard_init(&gd->json);
        if (s->kind == GRAM_VALUE)
            json_guard_init_value(&gd->json);
    }
}

void guard_init(struct guard *gd, const struct grammar *gm)
{
    assert(gm->n_seg > 0);
    memset(gd, 0, sizeof *gd);
    gd->gm = gm;
    enter(gd, 0);
}

bool guard_done(const struct guard *gd) { return gd->seg >= gd->gm->n_seg; }

bool guard_may_end(const struct guard *gd)
{
    if (guard_done(gd) || !gd->gm->seg[gd->seg].may_end)
        return false;
    for (int32_t k = 0; k < gd->gm->seg[gd->seg].n; k++)
        if (gd->tpos[k])
            return false;
    return true;
}

/* Whitespace byte c more at a place that takes it: 0, or -1 past the
 * bounds on its bytes and newlines. */
static int ws_more(struct guard *gd, unsigned char c)
{
    if (c == '\n' && gd->gm->max_nl && ++gd->nl > gd->gm->max_nl)
        return -1;
    return ++gd->ws > (gd->gm->max_ws ? gd->gm->max_ws : GRAMMAR_MAX_WS) ? -1 : 0;
}

/* The kind of JSON value a first byte begins, 0 for none. */
static unsigned value_kind(unsigned char c)
{
    switch (c) {
    case '"': return GRAM_V_STRING;
    case 't':
    case 'f': return GRAM_V_BOOL;
    case 'n': return GRAM_V_NULL;
    case '{': return GRAM_V_OBJECT;
    case '[': return GRAM_V_ARRAY;
    default: return c == '-' || (c >= '0' && c <= '9') ? GRAM_V_NUMBER | GRAM_V_INTEGER : 0;
    }
}

/* Whether byte c completes the text a JSON or VALUE segment may not contain. */
static bool denied(struct guard *gd, const struct grammar_seg *s, unsigned char c)
{
    if (!s->deny)
        return false;
    const char *t = gd->gm->strs + s->deny;
    return t[gd->tpos[0] = match_more(t, gd->tpos[0], c)] == 0;
}

/* ---- bounded values ---- */

/* Whether some number of segment s that text t[0..n) (a JSON number's
 * beginning, no exponent) begins is in range; whole: whether t itself is.
 * The numbers a beginning reaches, as magnitudes: an integer part v of k
 * digits reaches [v 10^j, (v+1) 10^j) for each j up to the digits left (an
 * integer's: the integers in it; a leading 0: [0, 1)); a fraction of f
 * digits, [x, x + 10^-f). A negative beginning is checked against the
 * range mirrored. */
static bool num_fits(const struct grammar_seg *s, const char *t, size_t n, bool whole)
{
    char buf[48];
    memcpy(buf, t, n);
    buf[n] = 0;
    const bool neg = n && t[0] == '-';
    if (whole)
        return n > (size_t)neg && in_range(s, strtod(buf, NULL));
    if (neg && s->lo >= 0) /* no negative number, and no -0 either */
        return false;
    const bool integer = integer_only(s);
    double lo = s->lo, hi = s->hi;
    if (integer)
        int_range(s, &lo, &hi);
    /* the magnitudes' range; its lower end's openness does not matter to
     * [a, b), whose points come arbitrarily close to b */
    const double mlo = neg ? -hi : lo, mhi = neg ? -lo : hi;
    const bool hi_open = !integer && (neg ? s->lo_open : s->hi_open);
    const char *d = t + neg, *dot = memchr(d, '.', n - (size_t)neg);
    const size_t k = dot ? (size_t)(dot - d) : n - (size_t)neg;
    /* whether [a, b) (an integer's: the integers a .. b - 1) meets the magnitudes' range */
#define MEETS(a, b) (((a) < mhi || ((a) == mhi && !hi_open)) && (integer ? (b) - 1 >= mlo : (b) > mlo))
    if (dot) {
        const size_t f = n - (size_t)neg - k - 1;
        const double x = strtod(buf + neg, NULL);
        return f == JSON_GUARD_MAX_FRAC_DIGITS ? in_range(s, neg ? -x : x) : MEETS(x, x + pow(10, -(double)f));
    }
    if (k == 0) /* a minus alone: any magnitude */
        return MEETS(0.0, NUM_MAX + 1);
    const double v = strtod(buf + neg, NULL);
    if (v == 0) /* a leading zero: 0, or a fraction */
        return integer ? in_range(s, 0) : MEETS(0.0, 1.0);
    double p = 1;
    for (size_t j = 0; j + k <= JSON_GUARD_MAX_INT_DIGITS; j++, p *= 10)
        if (MEETS(v * p, (v + 1) * p))
            return true;
    return false;
#undef MEETS
}

static bool digit(unsigned char c) { return c >= '0' && c <= '9'; }
static bool alpha(unsigned char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }

static int days_in(int year, int month)
{
    static const int days[12] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    const bool leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    return month == 2 && !leap ? 28 : days[month - 1];
}

/* Whether c can follow the p bytes t[0..p) of a date YYYY-MM-DD. */
static bool date_byte(const char *t, size_t p, unsigned char c)
{
    const int month = p > 6 ? (t[5] - '0') * 10 + t[6] - '0' : 0;
    switch (p) {
    case 4:
    case 7: return c == '-';
    case 5: return c == '0' || c == '1';
    case 6: return t[5] == '0' ? c >= '1' && c <= '9' : c >= '0' && c <= '2';
    case 8: return c >= '0' && c <= (month == 2 ? '2' : '3');
    case 9: {
        const int day = (t[8] - '0') * 10 + c - '0';
        return digit(c) && day >= 1 && day <= days_in(atoi(t), month);
    }
    default: return p < 4 && digit(c);
    }
}

/* Whether c can follow the p bytes t[0..p) of a time HH:MM:SS[.F]Z. */
static bool time_byte(const char *t, size_t p, unsigned char c)
{
    switch (p) {
    case 0: return c >= '0' && c <= '2';
    case 1: return t[0] == '2' ? c >= '0' && c <= '3' : digit(c);
    case 2:
    case 5: return c == ':';
    case 3:
    case 6: return c >= '0' && c <= '5';
    case 4:
    case 7: return digit(c);
    case 8: return c == '.' || c == 'Z';
    default: /* after the seconds: a fraction of up to 9 digits, then Z */
        if (t[p - 1] == 'Z')
            return false;
        return digit(c) ? p < 18 : c == 'Z' && t[p - 1] != '.';
    }
}

/* the bytes a time of p bytes t[0..p) needs at least to be whole */
static uint32_t time_need(const char *t, size_t p) { return p <= 8 ? (uint32_t)(9 - p) : t[p - 1] == 'Z' ? 0 : t[p - 1] == '.' ? 2 : 1; }

static bool uuid_byte(size_t p, unsigned char c)
{
    if (p == 8 || p == 13 || p == 18 || p == 23)
        return c == '-';
    if (p == 14) /* the version */
        return c >= '1' && c <= '8';
    if (p == 19) /* the RFC 4122 variant */
        return c == '8' || c == '9' || c == 'a' || c == 'b';
    return p < 36 && (digit(c) || (c >= 'a' && c <= 'f'));
}

static bool email_atom(unsigned char c) { return alpha(c) || digit(c) || c == '_' || c == '+' || c == '-'; }

static bool uri_byte(unsigned char c)
{
    return alpha(c) || digit(c) || (c && strchr("-._~:/?#[]@!$&'()*+,;=%", c));
}

/* Format f's string taking byte c (not its closing quote): the bytes it
 * needs at least to be whole after it, or -1 when c cannot come. */
static int64_t format_byte(struct guard *gd, enum grammar_format f, unsigned char c)
{
    const size_t p = gd->n_text;
    const char *t = gd->text;
    bool ok;
    uint32_t need = 0;
    switch (f) {
    case GRAM_F_DATE:
        ok = date_byte(t, p, c);
        need = (uint32_t)(9 - p);
        break;
    case GRAM_F_TIME:
        ok = time_byte(t, p, c);
        break;
    case GRAM_F_DATE_TIME:
        ok = p < 10 ? date_byte(t, p, c) : p == 10 ? c == 'T' : time_byte(t + 11, p - 11, c);
        need = (uint32_t)(19 - p);
        break;
    case GRAM_F_UUID:
        ok = uuid_byte(p, c);
        need = (uint32_t)(35 - p);
        break;
    case GRAM_F_EMAIL: /* atoms, '@', labels; the last label letters, 2 or more */
        if (gd->f_part == 0) {
            ok = email_atom(c) || ((c == '.' || c == '@') && gd->f_run > 0);
            gd->f_part = c == '@';
            gd->f_run = email_atom(c) ? (uint8_t)(gd->f_run + (gd->f_run < 255)) : 0;
            gd->f_alpha = true;
            need = c == '@' ? 4 : gd->f_run ? 5 : 6;
        } else {
            ok = alpha(c) || digit(c) || (gd->f_run > 0 && (c == '-' || (c == '.' && gd->f_last != '-')));
            gd->f_labels += c == '.';
            gd->f_run = c == '.' ? 0 : (uint8_t)(gd->f_run + (gd->f_run < 255));
            gd->f_alpha = c == '.' || (gd->f_alpha && alpha(c));
            if (c == '-')
                need = 4; /* "a.bc" */
            else if (c == '.')
                need = 2;
            else if (gd->f_labels == 0 || !gd->f_alpha)
                need = 3; /* ".bc" */
            else
                need = gd->f_run >= 2 ? 0 : 1;
        }
        gd->f_last = (char)c;
        return ok ? (int64_t)need : -1;
    case GRAM_F_URI: /* a scheme, ':', then at least one byte */
        if (gd->f_part == 0) {
            ok = gd->f_run == 0 ? alpha(c) : alpha(c) || digit(c) || (c && strchr("+.-:", c));
            gd->f_part = c == ':';
            gd->f_run = 1;
            need = c == ':' ? 1 : 2;
        } else {
            ok = uri_byte(c);
        }
        return ok ? (int64_t)need : -1;
    default:
        return 0;
    }
    if (!ok || p + 1 >= sizeof gd->text)
        return -1;
    gd->text[gd->n_text++] = (char)c;
    if (f == GRAM_F_TIME || (f == GRAM_F_DATE_TIME && p >= 10))
        need = time_need(t + (f == GRAM_F_TIME ? 0 : 11), p + 1 - (f == GRAM_F_TIME ? 0 : 11));
    return need;
}

/* the bytes an empty string of format f needs at least */
static uint8_t format_need(enum grammar_format f)
{
    static const uint8_t need[] = {[GRAM_F_DATE] = 10, [GRAM_F_TIME] = 9,  [GRAM_F_DATE_TIME] = 20,
                                   [GRAM_F_UUID] = 36, [GRAM_F_EMAIL] = 6, [GRAM_F_URI] = 3};
    return need[f];
}

/* A string value's byte c (after its opening quote; json: the JSON guard
 * past c): 0 while its bounds and format can still be met, -1 otherwise. */
static int string_byte(struct guard *gd, const struct grammar_seg *s, const struct json_guard *json, unsigned char c)
{
    if (json_guard_done(json)) /* c closed it */
        return json->chars >= s->min_len && gd->f_need == 0 ? 0 : -1;
    if (json->chars > s->max_len)
        return -1;
    if (s->format == GRAM_F_NONE)
        return 0;
    const int64_t need = format_byte(gd, s->format, c);
    gd->f_need = (uint8_t)need;
    return need >= 0 && json->chars + (uint64_t)need <= s->max_len ? 0 : -1;
}

static int step(struct guard *gd, unsigned char c)
{
    const struct grammar *gm = gd->gm;
    for (;;) { /* a segment that ends on the byte after it passes the byte on */
        if (gd->seg >= gm->n_seg)
            return -1;
        const struct grammar_seg *s = &gm->seg[gd->seg];
        switch (s->kind) {
        case GRAM_LIT: {
            const char *t = gm->strs + s->text;
            while (t[gd->pos] == GRAMMAR_WS[0]) {
                if (is_ws(c))
                    return ws_more(gd, c);
                gd->pos++;
                gd->ws = 0;
                gd->nl = 0;
            }
            if (t[gd->pos] == 0) { /* it ended on a place for whitespace */
                enter(gd, s->next);
                continue;
            }
            if ((unsigned char)t[gd->pos] != c)
                return -1;
            if (t[++gd->pos] == 0)
                enter(gd, s->next);
            return 0;
        }
        case GRAM_ALT: {
            if (gd->pos == 0 && is_ws(c))
                return ws_more(gd, c);
            uint8_t alive = 0;
            int32_t whole = -1;
            for (int32_t k = 0; k < s->n; k++) {
                const char *t = gm->strs + s->alt[k];
                if (!(gd->alive >> k & 1) || (unsigned char)t[gd->pos] != c)
                    continue;
                alive |= (uint8_t)(1u << k);
                if (t[gd->pos + 1] == 0)
                    whole = k;
            }
            if (!alive && gd->pos == 0 && s->alt_else >= 0) { /* the byte begins what the else is */
                enter(gd, s->alt_else);
                continue;
            }
            if (!alive)
                return -1;
            gd->alive = alive;
            gd->pos++;
            if (whole >= 0)
                enter(gd, s->alt_next[whole]);
            return 0;
        }
        case GRAM_NAME: {
            if (s->ws && gd->pos == 0 && is_ws(c))
                return ws_more(gd, c);
            /* the names that begin with the bytes so far all begin as the
             * first of them does, gd->name */
            const char *cur = gm->strs + gm->names[s->text + (uint32_t)gd->name].text;
            for (int32_t j = 0; c && j < s->n; j++) {
                const char *t = gm->strs + gm->names[s->text + (uint32_t)j].text;
                if ((unsigned char)t[gd->pos] == c && strncmp(t, cur, gd->pos) == 0) {
                    gd->name = j;
                    gd->pos++;
                    return 0;
                }
            }
            int32_t whole = -1;
            for (int32_t j = 0; gd->pos && j < s->n && whole < 0; j++) {
                const struct grammar_name *nm = &gm->names[s->text + (uint32_t)j];
                if (gm->strs[nm->text + gd->pos] == 0 && strncmp(gm->strs + nm->text, cur, gd->pos) == 0)
                    whole = nm->next >= 0 ? nm->next : s->next;
            }
            if (whole < 0)
                return -1;
            enter(gd, whole);
            continue;
        }
        case GRAM_JSON:
            if (denied(gd, s, c))
                return -1;
            if (json_guard_feed(&gd->json, (const char *)&c, 1) != 0)
                return -1;
            if (json_guard_done(&gd->json))
                enter(gd, s->next);
            return 0;
        case GRAM_VALUE: {
            if (denied(gd, s, c))
                return -1;
            if (!gd->name && is_ws(c)) /* before it: the grammar's bound, not the JSON guard's */
                return ws_more(gd, c);
            const bool first = !gd->name;
            if (first) { /* its first byte: a kind it may be */
                const unsigned k = value_kind(c);
                if (!(k & (unsigned)s->n))
                    return -1;
                gd->name = 1;
                gd->number = (k & GRAM_V_NUMBER) != 0;
                gd->n_text = gd->f_part = gd->f_run = gd->f_labels = 0;
                gd->f_need = s->format ? format_need(s->format) : 0;
            }
            /* an integer ends at a fraction or an exponent, and a bounded
             * number at an exponent, which what follows then refuses */
            const bool ranged = gd->number && (s->lo > -HUGE_VAL || s->hi < HUGE_VAL);
            struct json_guard t = gd->json;
            const bool ends = json_guard_number_ends(&gd->json) &&
                              (((c == '.' || c == 'e' || c == 'E') && integer_only(s)) || (ranged && (c | 0x20) == 'e'));
            if (!ends && json_guard_feed(&t, (const char *)&c, 1) == 0) {
                if (ranged) {
                    gd->text[gd->n_text++] = (char)c; /* json_guard bounds its digits: it fits */
                    if (!num_fits(s, gd->text, gd->n_text, false))
                        return -1;
                } else if (!first && !gd->number && (s->min_len || s->max_len < UINT32_MAX || s->format) &&
                           string_byte(gd, s, &t, c) != 0) {
                    return -1;
                }
                gd->json = t;
                if (json_guard_done(&gd->json))
                    enter(gd, s->next);
                return 0;
            }
            if (!json_guard_number_ends(&gd->json) || (ranged && !num_fits(s, gd->text, gd->n_text, true)))
                return -1;
            enter(gd, s->next); /* a number ended: the byte is what follows */
            continue;
        }
        case GRAM_FREE:
            if (c == 0 || (s->deny && strchr(gm->strs + s->deny, c)))
                return -1;
            for (int32_t k = 0; k < s->n; k++) {
                const char *t = gm->strs + s->alt[k];
                if (t[gd->tpos[k] = match_more(t, gd->tpos[k], c)] == 0) {
                    const int32_t to = k ? s->alt_next[k] : s->next;
                    if (to == GRAMMAR_REFUSE)
                        return -1;
                    enter(gd, to);
                    break;
                }
            }
            return 0;
        }
        return -1;
    }
}

int guard_feed(struct guard *gd, const char *bytes, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (step(gd, (unsigned char)bytes[i]) != 0)
            return -1;
    return 0;
}

/* ---- sampling under the guard ---- */

int vocab_bytes_set_end(struct vocab_bytes *vb, const int32_t *ids, int32_t n)
{
    if (!vb->end && !(vb->end = calloc((size_t)vb->n_vocab, 1)))
        return err_set("grammar: out of memory");
    for (int32_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < vb->n_vocab)
            vb->end[ids[i]] = 1;
    return 0;
}

void vocab_bytes_free(struct vocab_bytes *vb)
{
    free(vb->data);
    free(vb->off);
    free(vb->special);
    free(vb->end);
    memset(vb, 0, sizeof *vb);
}

bool guard_allows(const struct guard *gd, const struct vocab_bytes *vb, int32_t id)
{
    if (id < 0 || id >= vb->n_vocab)
        return false;
    if (vb->end && vb->end[id])
        return guard_may_end(gd);
    if (vb->special[id] || vb->off[id] == vb->off[id + 1])
        return false;
    struct guard t = *gd;
    return guard_feed(&t, vb->data + vb->off[id], vb->off[id + 1] - vb->off[id]) == 0;
}
