/* Tests for compute/rope.c: HF rotate-half RoPE with the plain, linear and YaRN schedules.
 * YaRN values were computed in float64 by a transcription of transformers'
 * _compute_yarn_parameters (explicit factor, truncate = true, beta_fast 32, beta_slow 1,
 * attention factor 0.1 ln(factor) + 1), for the SpecForge fixture drafters' schedule
 * (dims 32, theta 1e4, factor 4 over 256) and Kimi-K3's (head_dim 64, theta 1e4, factor 16
 * over 4096). The plain and linear schedules are checked against their closed forms. */
#include "testutil.h"

#include <math.h>
#include <string.h>

#include "compute/compute.h"

typedef struct expect {
    int pos, i;
    double cs, sn;
} expect;

static void check(const em_rope_params *p, const expect *e, int n) {
    em_rope r;
    OK(em_rope_init(&r, p, E));
    float cs[EM_ROPE_MAX_DIMS / 2], sn[EM_ROPE_MAX_DIMS / 2];
    for (int k = 0; k < n; k++) {
        em_rope_cos_sin(&r, e[k].pos, cs, sn);
        assert_float_equal(cs[e[k].i], e[k].cs, 2e-6);
        assert_float_equal(sn[e[k].i], e[k].sn, 2e-6);
    }
}

static void test_yarn_hf(void **state) {
    (void)state;
    static const expect small[] = {
        { 1, 0, 0.6152041098606474, 0.9581236329364153 },     { 1, 8, 1.1386258778968545, 0.002846570625100076 },
        { 1, 15, 1.138629434986782, 5.0620032030880044e-05 }, { 37, 0, 0.8715229703587191, -0.7327514619008424 },
        { 37, 8, 1.13376170933158, 0.10517309177846103 },     { 37, 15, 1.138627895703941, 0.0018729403411493657 },
        { 1000, 0, 0.6403413705180644, 0.9415093849684947 },  { 1000, 8, -0.9122057032149253, 0.6814379999698211 },
        { 1000, 15, 1.1375044144145108, 0.05060335925812892 },
    };
    em_rope_params p = { .dims = 32, .theta = 1e4, .scaling = EM_ROPE_YARN, .factor = 4, .orig_ctx = 256,
                         .beta_fast = 32, .beta_slow = 1 };
    check(&p, small, 9);
    static const expect k3[] = {
        { 1, 0, 0.6901059138531551, 1.0747762810649342 },     { 1, 16, 1.2772383187559226, 0.007245948965632305 },
        { 1, 31, 1.2772588721796163, 1.0645325503198203e-05 }, { 37, 0, 0.9776318887720947, -0.8219647904446853 },
        { 37, 16, 1.2492242590252267, 0.2661371400946174 },   { 37, 31, 1.2772588114927013, 0.0003938770373801872 },
        { 1000, 0, 0.7183036647454258, 1.0561392294049867 },  { 1000, 16, 1.0468233920921424, -0.7318135093338802 },
        { 1000, 31, 1.2772145107004262, 0.010645202259197703 },
    };
    p = (em_rope_params){ .dims = 64, .theta = 1e4, .scaling = EM_ROPE_YARN, .factor = 16, .orig_ctx = 4096,
                          .beta_fast = 32, .beta_slow = 1 };
    check(&p, k3, 9);
    /* an explicit attention factor replaces 0.1 ln(factor) + 1 */
    em_rope r;
    p.attn_factor = 1.0;
    OK(em_rope_init(&r, &p, E));
    assert_float_equal(r.attn_factor, 1.0, 0);
}

static void test_plain_and_linear(void **state) {
    (void)state;
    em_rope r;
    em_rope_params p = { .dims = 8, .theta = 1e6 };
    OK(em_rope_init(&r, &p, E));
    float cs[4], sn[4];
    em_rope_cos_sin(&r, 123, cs, sn);
    for (int i = 0; i < 4; i++) {
        double a = 123.0 * pow(1e6, -2.0 * i / 8);
        assert_float_equal(cs[i], cos(a), 1e-6);
        assert_float_equal(sn[i], sin(a), 1e-6);
    }
    p.scaling = EM_ROPE_LINEAR;
    p.factor = 4;
    OK(em_rope_init(&r, &p, E));
    em_rope_cos_sin(&r, 123, cs, sn);
    for (int i = 0; i < 4; i++) {
        double a = 123.0 / 4 * pow(1e6, -2.0 * i / 8);
        assert_float_equal(cs[i], cos(a), 1e-6);
        assert_float_equal(sn[i], sin(a), 1e-6);
    }
    /* position 0 is the identity (without YaRN's scale) */
    em_rope_cos_sin(&r, 0, cs, sn);
    for (int i = 0; i < 4; i++) {
        assert_float_equal(cs[i], 1.0, 0);
        assert_float_equal(sn[i], 0.0, 0);
    }
}

static void test_apply_rotate_half(void **state) {
    (void)state;
    /* two heads of 6 values, 4 rotated: pairs (0,2) and (1,3) turn, 4 and 5 pass */
    float x[12] = { 1, 2, 3, 4, 5, 6, -1, 0.5f, 2, -3, 7, 8 };
    const float cs[2] = { 0.6f, 0.0f }, sn[2] = { 0.8f, 1.0f };
    em_rope_apply(x, 2, 6, 4, cs, sn);
    const float want[12] = { 1 * 0.6f - 3 * 0.8f, 2 * 0.0f - 4 * 1.0f, 3 * 0.6f + 1 * 0.8f, 4 * 0.0f + 2 * 1.0f, 5, 6,
                             -1 * 0.6f - 2 * 0.8f, 0.5f * 0.0f + 3 * 1.0f, 2 * 0.6f - 1 * 0.8f, -3 * 0.0f + 0.5f, 7, 8 };
    for (int i = 0; i < 12; i++) assert_float_equal(x[i], want[i], 1e-6);
}

static void test_bad_params(void **state) {
    (void)state;
    em_rope r;
    em_err err = { 0 };
    const em_rope_params bad[] = {
        { .dims = 3, .theta = 1e4 },
        { .dims = 0, .theta = 1e4 },
        { .dims = EM_ROPE_MAX_DIMS + 2, .theta = 1e4 },
        { .dims = 8, .theta = 1.0 },
        { .dims = 8, .theta = NAN },
        { .dims = 8, .theta = 1e4, .scaling = 7 },
        { .dims = 8, .theta = 1e4, .scaling = EM_ROPE_LINEAR, .factor = 0 },
        { .dims = 8, .theta = 1e4, .scaling = EM_ROPE_YARN, .factor = 4, .orig_ctx = 0, .beta_fast = 32, .beta_slow = 1 },
        { .dims = 8, .theta = 1e4, .scaling = EM_ROPE_YARN, .factor = 4, .orig_ctx = 256, .beta_fast = 0, .beta_slow = 1 },
        { .dims = 8, .theta = 1e4, .scaling = EM_ROPE_YARN, .factor = 4, .orig_ctx = 256, .beta_fast = 32, .beta_slow = 1,
          .attn_factor = -1 },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = 0;
        assert_int_equal(em_rope_init(&r, &bad[i], &err), EM_EINVAL);
        assert_non_null(strstr(err.msg, "rope"));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_yarn_hf),
        cmocka_unit_test(test_plain_and_linear),
        cmocka_unit_test(test_apply_rotate_half),
        cmocka_unit_test(test_bad_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
