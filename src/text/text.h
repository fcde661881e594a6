/* text/: the tokenizer and the chat format. Byte-level BPE built from a GGUF's
 * `tokenizer.ggml.*` keys (model "gpt2"), with the pre-tokenizers "kimi-k2" (Moonshot's
 * tokenization_kimi.py pat_str), "gpt-2", "llama-bpe" (Llama 3) and "qwen2", run through
 * PCRE2 (UTF + UCP). Knows nothing of models or sampling.
 *
 * Encoding: text must be valid UTF-8 (anything else is EM_EINVAL naming the byte offset).
 * Special tokens are found first, scanning left to right and taking the longest special at
 * each position: CONTROL tokens only when EM_TOK_PARSE_SPECIAL is given, USER_DEFINED
 * tokens always (as llama.cpp does). The text between them is cut into pieces by the
 * pre-tokenizer and each piece is BPE-merged. Two ways to rank a merge:
 *   - merges: the pair's index in tokenizer.ggml.merges, lowest first, leftmost on ties:
 *     llama.cpp's algorithm;
 *   - tiktoken: a pair merges when its concatenation is a NORMAL token, ranked by that
 *     token's id, and a piece that is itself a token is taken whole: OpenAI tiktoken's
 *     algorithm, which Kimi's tokenizer runs. Right for vocabularies converted from
 *     tiktoken.model, whose ids are the ranks.
 * The two differ where a token cannot be reached by merging two parts (the merges rebuilt
 * from tiktoken ranks have no entry for it): e.g. tiktoken takes a whole-word token that
 * llama.cpp spells in three. Default (EM_TOK_RANKS_AUTO): tiktoken for "kimi-k2" when the
 * file has no merges or its merges confirm that ids are ranks (each merge makes a token of a
 * higher id than the one before, and higher than its parts); merges otherwise.
 *
 * Decoding: NORMAL tokens turn back into bytes through the inverse GPT-2 byte map; CONTROL,
 * USER_DEFINED and UNKNOWN tokens are their text verbatim (CONTROL ones can be skipped);
 * UNUSED tokens decode to nothing. A token may end in the middle of a UTF-8 sequence: the
 * stream helper (em_tok_stream) holds such bytes back until the sequence completes.
 *
 * Deliberate differences from the references, all on unusual input:
 *   - Moonshot's wrapper splits inputs at 400,000 characters and at runs of more than 25,000
 *     (non-)whitespace characters before tiktoken sees them; Ember does not (nor does
 *     llama.cpp), so only such runs can tokenize differently.
 *   - llama.cpp's "kimi-k2" splitter is hand-written and deviates from the pattern: no case
 *     split ("getUserName" stays one piece), combining marks split words (e + U+0301,
 *     Devanagari vowel signs), and its Han test is not Unicode's Script=Han (々 〆 〇).
 *     Ember follows the pattern, as tiktoken runs it; tests/tokenizer_llama.sh lists the
 *     cases.
 *   - Specials overlapping in the text: llama.cpp matches the longest special anywhere
 *     first, Ember the leftmost (longest at that position), as tiktoken does.
 *   - Unicode properties are PCRE2's (Unicode 14 in Debian 12's 10.42): characters assigned
 *     since then read as unassigned and may split differently from tiktoken.
 *
 * A tokenizer is immutable after creation and safe to use from several threads at once.
 * Everything it needs is copied out of the GGUF, which may be closed afterwards. */
#ifndef EM_TEXT_H
#define EM_TEXT_H

#include "base/base.h"
#include "format/gguf.h"

/* llama.cpp token types (tokenizer.ggml.token_type). */
enum em_tok_type {
    EM_TOK_UNDEFINED = 0,
    EM_TOK_NORMAL = 1,
    EM_TOK_UNKNOWN = 2,
    EM_TOK_CONTROL = 3,
    EM_TOK_USER_DEFINED = 4,
    EM_TOK_UNUSED = 5,
    EM_TOK_BYTE = 6,
};

enum em_tok_pre {
    EM_TOK_PRE_GPT2 = 0,  /* "gpt-2" */
    EM_TOK_PRE_KIMI_K2,   /* "kimi-k2" */
    EM_TOK_PRE_LLAMA3,    /* "llama-bpe", "llama3", "llama-v3" (whole-word lookup first) */
    EM_TOK_PRE_QWEN2,     /* "qwen2" */
    EM_TOK_PRE_COUNT,
};

enum em_tok_ranks {
    EM_TOK_RANKS_AUTO = 0, /* see above: tiktoken for kimi-k2 vocabularies, else merges */
    EM_TOK_RANKS_MERGES,
    EM_TOK_RANKS_TIKTOKEN,
};

typedef struct em_tok_opts {
    int ranks; /* enum em_tok_ranks */
} em_tok_opts;

typedef struct em_tok em_tok;

/* Reads the tokenizer keys of g: tokenizer.ggml.model must be "gpt2", tokenizer.ggml.pre one
 * of the names above (another is EM_EUNSUPPORTED naming it), tokens (strings) and
 * token_type (integers, optional: all NORMAL), merges (optional for kimi-k2), the special
 * ids bos/eos/eot/eom/pad/unk (optional; out of range is EM_EFORMAT) and add_bos_token /
 * add_eos_token (default false, true for llama-bpe's bos). Every byte that can occur in
 * valid UTF-8 must have a NORMAL token, else EM_EFORMAT naming the byte. opts may be NULL. */
int em_tok_create(em_tok **out, const em_gguf *g, const em_tok_opts *opts, em_err *err);
void em_tok_free(em_tok *t);

int32_t em_tok_n_vocab(const em_tok *t);
int em_tok_pre_type(const em_tok *t);        /* enum em_tok_pre */
const char *em_tok_pre_name(const em_tok *t); /* as in the file */
int em_tok_ranks(const em_tok *t);           /* EM_TOK_RANKS_MERGES or _TIKTOKEN */
int em_tok_type_of(const em_tok *t, int32_t id); /* enum em_tok_type; -1 when out of range */
/* Special ids; -1 when the file has none. */
int32_t em_tok_bos(const em_tok *t);
int32_t em_tok_eos(const em_tok *t);
int32_t em_tok_eot(const em_tok *t);
int32_t em_tok_pad(const em_tok *t);
bool em_tok_add_bos(const em_tok *t);
bool em_tok_add_eos(const em_tok *t);
/* End of generation: eos, eot, eom, or a CONTROL token named like one (<|im_end|>,
 * <|eot_id|>, <|endoftext|>, <|end|>, <end_of_turn>, <|eom_id|>, <EOT>, ...: llama.cpp's
 * list). */
bool em_tok_is_eog(const em_tok *t, int32_t id);
/* The id of the token whose text is exactly text (any type); -1 when none. */
int32_t em_tok_find(const em_tok *t, const char *text, size_t len);

/* ---- encoding ---------------------------------------------------------------------- */

enum {
    EM_TOK_PARSE_SPECIAL = 1u << 0, /* CONTROL token text in the input becomes the token */
    EM_TOK_ADD_SPECIAL = 1u << 1,   /* BOS / EOS as the model asks (add_bos / add_eos) */
};

/* Token ids of text[0..len) into a new array *ids (free()), *n_ids long (an empty text gives
 * n_ids 0 and a non-NULL array). */
int em_tok_encode(const em_tok *t, const char *text, size_t len, unsigned flags, int32_t **ids,
                  size_t *n_ids, em_err *err);

/* ---- decoding ---------------------------------------------------------------------- */

enum {
    EM_TOK_SKIP_SPECIAL = 1u << 0, /* CONTROL tokens decode to nothing */
};

/* The bytes id stands for (see above; not NUL-terminated); NULL when id is out of range. */
const char *em_tok_piece(const em_tok *t, int32_t id, size_t *len);
/* The token's text as stored in the file (GPT-2-mapped for NORMAL tokens). */
const char *em_tok_text(const em_tok *t, int32_t id, size_t *len);
/* Longest piece, in bytes. */
size_t em_tok_max_piece(const em_tok *t);

/* Concatenated bytes of ids into a new NUL-terminated buffer *out (free()), *len bytes
 * without the NUL. The bytes need not be valid UTF-8 (a cut sequence at the end, or ids
 * that never came from encoding). An id out of range is EM_EINVAL. */
int em_tok_decode(const em_tok *t, const int32_t *ids, size_t n_ids, unsigned flags,
                  char **out, size_t *len, em_err *err);

/* Streaming decode: push ids one by one; each push hands out the bytes that are complete so
 * far. Bytes that begin a UTF-8 sequence the pushed tokens have not finished are held back
 * (at most 3); bytes that can never become valid UTF-8 are handed out at once, as they are,
 * or as U+FFFD (one per maximal invalid subpart, Unicode's rule) with
 * EM_TOK_STREAM_REPLACE. Concatenating every push and the final flush gives exactly
 * em_tok_decode of the same ids (without REPLACE). */
enum {
    EM_TOK_STREAM_SKIP_SPECIAL = EM_TOK_SKIP_SPECIAL,
    EM_TOK_STREAM_REPLACE = 1u << 1,
};

typedef struct em_tok_stream em_tok_stream;

int em_tok_stream_create(em_tok_stream **out, const em_tok *t, unsigned flags, em_err *err);
void em_tok_stream_free(em_tok_stream *s);
/* *bytes points into the stream (valid until the next call), *n bytes. */
int em_tok_stream_push(em_tok_stream *s, int32_t id, const char **bytes, size_t *n,
                       em_err *err);
/* Hands out what is held back (as is, or as U+FFFD with REPLACE) and starts over. */
void em_tok_stream_flush(em_tok_stream *s, const char **bytes, size_t *n);

/* ---- UTF-8 --------------------------------------------------------------------------- */

/* The GPT-2 byte->unicode map of byte-level BPE token text: the code point that stands for
 * byte b, and back (-1 for a code point that stands for no byte). The one copy: the
 * tokenizer reads vocabularies with it, the converter (convert/) writes them with it. */
uint32_t em_tok_byte_to_unicode(uint8_t b);
int em_tok_unicode_to_byte(uint32_t cp);

/* Offset of the first byte of text[0..len) that is not part of valid UTF-8 (Unicode's
 * well-formed sequences: no overlongs, surrogates or code points past U+10FFFF), or len
 * when all of it is valid. */
size_t em_utf8_valid_prefix(const char *text, size_t len);

/* ---- pre-tokenizer (exposed for tests and tools) --------------------------------------- */

/* Cuts text[0..len) (valid UTF-8) into the pieces pre-tokenizer pre makes: *offs gets
 * n_pieces + 1 byte offsets (free()), piece i is [offs[i], offs[i+1]). */
int em_pretok_split(int pre, const char *text, size_t len, size_t **offs, size_t *n_pieces,
                    em_err *err);
/* The pattern pre runs (PCRE2 syntax). */
const char *em_pretok_pattern(int pre);
/* Pre-tokenizer named name (a tokenizer.ggml.pre value), or -1. */
int em_pretok_from_name(const char *name);

/* ---- chat format ----------------------------------------------------------------------- */

typedef struct em_chat_msg {
    const char *role;    /* "system", "user", "assistant", ... ([A-Za-z0-9_]+) */
    const char *name;    /* shown instead of role after the role marker; NULL: role */
    const char *content; /* NULL: empty */
} em_chat_msg;

/* Kimi's chat format (Kimi-Linear's tokenizer_config.json chat_template):
 *   per message   <|im_{role}|>{name or role}<|im_middle|>{content}<|im_end|>
 *   then, with add_generation_prompt, <|im_assistant|>assistant<|im_middle|>
 * No default system message, no BOS. *out is a new NUL-terminated string (free()). */
int em_chat_render_kimi(const em_chat_msg *msgs, size_t n_msgs, bool add_generation_prompt,
                        char **out, size_t *len, em_err *err);
/* Encodes the conversation in Kimi's chat format: the template's markers are their CONTROL
 * tokens, names and contents are plain text (encoded without EM_TOK_PARSE_SPECIAL, as
 * llama-server does), so special-token text in a message stays text and cannot forge a turn.
 * Without such text the ids equal em_chat_render_kimi's string encoded with specials parsed
 * (transformers' apply_chat_template). Checks first that every role marker used, <|im_middle|>
 * and <|im_end|> are CONTROL tokens of t. */
int em_chat_encode_kimi(const em_tok *t, const em_chat_msg *msgs, size_t n_msgs,
                        bool add_generation_prompt, int32_t **ids, size_t *n_ids, em_err *err);

#endif
