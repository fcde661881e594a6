/* Tests for backend/gpu.h's host side, on any machine (CI has no GPU): device-name parsing,
 * device layout sizes, and that opening a device either works or says clearly why not: a build
 * without CUDA says so (gpu_none.c), a CUDA build on a machine without a driver or GPU names
 * that, and a machine with a GPU opens cuda:0 and refuses an index past its count. */
#include "testutil.h"

#include <string.h>

#include "backend/gpu.h"
#include "quant/quant.h"

static void test_parse(void **state) {
    (void)state;
    int i = -1;
    OK(em_gpu_parse_device("cuda", &i, E));
    assert_int_equal(i, 0);
    OK(em_gpu_parse_device("cuda:0", &i, E));
    assert_int_equal(i, 0);
    OK(em_gpu_parse_device("cuda:13", &i, E));
    assert_int_equal(i, 13);
    const char *bad[] = { "cuda:", "cuda:x", "cuda:-1", "cuda:1x", "gpu0", "cuda0", "cuda:1024", "cuda:99999999999", "" };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        em_err e = { 0 };
        assert_int_equal(em_gpu_parse_device(bad[k], &i, &e), EM_EINVAL);
        assert_non_null(strstr(e.msg, bad[k]));
    }
    em_err e = { 0 };
    assert_int_equal(em_gpu_parse_device(NULL, &i, &e), EM_EINVAL);
}

static void test_sizes(void **state) {
    (void)state;
    uint64_t b = 0;
    OK(em_gpu_mat_bytes(EM_TYPE_Q8_0, 1024, 2304, &b, E));
    assert_int_equal(b, 1024ull * 2304 / 32 * 34); /* the GGUF's bytes, repacked */
    OK(em_gpu_mat_bytes(EM_TYPE_BF16, 3, 8, &b, E));
    assert_int_equal(b, 48);
    /* Q4_K, Q6_K, MXFP4 keep the GGUF's bytes; types without a kernel become F32 */
    OK(em_gpu_mat_bytes(EM_TYPE_Q4_K, 2, 512, &b, E));
    assert_int_equal(b, 2 * 2 * 144);
    OK(em_gpu_mat_bytes(EM_TYPE_Q6_K, 1, 256, &b, E));
    assert_int_equal(b, 210);
    OK(em_gpu_mat_bytes(EM_TYPE_MXFP4, 1, 64, &b, E));
    assert_int_equal(b, 34);
    OK(em_gpu_mat_bytes(EM_TYPE_Q5_K, 3, 256, &b, E));
    assert_int_equal(b, 3 * 256 * 4);
    assert_int_equal(em_gpu_mat_dev_type(EM_TYPE_Q5_K), EM_TYPE_F32);
    assert_int_equal(em_gpu_mat_dev_type(EM_TYPE_IQ2_XXS), EM_TYPE_F32);
    assert_int_equal(em_gpu_mat_dev_type(EM_TYPE_Q6_K), EM_TYPE_Q6_K);
    assert_int_equal(em_gpu_mat_dev_type(EM_TYPE_TQ1_0), -1);
    assert_int_equal(em_gpu_act_type(EM_TYPE_MXFP4), EM_TYPE_Q8_0);
    assert_int_equal(em_gpu_act_type(EM_TYPE_BF16), EM_TYPE_F32);
    assert_int_equal(em_gpu_act_type(EM_TYPE_Q5_K), -1);
    em_err e = { 0 };
    assert_int_equal(em_gpu_mat_bytes(EM_TYPE_TQ1_0, 1, 256, &b, &e), EM_EUNSUPPORTED);
    assert_non_null(strstr(e.msg, "tq1_0"));
    assert_int_equal(em_gpu_mat_bytes(EM_TYPE_Q4_K, 1, 255, &b, &e), EM_EFORMAT);
    assert_int_equal(em_gpu_mat_bytes(EM_TYPE_Q8_0, 1, 33, &b, &e), EM_EFORMAT);
    assert_true(em_gpu_mat_type_ok(EM_TYPE_F16) && em_gpu_mat_type_ok(EM_TYPE_MXFP4) && !em_gpu_mat_type_ok(EM_TYPE_Q5_K));
    assert_int_equal(em_gpu_act_bytes(EM_TYPE_Q4_K, 2304, 3), 6912 + 3 * 72 * 4);
    /* Q8_0 activations: quants padded to 16 bytes, then a float per 32 values */
    assert_int_equal(em_gpu_act_bytes(EM_TYPE_Q8_0, 2304, 3), 6912 + 3 * 72 * 4);
    assert_int_equal(em_gpu_act_bytes(EM_TYPE_Q8_0, 32, 1), 16 + 16 + 4);
    assert_int_equal(em_gpu_act_bytes(EM_TYPE_F32, 2304, 16), 0);
}

static void test_open(void **state) {
    (void)state;
    em_err e = { 0 };
    em_gpu *g = NULL;
    int n = 0;
    const int crc = em_gpu_device_count(&n, &e);
    if (!em_gpu_built()) {
        assert_int_equal(crc, EM_EUNSUPPORTED);
        assert_int_equal(em_gpu_open(0, &g, &e), EM_EUNSUPPORTED);
        assert_non_null(strstr(e.msg, "built without CUDA"));
        assert_null(g);
        void *p = (void *)&e;
        assert_int_equal(em_gpu_alloc(NULL, 16, "x", &p, &e), EM_EUNSUPPORTED);
        assert_null(p);
        em_gpu_close(NULL);
        return;
    }
    if (crc) { /* a CUDA build without a usable driver */
        assert_int_equal(crc, EM_EUNSUPPORTED);
        assert_non_null(strstr(e.msg, "driver"));
        memset(&e, 0, sizeof e);
        assert_int_equal(em_gpu_open(0, &g, &e), EM_EUNSUPPORTED);
        assert_non_null(strstr(e.msg, "driver"));
        assert_null(g);
        return;
    }
    int rc = em_gpu_open(n, &g, &e); /* one past the last device */
    assert_int_equal(rc, EM_ENOTFOUND);
    assert_non_null(strstr(e.msg, "no CUDA device"));
    assert_null(g);
    if (n == 0) return;
    rc = em_gpu_open(0, &g, &e);
    if (rc) { /* a GPU older than Hopper */
        assert_int_equal(rc, EM_EUNSUPPORTED);
        assert_non_null(strstr(e.msg, "compute capability"));
        return;
    }
    assert_true(em_gpu_get_info(g)->cc_major >= 9);
    em_gpu_close(g);
}

/* The KDA / MLA sequence-state ops' host-side checks and sizes (no device needed): a CUDA build
 * sizes Kimi-Linear's state and log and refuses a head_dim its kernels lack, naming it; a build
 * without CUDA says so. */
static void test_seq_sizes(void **state) {
    (void)state;
    em_err err = { 0 };
    em_gpu_kda_dims d = { .n_head = 32, .head_dim = 128, .d_conv = 4, .norm_eps = 1e-5f, .l2_eps = 1e-6f };
    if (!em_gpu_built()) {
        assert_int_equal(em_gpu_kda_dims_check(&d, &err), EM_EUNSUPPORTED);
        assert_non_null(strstr(err.msg, "without CUDA"));
        assert_int_equal(em_gpu_kda_state_floats(&d), 0);
        return;
    }
    assert_int_equal(em_gpu_kda_dims_check(&d, &err), EM_OK);
    assert_int_equal(em_gpu_kda_state_floats(&d), 3 * 3 * 4096 + 32 * 128 * 128);
    assert_true(em_gpu_kda_log_bytes(&d, 16) >= 16ull * (7 * 4096 + 2 * 32) * 4);
    assert_true(em_gpu_kda_log_bytes(&d, EM_GPU_WIDE_MAX_ROWS) >=
                (uint64_t)EM_GPU_WIDE_MAX_ROWS * (7 * 4096 + 2 * 32) * 4); /* a wide pass's */
    assert_int_equal(em_gpu_kda_log_bytes(&d, EM_GPU_WIDE_MAX_ROWS + 1), 0);
    d.head_dim = 96;
    assert_int_equal(em_gpu_kda_dims_check(&d, &err), EM_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "head_dim 96"));
    d.head_dim = 128;
    d.d_conv = 17;
    assert_int_equal(em_gpu_kda_dims_check(&d, &err), EM_EINVAL);
    assert_non_null(strstr(err.msg, "d_conv 17"));
    const em_gpu_mla_dims m = { .n_head = 32, .kv_lora = 512, .rope = 64, .nope = 128, .capacity = 4096 };
    /* 64 splits of (m, l) and kv_lora partial sums a row and head; a capacity of 4 tiles of 32
     * rows has 4 splits */
    assert_int_equal(em_gpu_mla_scratch_floats(&m, 16), 16ull * 32 * 64 * (512 + 2));
    const em_gpu_mla_dims small = { .n_head = 32, .kv_lora = 512, .rope = 64, .nope = 128, .capacity = 100 };
    assert_int_equal(em_gpu_mla_scratch_floats(&small, 1), 32ull * 4 * (512 + 2));
    assert_int_equal(em_gpu_mla_scratch_floats(&m, 0), 0);
}

/* The K3 row ops and the MoE layer (narrow and wide) check their arguments on the host before
 * touching a device (no context needed): bad ones are EM_EINVAL naming the argument; a build without
 * CUDA answers EM_EUNSUPPORTED. */
static void test_k3_ops_args(void **state) {
    (void)state;
    em_err err = { 0 };
    float f[4] = { 0 };
    const int want = em_gpu_built() ? EM_EINVAL : EM_EUNSUPPORTED;
    assert_int_equal(em_gpu_situ(NULL, f, f, 4, 0.0f, 1.0f, f, &err), want);
    if (want == EM_EINVAL) assert_non_null(strstr(err.msg, "beta 0"));
    assert_int_equal(em_gpu_sigmoid_mul(NULL, NULL, f, 4, &err), want);
    assert_int_equal(em_gpu_res_mix(NULL, f, 300, 4, f, 4, f, 4, 1e-6f, 1, f, 4, &err), want);
    if (want == EM_EINVAL) assert_non_null(strstr(err.msg, "300 banked"));
    assert_int_equal(em_gpu_res_mix(NULL, f, 1, 4, f, 4, NULL, 4, 1e-6f, 1, f, 4, &err), want);
    const em_gpu_experts ex = { .n_expert = 8, .ffn = 64, .act = EM_GPU_ACT_SITU, .situ_beta = 1.0f };
    assert_int_equal(em_gpu_moe(NULL, &ex, f, 4, 1, NULL, f, 2, f, f, 4, &err), want);
    if (want == EM_EINVAL) assert_non_null(strstr(err.msg, "missing expert matrices"));
    assert_int_equal(em_gpu_moe_wide(NULL, &ex, f, 4, 100, NULL, f, 2, f, f, 4, &err), want);
    if (want == EM_EINVAL) assert_non_null(strstr(err.msg, "missing expert matrices"));
    /* a wide call's scratch grows with its rows and holds a narrow call's; none without CUDA */
    const uint64_t w16 = em_gpu_moe_wide_scratch_bytes(256, 8, 1024, 2304, 16);
    const uint64_t w256 = em_gpu_moe_wide_scratch_bytes(256, 8, 1024, 2304, 256);
    if (em_gpu_built()) assert_true(w256 > w16 && w16 >= em_gpu_moe_scratch_bytes(256, 8, 1024, 2304, 16));
    else assert_true(w16 == 0 && w256 == 0);
    assert_int_equal(em_gpu_moe_wide_scratch_bytes(256, 8, 1024, 2304, 0), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_open),
        cmocka_unit_test(test_seq_sizes),
        cmocka_unit_test(test_k3_ops_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
