/* The expert ranges of several GPUs (model/kimi_cuda_ep.c's gk_ep_split): every device at least
 * one expert and at most what its memory takes, all experts placed once in ascending device
 * order, and the shares in proportion to the room. CPU only: the placement's arithmetic, which
 * the device machine (one GPU) cannot run over several devices. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "model/kimi_cuda_ep.h"

/* The invariants of one split; want (optional): the expected counts. */
static void check(const int64_t *cap, int n, int x, const int *want) {
    int first[EM_GPU_MAX_SHARES + 1];
    gk_ep_split(cap, n, x, first);
    assert_int_equal(first[0], 0);
    assert_int_equal(first[n], x);
    for (int r = 0; r < n; r++) {
        const int c = first[r + 1] - first[r];
        assert_true(c >= 1);
        assert_true(c <= cap[r]);
        if (want) assert_int_equal(c, want[r]);
    }
}

static void test_even_and_proportional(void **state) {
    (void)state;
    check((int64_t[]){ 256, 256 }, 2, 256, (int[]){ 128, 128 });
    check((int64_t[]){ 256 }, 1, 256, (int[]){ 256 });
    check((int64_t[]){ 100, 300 }, 2, 256, (int[]){ 64, 192 });
    check((int64_t[]){ 256, 256, 256, 256 }, 4, 256, (int[]){ 64, 64, 64, 64 });
}

static void test_tight_and_lopsided(void **state) {
    (void)state;
    /* exactly enough room: every device full */
    check((int64_t[]){ 3, 5, 8 }, 3, 16, (int[]){ 3, 5, 8 });
    /* one device with room for one */
    check((int64_t[]){ 1, 1000 }, 2, 256, (int[]){ 1, 255 });
    check((int64_t[]){ 1000, 1 }, 2, 256, (int[]){ 255, 1 });
    /* as many experts as devices */
    check((int64_t[]){ 1000, 1, 1, 1000 }, 4, 4, (int[]){ 1, 1, 1, 1 });
    /* rounding leftovers go where there is room */
    check((int64_t[]){ 7, 7, 7 }, 3, 16, NULL);
}

static void test_random(void **state) {
    (void)state;
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int it = 0; it < 20000; it++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        const int n = 1 + (int)(s % EM_GPU_MAX_SHARES), x = n + (int)((s >> 8) % 1024);
        int64_t cap[EM_GPU_MAX_SHARES], total = 0;
        for (int r = 0; r < n; r++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            cap[r] = 1 + (int64_t)(s % (uint64_t)(2 * x));
            total += cap[r];
        }
        if (total < x) cap[0] += x - total; /* the caller refuses less room than experts */
        check(cap, n, x, NULL);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_even_and_proportional),
        cmocka_unit_test(test_tight_and_lopsided),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
