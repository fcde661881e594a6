/* compat_draft_dump: what Ember's target and drafter compute for one prompt, dumped for an
 * independent reimplementation to check (tools/train/xcheck_drafter.py, the PyTorch drafter
 * of the training scripts).
 *
 *   compat_draft_dump TARGET.gguf DRAFT.gguf OUTDIR PROMPT [--chat]
 *
 * Prefills the prompt through the target opened with the drafter's taps as feature layers,
 * takes the target's greedy next token as the anchor, gives the drafter the prompt's features
 * as its context, and proposes one block greedily (slot k's Markov input is the token chosen at
 * slot k-1, the anchor for slot 0). Writes into OUTDIR:
 *   features.f32  [n_prompt][n_feat] little-endian f32 (the taps, concatenated)
 *   logits.f32    [n_drafts][n_vocab] the block's corrected logits, slot by slot
 *   conf.f32      [n_drafts] confidence logits (zeros without a confidence head)
 *   meta.json     {"prompt_ids", "anchor", "draft_tokens", "n_feat", "n_vocab", "taps"}
 * One thread, so the numbers do not depend on the machine. Exit 0, or 1 with a message. */
#include "draft/draft.h"
#include "format/gguf.h"
#include "model/model.h"
#include "sample/sample.h"
#include "text/text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int write_f32(const char *dir, const char *name, const float *v, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(v, sizeof *v, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "compat_draft_dump: cannot write %s\n", path);
        return 1;
    }
    return 0;
}

static void print_ids(FILE *f, const char *key, const int32_t *ids, size_t n) {
    fprintf(f, "\"%s\": [", key);
    for (size_t i = 0; i < n; i++) fprintf(f, "%s%d", i ? ", " : "", ids[i]);
    fprintf(f, "]");
}

static int write_meta(const char *dir, const int32_t *ids, size_t n, int32_t anchor, const em_draft_out *o,
                      const em_draft_info *di) {
    char path[4096];
    snprintf(path, sizeof path, "%s/meta.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    fprintf(f, "{");
    print_ids(f, "prompt_ids", ids, n);
    fprintf(f, ", \"anchor\": %d, ", anchor);
    print_ids(f, "draft_tokens", o->tokens, (size_t)o->n);
    fprintf(f, ", \"n_feat\": %d, \"n_vocab\": %d, ", di->n_feat, di->n_vocab);
    print_ids(f, "taps", di->taps, (size_t)di->n_taps);
    fprintf(f, "}\n");
    return fclose(f) != 0;
}

static int dump(const char *target_path, const char *draft_path, const char *dir, const char *prompt, bool chat,
                em_err *err) {
    em_drafter *d = NULL;
    em_target *t = NULL;
    em_gguf *g = NULL;
    em_tok *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    float *feats = NULL, *last = NULL, *logits = NULL, *conf = NULL;
    int32_t *draft_tokens = NULL;
    int taps[EM_DRAFT_MAX_TAPS], n_taps = 0;
    em_target_shared shared;
    int rc = em_draft_read_taps(draft_path, taps, &n_taps, err);
    if (!rc)
        rc = em_model_open(&t, target_path,
                           &(em_model_opts){ .n_threads = 1, .feature_layers = taps, .n_feature_layers = n_taps },
                           err);
    if (!rc) rc = em_target_shared_weights(t, &shared, err);
    if (!rc) rc = em_draft_open(&d, draft_path, &shared, &(em_draft_opts){ .n_threads = 1 }, err);
    const em_draft_info *di = rc ? NULL : em_draft_get_info(d);
    if (!rc) rc = em_gguf_open(&g, target_path, err);
    if (!rc) rc = em_tok_create(&tok, g, NULL, err);
    if (!rc && chat) {
        em_chat_msg m = { .role = "user", .content = prompt };
        rc = em_chat_encode_kimi(tok, &m, 1, true, &ids, &n, err);
    } else if (!rc) {
        rc = em_tok_encode(tok, prompt, strlen(prompt), EM_TOK_PARSE_SPECIAL | EM_TOK_ADD_SPECIAL, &ids, &n, err);
    }
    if (!rc && (n == 0 || n > 4000)) rc = em_err_set(err, EM_EINVAL, "the prompt has %zu tokens (1..4000)", n);
    if (!rc) {
        feats = malloc(n * (size_t)di->n_feat * sizeof *feats);
        last = malloc((size_t)di->n_vocab * sizeof *last);
        logits = malloc((size_t)di->n_drafts * (size_t)di->n_vocab * sizeof *logits);
        conf = calloc((size_t)di->n_drafts, sizeof *conf);
        draft_tokens = malloc((size_t)di->n_drafts * sizeof *draft_tokens);
        if (!feats || !last || !logits || !conf || !draft_tokens) rc = em_err_set(err, EM_ENOMEM, "out of memory");
    }
    if (!rc) rc = em_target_prefill(t, ids, (int)n, &(em_rows){ .logits = last, .last_only = true, .features = feats }, err);
    int32_t anchor = rc ? 0 : em_argmax(last, di->n_vocab);
    em_draft_out o = { .tokens = draft_tokens, .logits = logits, .conf_logits = di && di->has_confidence ? conf : NULL };
    if (!rc) rc = em_draft_add_context(d, feats, (int)n, err);
    if (!rc) rc = em_draft_propose(d, anchor, di->n_drafts, &(em_draft_chain){ 0 }, &o, err); /* greedy */
    if (!rc && (write_f32(dir, "features.f32", feats, n * (size_t)di->n_feat) ||
                write_f32(dir, "logits.f32", logits, (size_t)o.n * (size_t)di->n_vocab) ||
                write_f32(dir, "conf.f32", conf, (size_t)di->n_drafts) || write_meta(dir, ids, n, anchor, &o, di)))
        rc = em_err_set(err, EM_EIO, "%s: writing the dumps failed", dir);
    free(feats), free(last), free(logits), free(conf), free(draft_tokens), free(ids);
    em_tok_free(tok);
    em_gguf_close(g);
    em_draft_close(d); /* before the target it borrows from */
    em_target_close(t);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 5 || argc > 6 || (argc == 6 && strcmp(argv[5], "--chat"))) {
        fprintf(stderr, "usage: compat_draft_dump TARGET.gguf DRAFT.gguf OUTDIR PROMPT [--chat]\n");
        return 2;
    }
    em_err err = { 0 };
    if (dump(argv[1], argv[2], argv[3], argv[4], argc == 6, &err)) {
        fprintf(stderr, "compat_draft_dump: %s\n", err.msg);
        return 1;
    }
    return 0;
}
