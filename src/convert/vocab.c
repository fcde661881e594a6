/* convert/vocab.c: the tokenizer.* keys of a converted GGUF, from convert/hftokenizer's
 * vocabulary, in the order and with the types gguf-py writes them (tokens and merges string
 * arrays, token_type INT32, special ids u32, add_* bool, chat template string).
 *
 * Without tokenizer files the file says tokenizer.ggml.model = "none": llama.cpp then loads
 * the model with an empty vocabulary (token ids still work) instead of refusing it for a
 * missing tokenizer.ggml.model. A drafter normally borrows its target's tokenizer
 * (--tokenizer-from); the tokenizer rules of that target's architecture apply (the Kimi eos
 * override), so the two files agree on every special id. */
#include "convert/convert_impl.h"

#include "convert/hftokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The architecture whose tokenizer rules apply: the one of the config.json next to the
 * tokenizer files when it is a Kimi target, else the model's own. */
static const char *vocab_arch(const char *dir, const char *own) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!em_file_exists(path)) return own;
    em_hf_config *c = calloc(1, sizeof *c);
    if (!c) return own;
    const char *arch = own;
    if (em_hf_config_load(c, path, NULL) == EM_OK && c->kind == EM_HF_KIMI)
        arch = c->kimi.is_k3 ? "kimi-k3" : "kimi-linear";
    free(c);
    return arch;
}

static int set_id(em_gguf_writer *w, const char *key, int64_t id, em_err *err) {
    if (id < 0) return EM_OK;
    return em_gguf_writer_set_u32(w, key, (uint32_t)id, err);
}

static int write_specials(em_gguf_writer *w, const em_hf_vocab *v, bool skip_mask,
                          em_err *err) {
    int rc = set_id(w, "tokenizer.ggml.bos_token_id", v->bos, err);
    if (!rc) rc = set_id(w, "tokenizer.ggml.eos_token_id", v->eos, err);
    if (!rc) rc = set_id(w, "tokenizer.ggml.unknown_token_id", v->unk, err);
    if (!rc) rc = set_id(w, "tokenizer.ggml.seperator_token_id", v->sep, err); /* sic */
    if (!rc) rc = set_id(w, "tokenizer.ggml.padding_token_id", v->pad, err);
    if (!rc) rc = set_id(w, "tokenizer.ggml.cls_token_id", v->cls, err);
    if (!rc && !skip_mask) rc = set_id(w, "tokenizer.ggml.mask_token_id", v->mask, err);
    if (!rc && v->eot_stated) rc = set_id(w, "tokenizer.ggml.eot_token_id", v->eot, err);
    if (!rc && v->has_add_bos)
        rc = em_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos, err);
    if (!rc && v->has_add_eos)
        rc = em_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", v->add_eos, err);
    return rc;
}

static int write_vocab(em_gguf_writer *w, const em_hf_vocab *v, bool skip_mask, em_err *err) {
    int rc = em_gguf_writer_set_str(w, "tokenizer.ggml.model", v->model, err);
    if (!rc) rc = em_gguf_writer_set_str(w, "tokenizer.ggml.pre", v->pre, err);
    if (!rc)
        rc = em_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens",
                                        (const char *const *)v->tokens, v->n_tokens, err);
    if (!rc)
        rc = em_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", EM_GGUF_I32, v->types,
                                    v->n_tokens, err);
    if (!rc)
        rc = em_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges",
                                        (const char *const *)v->merges, v->n_merges, err);
    if (!rc) rc = write_specials(w, v, skip_mask, err);
    if (!rc && v->chat_template)
        rc = em_gguf_writer_set_str(w, "tokenizer.chat_template", v->chat_template, err);
    return rc;
}

/* Kimi-K3 checkpoints ship no Jinja template (their renderer is Python): like llama.cpp's
 * converter, write Ember's own (k3_template.c) when the tokenizer files give none. */
static int k3_template(em_gguf_writer *w, const char *arch, em_convert_report *rep, em_err *err) {
    if (strcmp(arch, "kimi-k3") != 0) return EM_OK;
    snprintf(rep->chat_template, sizeof rep->chat_template, "ember kimi-k3");
    return em_gguf_writer_set_str(w, "tokenizer.chat_template", em_cv_k3_chat_template, err);
}

int em_cv_write_vocab(em_gguf_writer *w, const char *dir, int64_t vocab_size, const char *arch,
                      const cv_model *m, em_convert_report *rep, em_err *err) {
    bool model_mask = m->vals[CV_V_MASK_TOKEN].set; /* the drafter states its own */
    rep->chat_template[0] = 0;
    if (!dir || !em_hf_vocab_present(dir)) {
        snprintf(rep->tokenizer, sizeof rep->tokenizer, "none");
        rep->tokenizer_dir[0] = 0;
        rep->n_tokens = 0;
        int rc = em_gguf_writer_set_str(w, "tokenizer.ggml.model", "none", err);
        return rc ? rc : k3_template(w, arch, rep, err);
    }
    em_hf_vocab v;
    const char *rules = vocab_arch(dir, arch);
    int rc = em_hf_vocab_load(&v, dir, vocab_size, rules, err);
    if (rc) return rc;
    if (model_mask && v.mask >= 0 && (uint64_t)v.mask != m->vals[CV_V_MASK_TOKEN].u)
        em_log(EM_LOG_WARN, "%s: the tokenizer's mask token %lld differs from the drafter's "
               "mask_token_id %llu; the drafter's is written", dir, (long long)v.mask,
               (unsigned long long)m->vals[CV_V_MASK_TOKEN].u);
    rc = write_vocab(w, &v, model_mask, err);
    if (!rc && v.chat_template)
        snprintf(rep->chat_template, sizeof rep->chat_template, "%s", "checkpoint");
    else if (!rc) rc = k3_template(w, rules, rep, err);
    if (!rc) {
        snprintf(rep->tokenizer, sizeof rep->tokenizer, "%s/%s", v.model, v.pre);
        snprintf(rep->tokenizer_dir, sizeof rep->tokenizer_dir, "%s", dir);
        rep->n_tokens = (int64_t)v.n_tokens;
    }
    em_hf_vocab_free(&v);
    return rc;
}
