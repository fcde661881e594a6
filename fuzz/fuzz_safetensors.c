/* libFuzzer target: em_safetensors_open_memory on arbitrary bytes, then every query and the
 * f32 conversion of each tensor (bounded), so a header that parses but lies about its data
 * is caught by the sanitizers. Seeds: fuzz/corpus/safetensors/. */
#include "format/safetensors.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A private copy so reads past the input are reported exactly at its end. */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    em_safetensors *st = NULL;
    em_err err = { 0 };
    if (em_safetensors_open_memory(&st, copy, size, "fuzz", &err) == EM_OK) {
        float buf[64];
        for (size_t i = 0; i < em_safetensors_count(st); i++) {
            const em_safetensors_tensor *t = em_safetensors_at(st, i);
            if (em_safetensors_find(st, t->name) != t) abort();
            uint64_t n = t->n_elements < 64 ? t->n_elements : 64;
            if (em_safetensors_to_f32_range(t, 0, n, buf, &err) != EM_OK) abort();
            if (t->n_elements > 64 &&
                em_safetensors_to_f32_range(t, t->n_elements - 64, 64, buf, &err) != EM_OK)
                abort();
            /* touch the last byte of the tensor */
            if (t->n_bytes && t->data[t->n_bytes - 1] == 0x5a) buf[0] = 1;
        }
        const char *k, *v;
        for (size_t i = 0; em_safetensors_metadata_at(st, i, &k, &v, NULL); i++)
            if (em_safetensors_metadata_get(st, k) == NULL) abort();
        em_safetensors_close(st);
    } else if (st != NULL || err.msg[0] == 0) {
        abort(); /* a failure must reset the handle and say why */
    }
    free(copy);
    return 0;
}
