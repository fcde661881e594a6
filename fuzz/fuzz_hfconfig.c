/* libFuzzer target: em_hf_config_parse on arbitrary bytes. Every outcome must be a status
 * with a message or a config whose layer tables are consistent. Seeds: fuzz/corpus/hfconfig/. */
#include "convert/hfconfig.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    em_hf_config *c = malloc(sizeof *c);
    em_err err = { 0 };
    if (c && em_hf_config_parse(c, copy, size, "fuzz", &err) == EM_OK) {
        if (c->kind == EM_HF_KIMI) {
            const em_hf_kimi *k = &c->kimi;
            if (k->n_layers < 1 || k->n_layers > EM_HF_MAX_LAYERS) abort();
            if (k->n_kda + k->n_mla != k->n_layers || k->n_dense + k->n_moe != k->n_layers) abort();
            if (k->n_moe && k->num_experts_per_token > k->num_experts) abort();
        } else if (c->kind == EM_HF_DRAFT) {
            const em_hf_draft *d = &c->draft;
            if (d->n_taps < 1 || d->n_taps > EM_HF_MAX_TAPS || em_hf_draft_n_drafts(d) < 1) abort();
            if (d->mask_token_id < 0 || d->mask_token_id >= d->vocab_size) abort();
        } else {
            abort();
        }
    } else if (c && err.msg[0] == 0) {
        abort();
    }
    free(c);
    free(copy);
    return 0;
}
