/* libFuzzer target: em_spec_memory_find (tools/spec_memory.c, `ember run --spec-memory`'s file)
 * on arbitrary bytes, with the key of the first line when it has one. A line it accepts must
 * give known in 0..3 and finite numbers; nothing may read past the input. Seeds:
 * fuzz/corpus/spec_memory/. */
#include "spec_memory.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *copy = malloc(size ? size : 1); /* exactly size bytes: no terminator to lean on */
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    char key[65] = "0000000000000000000000000000000000000000000000000000000000000000";
    if (size >= 64) memcpy(key, copy, 64);
    unsigned known = 99;
    double v[EM_DECODE_LEARNT_VALUES];
    if (em_spec_memory_find(copy, size, key, &known, v)) {
        if (known > 3) abort();
        for (int i = 0; i < EM_DECODE_LEARNT_VALUES; i++)
            if (!isfinite(v[i])) abort();
    }
    free(copy);
    return 0;
}
