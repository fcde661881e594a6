/* convert/hftokenizer: Hugging Face tokenizer files read into the vocabulary that llama.cpp's
 * GGUF tokenizer keys need (`tokenizer.ggml.*`), as llama.cpp's converter would write them
 * (convert_hf_to_gguf.py: TextModel.get_vocab_base, KimiLinearModel.set_vocab,
 * KimiK3Model.set_vocab, gguf-py SpecialVocab). Two sources are understood, looked for in
 * this order (the order llama.cpp's Kimi converter tries them):
 *
 *   1. tokenizer.json (HF tokenizers): model.type "BPE" without byte_fallback, a ByteLevel
 *      decoder, model.vocab, model.merges ("a b" strings or [a, b] pairs), added_tokens.
 *      Token text is the vocab piece verbatim (already byte-mapped). Added tokens are
 *      CONTROL when "special" or when they look special (<|...|>, <｜...｜>, <pad>, <mask>,
 *      <unused...>, ...), else USER_DEFINED (with U+2581 turned into a space). Merges are
 *      written as the file has them; pair-form parts have each ' ' turned into U+0120.
 *      Each merge's parts and their concatenation must be model.vocab pieces. (The
 *      added_tokens_decoder of tokenizer_config.json is not consulted on this path.)
 *      The pre-tokenizer is mapped to a llama.cpp pre name by its regex (table below);
 *      anything else is an error naming it: a wrong pre name silently changes how text
 *      is split, so there is no default.
 *        ByteLevel(use_regex, no prefix space)       -> "gpt-2"
 *        Split(GPT-2 regex) + ByteLevel              -> "gpt-2"
 *        Split(Llama-3 regex, \p{N}{1,3}) + ByteLevel -> "llama-bpe"
 *        Split(Qwen2 regex, \p{N}) + ByteLevel       -> "qwen2"
 *        Split(Kimi pat_str) + ByteLevel             -> "kimi-k2"
 *   2. tiktoken.model + tokenizer_config.json (Moonshot's Kimi TikTokenTokenizer): lines
 *      "base64 rank". Token text is the token's bytes through the GPT-2 byte->unicode map.
 *      Specials occupy [n_ranks, n_ranks + 256) as Kimi's tokenizer lays them out: the
 *      content from added_tokens_decoder where it names the id, else
 *      "<|reserved_token_{id}|>"; all CONTROL (the "special" flag is not consulted, as in
 *      Kimi's code). added_tokens_decoder ids at or past n_ranks + 256 are placed at their
 *      ids too (llama.cpp's K2 code would leave them [PAD{id}]). Merges are rebuilt from the
 *      ranks (QwenModel.bpe): for each token of >= 2 bytes in rank order, BPE over its
 *      bytes using only lower ranks; when two parts remain the merge is "part1 part2" in
 *      mapped text (tokens that end in more parts get none, as in llama.cpp; a warning is
 *      logged). Merges follow rank order, which is llama.cpp's (file) order for every
 *      tiktoken file whose lines are sorted by rank. pre = "kimi-k2".
 *
 * Ids in [0, n_tokens) that no source names become "[PAD{id}]" of type UNUSED.
 *
 * Special token ids follow SpecialVocab: with tokenizer.json, tokenizer_config.json's
 * bos/eos/unk/sep/pad/cls/mask_token (a string or {"content": ...}) resolved through
 * tokenizer.json's added_tokens, plus the post_processor's TemplateProcessing /
 * RobertaProcessing rules for add_bos/add_eos (and eos/eot when the template ends in a
 * different token); then config.json's <type>_token_id (top level, else text_config) for
 * the types still unset. Without tokenizer.json only config.json counts. Then the
 * per-architecture rule of llamacpp-formats.md §4.3:
 *   "kimi-linear": with tiktoken.model, eos = the id of tokenizer_config.json's eos_token
 *                  (default "[EOS]") among the specials (llama.cpp's override);
 *   "kimi-k3":     as kimi-linear, then eos = config.json's eos_token_id when it has one
 *                  (text_config first, as the converter's merged hparams);
 *   "dflash" or NULL: no override.
 * A special id that is negative or >= n_tokens is an error.
 *
 * Chat template: tokenizer_config.json "chat_template" (a string, or the "default" entry of
 * a [{name, template}] list; other named templates are dropped with a warning), else
 * chat_template.jinja, else chat_template.json's "chat_template". (llama.cpp reads the
 * latter two only when tokenizer_config.json exists; Ember reads them regardless.) Kimi-K3
 * ships none; the converter must then embed its own (llamacpp-formats.md §4.3).
 *
 * Errors (not handled): byte_fallback BPE (SentencePiece style, tokenizer.ggml.model
 * "llama"), WordPiece/Unigram models, subword prefixes/suffixes, Lowercase normalizers,
 * pre-tokenizers outside the table. Not produced: add_sep and eom (post_processor).
 * Stricter than llama.cpp's converter, which would write a broken vocabulary instead:
 * tiktoken.model must hold all 256 single bytes, no duplicate tokens or ranks, no token over
 * 1024 bytes, no rank inside the special range; specials must not repeat each other or a
 * token's text; tokenizer_class, when stated, must be TikTokenTokenizer.
 *
 * Every error names the file and what is wrong (line numbers for tiktoken.model, the JSON
 * path for the JSON files). Token text uses text/'s GPT-2 byte->unicode map
 * (em_tok_byte_to_unicode, text.h). Sources: hftok_json.c, hftok_tiktoken.c; shared parts in
 * hftokenizer.c. */
#ifndef EM_CONVERT_HFTOKENIZER_H
#define EM_CONVERT_HFTOKENIZER_H

#include "base/base.h"

/* llama.cpp token types (tokenizer.ggml.token_type). */
enum {
    EM_HF_TOKEN_NORMAL = 1,
    EM_HF_TOKEN_CONTROL = 3,      /* specials */
    EM_HF_TOKEN_USER_DEFINED = 4, /* added tokens that are not special */
    EM_HF_TOKEN_UNUSED = 5,       /* [PAD{id}] fillers */
};

/* Upper bound on n_tokens (a guard against absurd ids; real vocabularies are < 1M). */
#define EM_HF_VOCAB_MAX (1u << 24)

typedef struct em_hf_strpool em_hf_strpool;

typedef struct em_hf_vocab {
    uint64_t n_tokens; /* == vocab_size: holes filled with "[PAD{id}]" */
    char **tokens;     /* tokenizer.ggml.tokens, UTF-8, NUL-terminated */
    int32_t *types;    /* tokenizer.ggml.token_type: EM_HF_TOKEN_* */
    uint64_t n_merges;
    char **merges;     /* tokenizer.ggml.merges: "left right", in priority order */
    /* tokenizer.ggml.<type>_token_id; -1 when absent (then write no key) */
    int64_t bos, eos, unk, sep, pad, cls, mask;
    /* tokenizer.ggml.eot_token_id: stated by a post_processor template, else the first of
     * <|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>, <|endoftext|>, ... that exists (the
     * list llama.cpp's loader uses to find it when the key is absent, so writing it changes
     * nothing there); -1 when none. llama.cpp's converter writes the key only when stated. */
    int64_t eot;
    bool eot_stated;
    /* tokenizer.ggml.add_bos_token / add_eos_token: write only when has_add_* */
    bool add_bos, add_eos;
    bool has_add_bos, has_add_eos;
    char *chat_template; /* tokenizer.chat_template; NULL when none */
    char model[8];       /* tokenizer.ggml.model: always "gpt2" (byte-level BPE) */
    char pre[32];        /* tokenizer.ggml.pre: "kimi-k2", "gpt-2", "llama-bpe", "qwen2" */
    char source[16];     /* "tiktoken" or "tokenizer.json" */
    em_hf_strpool *pool; /* internal: owns every string above */
} em_hf_vocab;

/* Reads the tokenizer in dir (see above). vocab_size: the model's vocab_size from
 * config.json (text_config for K3); n_tokens becomes exactly this; a token id >= vocab_size
 * is an error. vocab_size <= 0: the tokenizer's own size (largest id + 1; for tiktoken at
 * least n_ranks + 256, Kimi's reserved range). arch:
 * "kimi-linear", "kimi-k3", "dflash" or NULL, for the eos rule. dir must hold tokenizer.json,
 * or tiktoken.model and tokenizer_config.json; config.json there is read for special ids
 * when present. On failure *v is left empty (nothing to free). */
int em_hf_vocab_load(em_hf_vocab *v, const char *dir, int64_t vocab_size, const char *arch,
                     em_err *err);
void em_hf_vocab_free(em_hf_vocab *v);
/* Whether dir holds tokenizer files (tokenizer.json or tiktoken.model). */
bool em_hf_vocab_present(const char *dir);

#endif
