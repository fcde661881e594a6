/* text/ internals shared by tokenizer.c, pretok.c and chat.c; not an interface for other
 * layers (they use text.h). */
#ifndef EM_TEXT_IMPL_H
#define EM_TEXT_IMPL_H

#include "text/text.h"

/* A compiled pre-tokenizer pattern (PCRE2 code, JIT-compiled when the platform allows).
 * Immutable once made: several threads may split with one at the same time. */
typedef struct em_pretok em_pretok;

int em_pretok_create(em_pretok **out, int pre, em_err *err);
void em_pretok_free(em_pretok *p);

/* Called once per piece, in text order; a nonzero return stops the split and is returned. */
typedef int (*em_pretok_fn)(void *ctx, size_t start, size_t end);

/* Cuts text[0..len) (valid UTF-8, already checked) into pieces. Text the pattern does not
 * match (no pattern here leaves any, but the rule is llama.cpp's) becomes a piece of its
 * own. */
int em_pretok_run(const em_pretok *p, const char *text, size_t len, em_pretok_fn fn, void *ctx,
                  em_err *err);

/* UTF-8 sequence status at p[0..n) (n >= 1). */
enum { EM_UTF8_VALID, EM_UTF8_INCOMPLETE, EM_UTF8_INVALID };
/* VALID: *seq = length of the sequence starting at p. INCOMPLETE: p[0..n) is a proper prefix
 * of a valid sequence (more bytes could complete it). INVALID: *seq = length of the maximal
 * subpart to replace by one U+FFFD (>= 1). */
int em_utf8_check(const uint8_t *p, size_t n, size_t *seq);

#endif
