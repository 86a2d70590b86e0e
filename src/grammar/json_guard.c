/* json_guard: a byte-level JSON recogniser (RFC 8259: objects, arrays,
 * strings with escapes and UTF-8, numbers, true/false/null), one object at
 * the top. See json_guard.h. */
#include "json_guard.h"

#include <string.h>

enum {
    S_TOP,       /* before the object: whitespace, '{' */
    S_VALUE,     /* a value is due */
    S_OBJ_FIRST, /* after '{': a key or '}' */
    S_OBJ_KEY,   /* after ',' in an object: a key */
    S_COLON,     /* after a key */
    S_OBJ_NEXT,  /* after a member: ',' or '}' */
    S_ARR_FIRST, /* after '[': a value or ']' */
    S_ARR_NEXT,  /* after an element: ',' or ']' */
    S_STRING,
    S_ESC,       /* after a backslash */
    S_HEX,       /* \u: hex_left digits to go */
    S_LIT,       /* true / false / null: lit, lit_pos bytes matched */
    S_NUM_MINUS, /* '-': a digit is due */
    S_NUM_ZERO,  /* a leading 0 */
    S_NUM_INT,
    S_NUM_DOT,   /* '.': a digit is due */
    S_NUM_FRAC,
    S_NUM_E,     /* 'e': a sign or digit is due */
    S_NUM_ESIGN, /* a digit is due */
    S_NUM_EXP,
    S_DONE,
};

static const char *const literals[3] = {"true", "false", "null"};

void json_guard_init(struct json_guard *g)
{
    memset(g, 0, sizeof *g);
    g->state = S_TOP;
}

void json_guard_init_value(struct json_guard *g)
{
    memset(g, 0, sizeof *g);
    g->state = S_VALUE;
}

bool json_guard_done(const struct json_guard *g) { return g->state == S_DONE; }

bool json_guard_number_ends(const struct json_guard *g)
{
    return g->depth == 0 && (g->state == S_NUM_ZERO || g->state == S_NUM_INT || g->state == S_NUM_FRAC ||
                             g->state == S_NUM_EXP);
}

static int push(struct json_guard *g, bool object)
{
    if (g->depth >= JSON_GUARD_MAX_DEPTH)
        return -1;
    const int d = g->depth++;
    if (object)
        g->stack[d / 8] |= (uint8_t)(1u << (d % 8));
    else
        g->stack[d / 8] &= (uint8_t)~(1u << (d % 8));
    g->state = object ? S_OBJ_FIRST : S_ARR_FIRST;
    return 0;
}

/* A value just ended: back to its container, or done at the top. */
static void value_end(struct json_guard *g)
{
    if (g->depth == 0) {
        g->state = S_DONE;
        return;
    }
    const int d = g->depth - 1;
    g->state = (g->stack[d / 8] >> (d % 8)) & 1 ? S_OBJ_NEXT : S_ARR_NEXT;
}

static int close_container(struct json_guard *g)
{
    g->depth--;
    value_end(g);
    return 0;
}

static int begin_value(struct json_guard *g, unsigned char c)
{
    switch (c) {
    case '{':
        return push(g, true);
    case '[':
        return push(g, false);
    case '"':
        g->state = S_STRING;
        g->in_key = false;
        g->chars = 0;
        return 0;
    case '-':
        g->state = S_NUM_MINUS;
        return 0;
    case '0':
        g->state = S_NUM_ZERO;
        g->digits = 1;
        return 0;
    case 't':
    case 'f':
    case 'n':
        g->state = S_LIT;
        g->lit = c == 't' ? 0 : c == 'f' ? 1 : 2;
        g->lit_pos = 1;
        return 0;
    default:
        if (c >= '1' && c <= '9') {
            g->state = S_NUM_INT;
            g->digits = 1;
            return 0;
        }
        return -1;
    }
}

static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* One digit more in the number's current part, at most max (json_guard.h). */
static int digit_more(struct json_guard *g, uint8_t max) { return ++g->digits > max ? -1 : 0; }

static int step(struct json_guard *g, unsigned char c)
{
    const bool ws = c == ' ' || c == '\t' || c == '\n' || c == '\r';
    switch (g->state) {
    case S_TOP:
    case S_VALUE:
    case S_OBJ_FIRST:
    case S_OBJ_KEY:
    case S_COLON:
    case S_OBJ_NEXT:
    case S_ARR_FIRST:
    case S_ARR_NEXT:
        if (ws)
            return (c == '\n' ? ++g->ws_nl > 1 : ++g->ws_indent > JSON_GUARD_MAX_INDENT) ? -1 : 0;
        g->ws_nl = g->ws_indent = 0;
        break;
    default:
        break;
    }
    switch (g->state) {
    case S_TOP:
        return c == '{' ? push(g, true) : -1;
    case S_VALUE:
        return begin_value(g, c);
    case S_OBJ_FIRST:
        if (c == '}')
            return close_container(g);
        /* fall through */
    case S_OBJ_KEY:
        if (c != '"')
            return -1;
        g->state = S_STRING;
        g->in_key = true;
        g->chars = 0;
        return 0;
    case S_COLON:
        if (c != ':')
            return -1;
        g->state = S_VALUE;
        return 0;
    case S_OBJ_NEXT:
        if (c == ',') {
            g->state = S_OBJ_KEY;
            return 0;
        }
        return c == '}' ? close_container(g) : -1;
    case S_ARR_FIRST:
        return c == ']' ? close_container(g) : begin_value(g, c);
    case S_ARR_NEXT:
        if (c == ',') {
            g->state = S_VALUE;
            return 0;
        }
        return c == ']' ? close_container(g) : -1;
    case S_STRING:
        if (g->utf8_need) {
            if (c < g->utf8_lo || c > g->utf8_hi)
                return -1;
            g->utf8_need--;
            g->utf8_lo = 0x80;
            g->utf8_hi = 0xbf;
            return 0;
        }
        if (c == '"') {
            if (g->in_key)
                g->state = S_COLON;
            else
                value_end(g);
            return 0;
        }
        g->chars += c >= 0xf0 ? 2 : 1; /* a character begins: a 4-byte sequence is two UTF-16 units */
        if (c == '\\') {
            g->state = S_ESC;
            return 0;
        }
        if (c < 0x20)
            return -1;
        if (c < 0x80)
            return 0;
        /* well-formed UTF-8 only (RFC 3629): no overlong forms, surrogates or
         * code points past U+10FFFF */
        g->utf8_lo = 0x80;
        g->utf8_hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf)
            g->utf8_need = 1;
        else if (c >= 0xe0 && c <= 0xef) {
            g->utf8_need = 2;
            if (c == 0xe0)
                g->utf8_lo = 0xa0;
            if (c == 0xed)
                g->utf8_hi = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            g->utf8_need = 3;
            if (c == 0xf0)
                g->utf8_lo = 0x90;
            if (c == 0xf4)
                g->utf8_hi = 0x8f;
        } else
            return -1;
        return 0;
    case S_ESC:
        if (c == 'u') {
            g->state = S_HEX;
            g->hex_left = 4;
            return 0;
        }
        if (!strchr("\"\\/bfnrt", c) || c == 0)
            return -1;
        g->state = S_STRING;
        return 0;
    case S_HEX:
        if (!is_digit(c) && !((c | 0x20) >= 'a' && (c | 0x20) <= 'f'))
            return -1;
        if (--g->hex_left == 0)
            g->state = S_STRING;
        return 0;
    case S_LIT:
        if (c != (unsigned char)literals[g->lit][g->lit_pos])
            return -1;
        if (literals[g->lit][++g->lit_pos] == 0)
            value_end(g);
        return 0;
    case S_NUM_MINUS:
        if (!is_digit(c))
            return -1;
        g->state = c == '0' ? S_NUM_ZERO : S_NUM_INT;
        g->digits = 1;
        return 0;
    case S_NUM_ZERO:
    case S_NUM_INT:
    case S_NUM_FRAC:
        if (is_digit(c) && g->state != S_NUM_ZERO)
            return digit_more(g, g->state == S_NUM_INT ? JSON_GUARD_MAX_INT_DIGITS : JSON_GUARD_MAX_FRAC_DIGITS);
        if (c == '.' && g->state != S_NUM_FRAC) {
            g->state = S_NUM_DOT;
            return 0;
        }
        if (c == 'e' || c == 'E') {
            g->state = S_NUM_E;
            return 0;
        }
        value_end(g); /* the number ended: c belongs to what follows it */
        return g->state == S_DONE ? -1 : step(g, c);
    case S_NUM_DOT:
        if (!is_digit(c))
            return -1;
        g->state = S_NUM_FRAC;
        g->digits = 1;
        return 0;
    case S_NUM_E:
        if (c == '+' || c == '-') {
            g->state = S_NUM_ESIGN;
            return 0;
        }
        /* fall through */
    case S_NUM_ESIGN:
        if (!is_digit(c))
            return -1;
        g->state = S_NUM_EXP;
        g->digits = 1;
        return 0;
    case S_NUM_EXP:
        if (is_digit(c))
            return digit_more(g, JSON_GUARD_MAX_EXP_DIGITS);
        value_end(g);
        return g->state == S_DONE ? -1 : step(g, c);
    default: /* S_DONE: nothing may follow */
        return -1;
    }
}

int json_guard_feed(struct json_guard *g, const char *bytes, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (step(g, (unsigned char)bytes[i]) != 0)
            return -1;
    return 0;
}
