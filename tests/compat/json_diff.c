/* tests/compat/json_diff.c: compares Ember's `inspect --json` output with the JSON that
 * compat_gguf_probe wrote from what ggml reads, for tests/ggml_compat.sh.
 *
 *   compat_json_diff EXPECTED.json ACTUAL.json
 *
 * Numbers are compared as their text, so integers are exact at any size (u64 above 2^53
 * included) and floats must be printed as agreed (%.9g for f32, %.17g for f64), which makes
 * the comparison bitwise. Strings are compared after unescaping, byte for byte. Arrays
 * compare in order; objects by key, and keys only the actual side has are allowed (the
 * format may grow). Differences are printed with their path (metadata entries and tensors
 * labelled by key or name); exit 0 equal, 1 different, 2 unreadable input. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

typedef struct jval {
    enum jtype type;
    bool b;
    char *s;        /* J_NUM: the number's text; J_STR: the unescaped bytes */
    size_t len;     /* J_STR: bytes */
    struct jval *items;
    char **keys;    /* J_OBJ: one per item */
    size_t n;
} jval;

typedef struct parser {
    const char *p, *end, *file;
    const char *start;
    char err[256];
} parser;

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fputs("compat_json_diff: out of memory\n", stderr);
        exit(2);
    }
    return q;
}

static bool perr(parser *ps, const char *what) {
    if (!ps->err[0])
        snprintf(ps->err, sizeof ps->err, "%s: byte %td: %s", ps->file, ps->p - ps->start, what);
    return false;
}

static void skip_ws(parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\n' || *ps->p == '\t' || *ps->p == '\r'))
        ps->p++;
}

/* A byte buffer that grows geometrically (strings can be long: linear appends). */
typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

static char *sb_room(sbuf *b, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = b->cap * 2 > b->len + n ? b->cap * 2 : b->len + n + 64;
        b->p = xrealloc(b->p, b->cap);
    }
    return b->p + b->len;
}

static void put_utf8(sbuf *b, uint32_t cp) {
    char *o = sb_room(b, 4);
    size_t *len = &b->len;
    if (cp < 0x80) { o[0] = (char)cp; *len += 1; }
    else if (cp < 0x800) { o[0] = (char)(0xc0 | cp >> 6); o[1] = (char)(0x80 | (cp & 63)); *len += 2; }
    else if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 63));
        o[2] = (char)(0x80 | (cp & 63)); *len += 3;
    } else {
        o[0] = (char)(0xf0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 63));
        o[2] = (char)(0x80 | ((cp >> 6) & 63)); o[3] = (char)(0x80 | (cp & 63)); *len += 4;
    }
}

static bool hex4(parser *ps, uint32_t *out) {
    if (ps->end - ps->p < 4) return perr(ps, "short \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = *ps->p++;
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return perr(ps, "bad \\u escape");
    }
    *out = v;
    return true;
}

static bool parse_string(parser *ps, char **out, size_t *out_len) {
    ps->p++; /* opening quote */
    sbuf b = { 0 };
    while (ps->p < ps->end && *ps->p != '"') {
        unsigned char c = (unsigned char)*ps->p++;
        if (c < 0x20) { free(b.p); return perr(ps, "raw control character in string"); }
        if (c != '\\') {
            *sb_room(&b, 1) = (char)c;
            b.len++;
            continue;
        }
        if (ps->p >= ps->end) break;
        char e = *ps->p++;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            *sb_room(&b, 1) = map[simple - "\"\\/bfnrt"];
            b.len++;
        } else if (e == 'u') {
            uint32_t cp, lo;
            if (!hex4(ps, &cp)) { free(b.p); return false; }
            if (cp >= 0xd800 && cp < 0xdc00 && ps->end - ps->p >= 6 && ps->p[0] == '\\' &&
                ps->p[1] == 'u') {
                const char *save = ps->p;
                ps->p += 2;
                if (hex4(ps, &lo) && lo >= 0xdc00 && lo < 0xe000)
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                else ps->p = save;
            }
            put_utf8(&b, cp);
        } else {
            free(b.p);
            return perr(ps, "bad escape");
        }
    }
    if (ps->p >= ps->end) { free(b.p); return perr(ps, "unterminated string"); }
    ps->p++;
    *sb_room(&b, 1) = 0;
    *out = b.p;
    *out_len = b.len;
    return true;
}

static bool parse_value(parser *ps, jval *v, int depth);

static bool parse_container(parser *ps, jval *v, int depth, bool obj) {
    v->type = obj ? J_OBJ : J_ARR;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == (obj ? '}' : ']')) { ps->p++; return true; }
    size_t cap = 0;
    for (;;) {
        skip_ws(ps);
        if (v->n == cap) { /* geometric growth: arrays can be long */
            cap = cap ? 2 * cap : 8;
            v->items = xrealloc(v->items, cap * sizeof *v->items);
            if (obj) v->keys = xrealloc(v->keys, cap * sizeof *v->keys);
        }
        memset(&v->items[v->n], 0, sizeof v->items[0]);
        if (obj) {
            v->keys[v->n] = NULL;
            size_t kl;
            if (ps->p >= ps->end || *ps->p != '"') return perr(ps, "object key expected");
            if (!parse_string(ps, &v->keys[v->n], &kl)) return false;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') return perr(ps, "':' expected");
            ps->p++;
        }
        v->n++;
        if (!parse_value(ps, &v->items[v->n - 1], depth + 1)) return false;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
        if (ps->p < ps->end && *ps->p == (obj ? '}' : ']')) { ps->p++; return true; }
        return perr(ps, obj ? "',' or '}' expected" : "',' or ']' expected");
    }
}

static bool parse_value(parser *ps, jval *v, int depth) {
    if (depth > 64) return perr(ps, "nested too deep");
    skip_ws(ps);
    if (ps->p >= ps->end) return perr(ps, "value expected");
    char c = *ps->p;
    if (c == '{' || c == '[') return parse_container(ps, v, depth, c == '{');
    if (c == '"') {
        v->type = J_STR;
        return parse_string(ps, &v->s, &v->len);
    }
    static const char *const words[] = { "true", "false", "null" };
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(ps->end - ps->p) >= n && !memcmp(ps->p, words[i], n)) {
            ps->p += n;
            v->type = i == 2 ? J_NULL : J_BOOL;
            v->b = i == 0;
            return true;
        }
    }
    const char *s = ps->p;
    while (ps->p < ps->end && strchr("+-0123456789.eE", *ps->p) && *ps->p) ps->p++;
    if (ps->p == s) return perr(ps, "unexpected character");
    v->type = J_NUM;
    v->len = (size_t)(ps->p - s);
    v->s = xrealloc(NULL, v->len + 1);
    memcpy(v->s, s, v->len);
    v->s[v->len] = 0;
    return true;
}

static void jfree(jval *v) {
    for (size_t i = 0; i < v->n; i++) {
        jfree(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->s);
}

static bool load(const char *path, jval *v) {
    char *text = NULL;
    size_t len = 0;
    em_err err = { 0 };
    if (em_file_read_all(path, &text, &len, &err) != 0) {
        fprintf(stderr, "compat_json_diff: %s\n", err.msg);
        return false;
    }
    parser ps = { .p = text, .end = text + len, .file = path, .start = text, .err = "" };
    memset(v, 0, sizeof *v);
    bool ok = parse_value(&ps, v, 0);
    skip_ws(&ps);
    if (ok && ps.p != ps.end) ok = perr(&ps, "trailing characters after the value");
    if (!ok) {
        fprintf(stderr, "compat_json_diff: %s\n", ps.err);
        jfree(v);
    }
    free(text);
    return ok;
}

/* ---- comparison ---------------------------------------------------------------------- */

static int g_diffs;
#define MAX_SHOWN 25

static const jval *member(const jval *obj, const char *key) {
    if (obj->type != J_OBJ) return NULL;
    for (size_t i = 0; i < obj->n; i++)
        if (!strcmp(obj->keys[i], key)) return &obj->items[i];
    return NULL;
}

/* A short printable rendering of a value for messages. */
static void show(const jval *v, char *buf, size_t cap) {
    static const char *const tn[] = { "null", "bool", "number", "string", "array", "object" };
    switch (v->type) {
    case J_NULL: snprintf(buf, cap, "null"); break;
    case J_BOOL: snprintf(buf, cap, "%s", v->b ? "true" : "false"); break;
    case J_NUM: snprintf(buf, cap, "%s", v->s); break;
    case J_STR: {
        size_t o = 0;
        buf[o++] = '"';
        for (size_t i = 0; i < v->len && o + 8 < cap; i++) {
            unsigned char c = (unsigned char)v->s[i];
            if (c >= 0x20 && c < 0x7f && c != '"') buf[o++] = (char)c;
            else o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
        }
        snprintf(buf + o, cap - o, v->len > 60 ? "\"...(%zu bytes)" : "\"", v->len);
        break;
    }
    default: snprintf(buf, cap, "%s of %zu", tn[v->type], v->n); break;
    }
}

static void diff(const char *path, const char *what, const jval *want, const jval *got) {
    if (++g_diffs > MAX_SHOWN) return;
    char a[200] = "", b[200] = "";
    if (want) show(want, a, sizeof a);
    if (got) show(got, b, sizeof b);
    printf("  %s: %s: expected %s, got %s\n", path[0] ? path : "(top)", what, want ? a : "(none)",
           got ? b : "(missing)");
}

static void compare(const jval *want, const jval *got, const char *path) {
    if (want->type != got->type) {
        diff(path, "type differs", want, got);
        return;
    }
    char sub[1024];
    switch (want->type) {
    case J_NULL: return;
    case J_BOOL: if (want->b != got->b) diff(path, "value differs", want, got); return;
    case J_NUM: if (strcmp(want->s, got->s)) diff(path, "number differs", want, got); return;
    case J_STR:
        if (want->len != got->len || memcmp(want->s, got->s, want->len))
            diff(path, "string differs", want, got);
        return;
    case J_ARR: {
        if (want->n != got->n) diff(path, "length differs", want, got);
        size_t n = want->n < got->n ? want->n : got->n;
        for (size_t i = 0; i < n; i++) {
            const jval *label = member(&want->items[i], "key");
            if (!label) label = member(&want->items[i], "name");
            if (label && label->type == J_STR)
                snprintf(sub, sizeof sub, "%s[%zu \"%.80s\"]", path, i, label->s);
            else snprintf(sub, sizeof sub, "%s[%zu]", path, i);
            compare(&want->items[i], &got->items[i], sub);
        }
        return;
    }
    case J_OBJ:
        for (size_t i = 0; i < want->n; i++) {
            snprintf(sub, sizeof sub, "%s.%s", path, want->keys[i]);
            const jval *g = member(got, want->keys[i]);
            if (!g) diff(sub, "missing", &want->items[i], NULL);
            else compare(&want->items[i], g, sub);
        }
        return;
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fputs("usage: compat_json_diff EXPECTED.json ACTUAL.json\n", stderr);
        return 2;
    }
    jval want, got;
    if (!load(argv[1], &want)) return 2;
    if (!load(argv[2], &got)) {
        jfree(&want);
        return 2;
    }
    compare(&want, &got, "");
    if (g_diffs > MAX_SHOWN) printf("  ... %d differences in all\n", g_diffs);
    jfree(&want);
    jfree(&got);
    return g_diffs ? 1 : 0;
}
