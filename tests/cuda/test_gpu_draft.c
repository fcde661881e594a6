/* tests/cuda/test_gpu_draft.c: the drafter on cuda:0 (draft/dspark_cuda.c) against the CPU
 * drafter (draft/dspark.c), the reference, on the same target and the same context rows:
 *  - the GPU ops it adds: grouped-query attention against a double-precision loop, non-causal
 *    and causal, context lengths 0, 1, 100 and 333, and with the heads' norms and RoPE inside
 *    against those applied first; the heads' norms and RoPE in one launch against the two
 *    separate ops; a slot's start (em_gpu_draft_slot_begin) against quant/'s
 *    row, em_gpu_act_prepare's activations and a double loop;
 *  - greedy proposes of the default pair (models/) and of the DSpark fixture drafter (kimi_a +
 *    dspark_deepspec, converted by run.sh into MODELS_DIR) after context rows added in pieces
 *    of 1, 5 and 37 (past one upload's 16): every slot's corrected logits within tol of the
 *    largest logit, confidence logits within 2 tol of max(1, |z|) (tol: 1e-4 for the F32 fixture, 3e-2 for the
 *    Q8_0 pair, test_pair says why), the same tokens wherever the CPU's best logit leads its
 *    second by more than that, the keep test stopping at the same slot (with
 *    the loop's kind of cost table), n_max honoured; a second device drafter fed the same rows
 *    proposing the same bits; a reset and the same again;
 *  - sampled drafts (test_sampling): distributions well formed and reproducible, slot 0's
 *    against the CPU sampler's, its draws against it (chi-square);
 *  - both of the above for the gated and rnn Markov heads too (kimi_a + dspark_deepspec_gated,
 *    dspark_specforge_rnn);
 *  - sampled decoding through the loop with the drafter on cuda:0 lossless (test_lossless);
 *  - the features a target on cuda:0 keeps there, read by the drafter on its device, rounded
 *    through each ring type: the same proposals as the CPU ring's rows (test_device_features);
 *  - refusals: logits rows of sampled drafts, a device that is not there.
 * Usage (from the repository root): test_gpu_draft MODELS_DIR [--quick] (--quick: 50 draws and
 * no lossless run, for compute-sanitizer). One line per check; exit 1 when any failed, 2 when
 * no GPU could be opened. */
#include "backend/gpu.h"
#include "decode/decode.h"
#include "decode/decode_impl.h"
#include "quant/quant.h"
#include "draft/draft.h"
#include "model/model.h"
#include "sample/sample.h"

#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static uint64_t rng = 0x9e3779b97f4a7c15ull;
static bool quick; /* --quick: 50 draws, no lossless run (for compute-sanitizer) */
static float randn(void) {
    double u[2];
    for (int i = 0; i < 2; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        u[i] = ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
    }
    return (float)(sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]));
}

/* ---- attention against a double loop --------------------------------------------------------- */

static void attend_ref(const em_gpu_gqa_dims *d, const float *q, const float *kc, const float *vc, int64_t n_ctx,
                       const float *k, const float *v, int n, float *out) {
    const int64_t kw = (int64_t)d->n_kv * d->hd, qw = (int64_t)d->n_head * d->hd;
    double *s = xcalloc((size_t)(n_ctx + n), sizeof *s);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < d->n_head; h++) {
            const int g = h / (d->n_head / d->n_kv), nb = d->causal ? i + 1 : n;
            double mx = -INFINITY, sum = 0;
            for (int64_t p = 0; p < n_ctx + nb; p++) {
                const float *kr = p < n_ctx ? kc + p * kw + g * d->hd : k + (p - n_ctx) * kw + g * d->hd;
                double t = 0;
                for (int c = 0; c < d->hd; c++) t += (double)q[i * qw + h * d->hd + c] * kr[c];
                s[p] = t / sqrt((double)d->hd);
                if (s[p] > mx) mx = s[p];
            }
            for (int64_t p = 0; p < n_ctx + nb; p++) sum += s[p] = exp(s[p] - mx);
            for (int c = 0; c < d->hd; c++) {
                double a = 0;
                for (int64_t p = 0; p < n_ctx + nb; p++) {
                    const float *vr = p < n_ctx ? vc + p * kw + g * d->hd : v + (p - n_ctx) * kw + g * d->hd;
                    a += s[p] / sum * vr[c];
                }
                out[i * qw + h * d->hd + c] = (float)a;
            }
        }
    free(s);
}

static void *dev_copy(em_gpu *g, const void *h, uint64_t bytes) {
    void *d = NULL;
    em_err err = { 0 };
    if (em_gpu_alloc(g, bytes, "test", &d, &err) || (h && em_gpu_upload(g, d, h, bytes, &err))) {
        fprintf(stderr, "device memory: %s\n", err.msg);
        exit(1);
    }
    return d;
}

static void test_attention(em_gpu *g) {
    const int cap = 400, n = 7;
    for (int causal = 0; causal < 2; causal++) {
        const em_gpu_gqa_dims d = { 4, 2, 64, cap, causal };
        const int64_t kw = 128, qw = 256;
        float *q = xcalloc((size_t)(n * qw), 4), *k = xcalloc((size_t)(n * kw), 4), *v = xcalloc((size_t)(n * kw), 4);
        float *kc = xcalloc((size_t)(cap * kw), 4), *vc = xcalloc((size_t)(cap * kw), 4);
        float *ref = xcalloc((size_t)(n * qw), 4), *got = xcalloc((size_t)(n * qw), 4);
        for (int64_t i = 0; i < n * qw; i++) q[i] = randn();
        for (int64_t i = 0; i < n * kw; i++) k[i] = randn(), v[i] = randn();
        for (int64_t i = 0; i < cap * kw; i++) kc[i] = randn(), vc[i] = randn();
        float *dq = dev_copy(g, q, (uint64_t)(n * qw) * 4), *dk = dev_copy(g, k, (uint64_t)(n * kw) * 4);
        float *dv = dev_copy(g, v, (uint64_t)(n * kw) * 4), *dkc = dev_copy(g, kc, (uint64_t)(cap * kw) * 4);
        float *dvc = dev_copy(g, vc, (uint64_t)(cap * kw) * 4), *dout = dev_copy(g, NULL, (uint64_t)(n * qw) * 4);
        float *dsc = dev_copy(g, NULL, em_gpu_gqa_scratch_floats(&d, n) * 4);
        int64_t *dn = dev_copy(g, NULL, sizeof(int64_t));
        const int64_t lens[] = { 0, 1, 100, 333 };
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            em_err err = { 0 };
            int rc = em_gpu_upload(g, dn, &lens[li], sizeof(int64_t), &err);
            if (!rc) rc = em_gpu_gqa_attend(g, &d, dq, dkc, dvc, dn, dk, dv, n, NULL, dsc, dout, &err);
            if (!rc) rc = em_gpu_download(g, got, dout, (uint64_t)(n * qw) * 4, &err);
            attend_ref(&d, q, kc, vc, lens[li], k, v, n, ref);
            double worst = 0;
            for (int64_t i = 0; i < n * qw; i++) worst = fmax(worst, fabs((double)got[i] - ref[i]));
            char name[64];
            snprintf(name, sizeof name, "gqa attention %s ctx %lld", causal ? "causal" : "non-causal", (long long)lens[li]);
            record(name, !rc && worst < 1e-4, "max |gpu - double| %.2e (rc %d %s)", worst, rc, err.msg);
        }
        void *all[] = { dq, dk, dv, dkc, dvc, dout, dsc, dn };
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_gpu_free(g, all[i]);
        free(q), free(k), free(v), free(kc), free(vc), free(ref), free(got);
    }
}

/* em_gpu_gqa_attend with the heads' norms and RoPE inside (rope over 64 or 32 of 64 values,
 * non-causal and causal, contexts 0 and 100) against em_gpu_head_norm_rope on copies of q and k
 * followed by the plain attention: memcmp-equal, and q and k left as they were. */
static void test_attention_rope(em_gpu *g) {
    enum { CAP = 128, N = 7, NH = 4, NKV = 2, HD = 64 };
    const int64_t kw = NKV * HD, qw = NH * HD;
    float q[N * NH * HD], k[N * NKV * HD], v[N * NKV * HD], wq[HD], wk[HD], ref[N * NH * HD], got[N * NH * HD];
    float q2[N * NH * HD], k2[N * NKV * HD];
    float *kc = xcalloc((size_t)CAP * kw, 4), *vc = xcalloc((size_t)CAP * kw, 4);
    int32_t pos[N];
    double inv[HD / 2];
    for (int i = 0; i < N * NH * HD; i++) q[i] = randn();
    for (int i = 0; i < N * NKV * HD; i++) k[i] = randn(), v[i] = randn();
    for (int i = 0; i < HD; i++) wq[i] = 1.0f + 0.1f * randn(), wk[i] = 1.0f + 0.1f * randn();
    for (int i = 0; i < CAP * kw; i++) kc[i] = randn(), vc[i] = randn();
    for (int i = 0; i < HD / 2; i++) inv[i] = pow(10000.0, -2.0 * i / HD);
    float *dq = dev_copy(g, q, sizeof q), *dk = dev_copy(g, k, sizeof k), *dv = dev_copy(g, v, sizeof v);
    float *dq2 = dev_copy(g, NULL, sizeof q), *dk2 = dev_copy(g, NULL, sizeof k), *dout = dev_copy(g, NULL, sizeof ref);
    float *dwq = dev_copy(g, wq, sizeof wq), *dwk = dev_copy(g, wk, sizeof wk);
    float *dkc = dev_copy(g, kc, (uint64_t)CAP * kw * 4), *dvc = dev_copy(g, vc, (uint64_t)CAP * kw * 4);
    double *dinv = dev_copy(g, inv, sizeof inv);
    int32_t *dpos = dev_copy(g, NULL, sizeof pos);
    int64_t *dn = dev_copy(g, NULL, sizeof(int64_t));
    float *dsc = NULL;
    for (int causal = 0; causal < 2; causal++)
        for (int half = HD / 4; half <= HD / 2; half += HD / 4)
            for (int64_t len = 0; len <= 100; len += 100) {
                const em_gpu_gqa_dims d = { NH, NKV, HD, CAP, causal };
                if (!dsc) dsc = dev_copy(g, NULL, em_gpu_gqa_scratch_floats(&d, N) * 4);
                for (int i = 0; i < N; i++) pos[i] = (int32_t)(len + i);
                const em_gpu_gqa_rope rope = { dwq, dwk, 1e-6f, half, dpos, dinv, 1.0 };
                em_err err = { 0 };
                int rc = em_gpu_upload(g, dn, &len, sizeof len, &err);
                if (!rc) rc = em_gpu_upload(g, dpos, pos, sizeof pos, &err);
                if (!rc) rc = em_gpu_copy(g, dq2, dq, sizeof q, &err);
                if (!rc) rc = em_gpu_copy(g, dk2, dk, sizeof k, &err);
                if (!rc) rc = em_gpu_head_norm_rope(g, dq2, qw, NH, dwq, dk2, kw, NKV, dwk, N, HD, 1e-6f, 2 * half, dpos, dinv,
                                                    1.0, &err);
                if (!rc) rc = em_gpu_gqa_attend(g, &d, dq2, dkc, dvc, dn, dk2, dv, N, NULL, dsc, dout, &err);
                if (!rc) rc = em_gpu_download(g, ref, dout, sizeof ref, &err);
                if (!rc) rc = em_gpu_gqa_attend(g, &d, dq, dkc, dvc, dn, dk, dv, N, &rope, dsc, dout, &err);
                if (!rc) rc = em_gpu_download(g, got, dout, sizeof got, &err);
                if (!rc) rc = em_gpu_download(g, q2, dq, sizeof q2, &err);
                if (!rc) rc = em_gpu_download(g, k2, dk, sizeof k2, &err);
                const bool same = !rc && !memcmp(ref, got, sizeof ref), kept = !rc && !memcmp(q, q2, sizeof q) &&
                                                                              !memcmp(k, k2, sizeof k);
                char name[96];
                snprintf(name, sizeof name, "gqa attention with norms and RoPE inside, %s, rope %d, ctx %lld",
                         causal ? "causal" : "non-causal", 2 * half, (long long)len);
                record(name, same && kept, "%s to head norm + rope then attention, q and k %s (rc %d %s)",
                       same ? "memcmp-equal" : "NOT equal", kept ? "untouched" : "WRITTEN", rc, err.msg);
            }
    void *all[] = { dq, dk, dv, dq2, dk2, dout, dwq, dwk, dkc, dvc, dinv, dpos, dn, dsc };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_gpu_free(g, all[i]);
    free(kc), free(vc);
}

/* em_gpu_head_norm_rope against em_gpu_rmsnorm_rows + em_gpu_rope_rows (head size 64 and 128,
 * rope over all or half of it, q and k together or k alone): equal up to the sums' order. */
static void test_head_norm_rope(em_gpu *g) {
    const int rows = 7, nq = 4, nk = 2;
    const int shapes[][2] = { { 64, 64 }, { 128, 64 }, { 128, 128 } };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int hd = shapes[si][0], dims = shapes[si][1];
        const int64_t qw = (int64_t)nq * hd, kw = (int64_t)nk * hd, nv = rows * (qw + kw);
        float *x = xcalloc((size_t)nv, 4), *w = xcalloc((size_t)2 * hd, 4), *ref = xcalloc((size_t)nv, 4);
        float *got = xcalloc((size_t)nv, 4);
        double inv[64];
        int32_t pos[7];
        for (int64_t i = 0; i < nv; i++) x[i] = randn();
        for (int i = 0; i < 2 * hd; i++) w[i] = 1.0f + 0.1f * randn();
        for (int i = 0; i < dims / 2; i++) inv[i] = pow(10000.0, -2.0 * i / dims);
        for (int j = 0; j < rows; j++) pos[j] = 17 * j + 3;
        float *da = dev_copy(g, x, (uint64_t)nv * 4), *db = dev_copy(g, x, (uint64_t)nv * 4), *dw = dev_copy(g, w, 8 * hd);
        double *dinv = dev_copy(g, inv, sizeof inv);
        int32_t *dpos = dev_copy(g, pos, sizeof pos);
        for (int k_only = 0; k_only < 2; k_only++) {
            em_err err = { 0 };
            float *aq = da, *ak = da + rows * qw, *bq = db, *bk = db + rows * qw;
            int rc = em_gpu_upload(g, da, x, (uint64_t)nv * 4, &err);
            if (!rc) rc = em_gpu_upload(g, db, x, (uint64_t)nv * 4, &err);
            if (!rc && !k_only) rc = em_gpu_rmsnorm_rows(g, aq, hd, dw, 1e-6f, rows * nq, hd, aq, hd, &err);
            if (!rc) rc = em_gpu_rmsnorm_rows(g, ak, hd, dw + hd, 1e-6f, rows * nk, hd, ak, hd, &err);
            if (!rc && !k_only) rc = em_gpu_rope_rows(g, aq, qw, rows, nq, hd, dims, dpos, dinv, 1.0, &err);
            if (!rc) rc = em_gpu_rope_rows(g, ak, kw, rows, nk, hd, dims, dpos, dinv, 1.0, &err);
            if (!rc)
                rc = em_gpu_head_norm_rope(g, k_only ? NULL : bq, qw, k_only ? 0 : nq, dw, bk, kw, nk, dw + hd, rows, hd,
                                           1e-6f, dims, dpos, dinv, 1.0, &err);
            if (!rc) rc = em_gpu_download(g, ref, da, (uint64_t)nv * 4, &err);
            if (!rc) rc = em_gpu_download(g, got, db, (uint64_t)nv * 4, &err);
            double worst = 0;
            for (int64_t i = 0; i < nv; i++) worst = fmax(worst, fabs((double)got[i] - ref[i]) / fmax(1.0, fabs(ref[i])));
            char name[64];
            snprintf(name, sizeof name, "head norm + rope, hd %d dims %d%s", hd, dims, k_only ? ", k only" : "");
            record(name, !rc && worst < 1e-6, "max relative |fused - separate| %.2e (rc %d %s)", worst, rc, err.msg);
        }
        void *all[] = { da, db, dw, dinv, dpos };
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_gpu_free(g, all[i]);
        free(x), free(w), free(ref), free(got);
    }
}

/* em_gpu_draft_slot_begin on a random Q8_0 W1 (64 rows of 128) and confidence head, for
 * several previous tokens: e equal to quant/'s dequantized row, e's activations equal to
 * em_gpu_act_prepare's (memcmp), the confidence within 1e-9 of a double loop. */
static void test_slot_begin(em_gpu *g) {
    enum { ROWS = 64, RANK = 128, D = 96 };
    /* slot 2's final row is row 2 of h (DSpark: slot0 0) */
    float *w1f = xcalloc((size_t)ROWS * RANK, 4), *wc = xcalloc(D + RANK, 4), *h = xcalloc(3 * D, 4);
    for (int i = 0; i < ROWS * RANK; i++) w1f[i] = randn();
    for (int i = 0; i < D + RANK; i++) wc[i] = 0.1f * randn();
    for (int i = 0; i < 3 * D; i++) h[i] = randn();
    uint64_t qb = 0;
    em_err err = { 0 };
    const em_type_info *ti = em_type_get(EM_TYPE_Q8_0);
    int rc = em_type_row_bytes(EM_TYPE_Q8_0, (uint64_t)ROWS * RANK, &qb, &err);
    uint8_t *w1q = xcalloc((size_t)qb, 1);
    if (!rc) rc = em_quantize(EM_TYPE_Q8_0, w1f, w1q, (int64_t)ROWS * RANK, &err);
    em_gpu_mat w1 = { 0 };
    if (!rc) rc = em_gpu_mat_upload(g, EM_TYPE_Q8_0, ROWS, RANK, w1q, "test W1", &w1, &err);
    float *de = dev_copy(g, NULL, RANK * 4), *dqd = dev_copy(g, NULL, RANK / 32 * 4), *dh = dev_copy(g, h, 3 * D * 4);
    float *dwc = dev_copy(g, wc, (D + RANK) * 4), *dx = dev_copy(g, NULL, RANK * 4);
    int8_t *dqs = dev_copy(g, NULL, RANK);
    void *scratch = dev_copy(g, NULL, em_gpu_act_bytes(EM_TYPE_Q8_0, RANK, 1));
    em_gpu_draft_io *dio = dev_copy(g, NULL, sizeof(em_gpu_draft_io));
    const em_gpu_draft_slot sl = { .w1_type = w1.type, .w1_data = w1.data, .w1_scales = w1.scales, .w1_rows = ROWS,
                                   .rank = RANK, .d_e = de, .d_e_qs = dqs, .d_e_qd = dqd, .d_h = dh, .d = D,
                                   .d_conf_w = dwc, .conf_b = 0.25f, .conf_markov = 1 };
    const int32_t toks[] = { 0, 5, 11, 31, 63 };
    for (size_t ti2 = 0; !rc && ti2 < sizeof toks / sizeof toks[0]; ti2++) {
        em_gpu_draft_io io = { .n_max = 4, .alive = 1 };
        io.toks[2] = toks[ti2];
        float e[RANK], ref[RANK], qd[RANK / 32], rqd[RANK / 32];
        int8_t qs[RANK], rqs[RANK];
        em_gpu_act a;
        rc = em_gpu_upload(g, dio, &io, sizeof io, &err);
        if (!rc) rc = em_gpu_draft_slot_begin(g, dio, 2, &sl, &err);
        if (!rc) rc = em_gpu_download(g, &io, dio, sizeof io, &err);
        if (!rc) rc = em_gpu_download(g, e, de, sizeof e, &err);
        if (!rc) rc = em_gpu_download(g, qs, dqs, sizeof qs, &err);
        if (!rc) rc = em_gpu_download(g, qd, dqd, sizeof qd, &err);
        if (!rc) rc = em_gpu_upload(g, dx, e, sizeof e, &err);
        if (!rc) rc = em_gpu_act_prepare(g, EM_TYPE_Q8_0, dx, RANK, RANK, 1, scratch, &a, &err);
        if (!rc) rc = em_gpu_download(g, rqs, a.qs, sizeof rqs, &err);
        if (!rc) rc = em_gpu_download(g, rqd, a.d, sizeof rqd, &err);
        ti->to_float(w1q + (size_t)toks[ti2] * (RANK / 32) * 34, ref, RANK);
        double z = 0.25;
        for (int i = 0; i < D; i++) z += (double)wc[i] * h[2 * D + i];
        for (int i = 0; i < RANK; i++) z += (double)wc[D + i] * ref[i];
        const bool ok = !rc && !memcmp(e, ref, sizeof e) && !memcmp(qs, rqs, sizeof qs) && !memcmp(qd, rqd, sizeof qd) &&
                        fabs(io.conf[2] - z) <= 1e-6 * fmax(1.0, fabs(z));
        char name[64];
        snprintf(name, sizeof name, "slot begin, previous token %d", (int)toks[ti2]);
        record(name, ok, "e %s, activations %s, confidence %.6f (want %.6f) (rc %d %s)",
               memcmp(e, ref, sizeof e) ? "differs" : "equal", memcmp(qs, rqs, sizeof qs) || memcmp(qd, rqd, sizeof qd)
               ? "differ" : "equal", (double)io.conf[2], z, rc, err.msg);
    }
    em_gpu_mat_free(g, &w1);
    void *all[] = { de, dqd, dh, dwc, dx, dqs, scratch, dio };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_gpu_free(g, all[i]);
    free(w1f), free(wc), free(h), free(w1q);
}

/* em_gpu_draft_markov_chain against the launches it fuses: slot 0's start, then per slot
 * em_gpu_matmul (W2 e on e's activations) and em_gpu_draft_pick going on with the next slot's
 * start. The same io bytes after it (picks, confidences, the keep test's walk), the same
 * logits rows and last Markov row, bit for bit, over draft ids that do not fill the cluster's
 * slices evenly: with and without d2t and a softcap, at a tie (two equal best values: the
 * lower target id), a row of NaN (the chain stops there), the keep test stopping the chain,
 * n_max below the slots, and draft vocabularies whose W2 rows do not fit in shared memory
 * (read from global memory instead); each case twice. */
static void test_markov_chain(em_gpu *g, int rank, int DV) {
    enum { V = 20011, D = 64, RANK_MAX = 128, NS = 6 };
    float *w2f = xcalloc((size_t)DV * rank, 4), *w1f = xcalloc((size_t)V * rank, 4), *base = xcalloc((size_t)NS * DV, 4);
    float wc[D + RANK_MAX], h[NS * D], e0[RANK_MAX]; /* slot k's final row is row k (DSpark: slot0 0) */
    int32_t *d2t = xcalloc((size_t)DV, 4);
    for (int i = 0; i < DV * rank; i++) w2f[i] = randn();
    for (int i = 0; i < V * rank; i++) w1f[i] = randn();
    for (int i = 0; i < D + rank; i++) wc[i] = 0.1f * randn();
    for (int i = 0; i < NS * D; i++) h[i] = randn();
    for (int i = 0; i < DV; i++) d2t[i] = (int32_t)(((int64_t)i * 577) % V); /* one to one: V is prime */
    memcpy(w2f + 700 * rank, w2f + 300 * rank, rank * 4); /* ids 300 and 700: equal rows, for the tie */
    em_err err = { 0 };
    uint64_t b2 = 0, b1 = 0;
    int rc = em_type_row_bytes(EM_TYPE_Q8_0, (uint64_t)DV * rank, &b2, &err);
    if (!rc) rc = em_type_row_bytes(EM_TYPE_Q8_0, (uint64_t)V * rank, &b1, &err);
    uint8_t *w2q = xcalloc((size_t)b2, 1), *w1q = xcalloc((size_t)b1, 1);
    if (!rc) rc = em_quantize(EM_TYPE_Q8_0, w2f, w2q, (int64_t)DV * rank, &err);
    if (!rc) rc = em_quantize(EM_TYPE_Q8_0, w1f, w1q, (int64_t)V * rank, &err);
    em_gpu_mat w2 = { 0 }, w1 = { 0 };
    if (!rc) rc = em_gpu_mat_upload(g, EM_TYPE_Q8_0, DV, rank, w2q, "test W2", &w2, &err);
    if (!rc) rc = em_gpu_mat_upload(g, EM_TYPE_Q8_0, V, rank, w1q, "test W1", &w1, &err);
    float *dbase = dev_copy(g, NULL, (uint64_t)NS * DV * 4), *dbias = dev_copy(g, NULL, (uint64_t)DV * 4);
    float *dwc = dev_copy(g, wc, (uint64_t)(D + rank) * 4), *dh = dev_copy(g, h, sizeof h);
    float zeros[D + RANK_MAX] = { 0 };
    float *dwc0 = dev_copy(g, zeros, (uint64_t)(D + rank) * 4); /* every confidence is conf_b */
    float *dlog = dev_copy(g, NULL, (uint64_t)NS * V * 4), *de = dev_copy(g, NULL, (uint64_t)rank * 4);
    float *dqd = dev_copy(g, NULL, rank / 32 * 4);
    int8_t *dqs = dev_copy(g, NULL, rank);
    int32_t *dd2t = dev_copy(g, d2t, (uint64_t)DV * 4);
    em_gpu_draft_io *dio = dev_copy(g, NULL, sizeof(em_gpu_draft_io));
    const em_gpu_act ea = { .type = EM_TYPE_Q8_0, .n = 1, .cols = rank, .qs = dqs, .d = dqd };
    const struct { const char *what; bool d2t; float softcap; int base, n_max, keep; } cases[] = {
        { "d2t", true, 0.0f, 0, NS, 0 },  { "no d2t, softcap 15", false, 15.0f, 0, NS, 0 },
        { "a tie", true, 0.0f, 1, NS, 0 }, { "NaN row at slot 2", true, 0.0f, 2, NS, 0 },
        { "keep test", true, 0.0f, 0, NS, 1 }, { "n_max 3", false, 0.0f, 0, 3, 0 },
    };
    for (size_t c = 0; !rc && c < sizeof cases / sizeof cases[0]; c++) {
        for (int i = 0; i < NS * DV; i++) base[i] = cases[c].base == 2 && i / DV == 2 ? NAN : randn();
        if (cases[c].base == 1) base[300] = base[700] = 1000.0f;
        const int vocab = cases[c].d2t ? V : DV;
        const int32_t *t = cases[c].d2t ? dd2t : NULL;
        const em_gpu_draft_slot sl = { .w1_type = w1.type, .w1_data = w1.data, .w1_scales = w1.scales, .w1_rows = V,
                                       .rank = rank, .d_e = de, .d_e_qs = dqs, .d_e_qd = dqd, .d_h = dh, .d = D,
                                       .d_conf_w = cases[c].keep ? dwc0 : dwc, .conf_b = cases[c].keep ? 0.0f : 0.5f,
                                       .conf_markov = 1 };
        em_gpu_draft_io io0 = { .n_max = cases[c].n_max, .alive = 1, .may_stop = cases[c].keep }, ref, got;
        io0.toks[0] = 17;
        if (cases[c].keep) { /* schedule.c's walk from the anchor's row; each slot survives with 1/2 and costs 0.1
                              * more, so the gains go 1.36, 1.46, 1.44: the walk stops at slot 2 */
            io0.n_cost = NS + 1, io0.expected = 1.0, io0.survival = 1.0, io0.best = 1.0;
            for (int i = 0; i <= NS; i++) io0.cost[i] = 1.0 + 0.1 * i;
        }
        for (int i = 0; i < rank; i++) e0[i] = randn();
        const size_t lb = (size_t)NS * (size_t)vocab * 4;
        float *lr = xcalloc((size_t)NS * vocab, 4), *lf = xcalloc((size_t)NS * vocab, 4), er[RANK_MAX], ef[RANK_MAX];
        bool same = true;
        rc = em_gpu_upload(g, dbase, base, (uint64_t)NS * DV * 4, &err);
        if (!rc) rc = em_gpu_upload(g, dio, &io0, sizeof io0, &err);
        if (!rc) rc = em_gpu_fill(g, dlog, -INFINITY, (uint64_t)NS * vocab, &err);
        if (!rc) rc = em_gpu_draft_slot_begin(g, dio, 0, &sl, &err);
        for (int k = 0; !rc && k < NS; k++) {
            rc = em_gpu_matmul(g, &w2, &ea, dbias, DV, &err);
            if (!rc) rc = em_gpu_draft_pick(g, dio, k, dbase + (int64_t)k * DV, dbias, DV, cases[c].softcap, t,
                                            dlog + (int64_t)k * vocab, vocab, k + 1 < NS ? &sl : NULL, &err);
        }
        if (!rc) rc = em_gpu_download(g, &ref, dio, sizeof ref, &err);
        if (!rc) rc = em_gpu_download(g, lr, dlog, lb, &err);
        if (!rc) rc = em_gpu_download(g, er, de, (uint64_t)rank * 4, &err);
        for (int rep = 0; !rc && rep < 2; rep++) {
            rc = em_gpu_upload(g, dio, &io0, sizeof io0, &err);
            if (!rc) rc = em_gpu_upload(g, de, e0, (uint64_t)rank * 4, &err);
            if (!rc) rc = em_gpu_fill(g, dlog, -INFINITY, (uint64_t)NS * vocab, &err);
            if (!rc) rc = em_gpu_draft_markov_chain(g, dio, NS, dbase, w2.data, w2.scales, DV, rank, cases[c].softcap, t, dlog,
                                                    vocab, &sl, &err);
            if (!rc) rc = em_gpu_download(g, &got, dio, sizeof got, &err);
            if (!rc) rc = em_gpu_download(g, lf, dlog, lb, &err);
            if (!rc) rc = em_gpu_download(g, ef, de, (uint64_t)rank * 4, &err);
            same &= !rc && !memcmp(&ref, &got, sizeof ref) && !memcmp(lr, lf, lb) && !memcmp(er, ef, (size_t)rank * 4);
        }
        const int tie = cases[c].d2t ? (d2t[300] < d2t[700] ? d2t[300] : d2t[700]) : 300;
        const bool expect = cases[c].base == 2 ? !ref.alive && ref.n == 2
                            : cases[c].base == 1 ? ref.toks[1] == tie
                            : cases[c].keep ? ref.n == 2 && !ref.alive
                                            : ref.n == cases[c].n_max && !ref.alive;
        char name[128];
        snprintf(name, sizeof name, "Markov chain in one launch = its launches (rank %d, %d draft ids, %s)", rank, DV,
                 cases[c].what);
        record(name, same && expect, "%d picks (first %d, alive %d), conf[0] %.6g / %.6g: %s (rc %d %s)", got.n, got.toks[1],
               got.alive, (double)ref.conf[0], (double)got.conf[0], same ? "the same bits" : "DIFFERENT", rc, err.msg);
        free(lr), free(lf);
    }
    em_gpu_mat_free(g, &w2);
    em_gpu_mat_free(g, &w1);
    void *all[] = { dbase, dbias, dwc, dwc0, dh, dlog, de, dqd, dqs, dd2t, dio };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_gpu_free(g, all[i]);
    free(w2f), free(w1f), free(base), free(w2q), free(w1q), free(d2t);
}

/* ---- the drafter against the CPU's ----------------------------------------------------------- */

typedef struct pair {
    em_target *target;
    em_drafter *cpu, *gpu, *gpu2; /* gpu2: a second device drafter, fed the same rows */
} pair;

static int open_pair(pair *p, const char *target_path, const char *draft_path, em_err *err) {
    memset(p, 0, sizeof *p);
    int taps[EM_DRAFT_MAX_TAPS], n_taps = 0;
    em_target_shared shared;
    int rc = em_draft_read_taps(draft_path, taps, &n_taps, err);
    em_model_opts mo = { .device = EM_DEVICE_CPU, .n_threads = 4, .feature_layers = taps, .n_feature_layers = n_taps };
    if (!rc) rc = em_model_open(&p->target, target_path, &mo, err);
    if (!rc) rc = em_target_shared_weights(p->target, &shared, err);
    if (!rc) rc = em_draft_open(&p->cpu, draft_path, &shared, &(em_draft_opts){ .n_threads = 4 }, err);
    if (!rc) rc = em_draft_open(&p->gpu, draft_path, &shared, &(em_draft_opts){ .n_threads = 4, .device = "cuda:0" }, err);
    if (!rc) rc = em_draft_open(&p->gpu2, draft_path, &shared, &(em_draft_opts){ .n_threads = 4, .device = "cuda:0" }, err);
    return rc;
}

static void close_pair(pair *p) {
    em_draft_close(p->gpu2);
    em_draft_close(p->gpu);
    em_draft_close(p->cpu);
    em_target_close(p->target);
}

/* The loop's kind of cost table: a pass of n rows costs a little more than one of n - 1. */
static void costs(em_draft_sched_params *sp, int n_max) {
    sp->n_cost = n_max + 1;
    for (int n = 1; n <= sp->n_cost; n++) sp->cost[n - 1] = 1.0 + 0.15 * (n - 1);
}

/* One propose on both; compares logits (max |d| over the largest |logit| within tol),
 * confidences (|d| over max(1, |z|) within tol) and tokens (equal, or the chains part at a near tie: the CPU's
 * best two logits within tol of the largest). */
static void compare_propose(const char *label, pair *p, int32_t anchor, int n_max, bool sched, double tol) {
    const em_draft_info *in = em_draft_get_info(p->cpu);
    const int V = in->n_vocab, nd = in->n_drafts;
    int32_t tc[EM_DRAFT_MAX_BLOCK], tg[EM_DRAFT_MAX_BLOCK];
    float zc[EM_DRAFT_MAX_BLOCK], zg[EM_DRAFT_MAX_BLOCK];
    for (int i = 0; i < EM_DRAFT_MAX_BLOCK; i++) zc[i] = zg[i] = NAN;
    float *lc = xcalloc((size_t)nd * (size_t)V, 4), *lg = xcalloc((size_t)nd * (size_t)V, 4);
    em_draft_sched_params sp;
    costs(&sp, n_max);
    em_draft_chain chain = { .sched = sched && in->has_confidence ? &sp : NULL };
    em_draft_out oc = { .tokens = tc, .logits = lc, .conf_logits = in->has_confidence ? zc : NULL };
    em_draft_out og = { .tokens = tg, .logits = lg, .conf_logits = in->has_confidence ? zg : NULL };
    em_err err = { 0 };
    int32_t t2[EM_DRAFT_MAX_BLOCK];
    float z2[EM_DRAFT_MAX_BLOCK], *l2 = xcalloc((size_t)nd * (size_t)V, 4);
    for (int i = 0; i < EM_DRAFT_MAX_BLOCK; i++) z2[i] = NAN;
    em_draft_out o2 = { .tokens = t2, .logits = l2, .conf_logits = in->has_confidence ? z2 : NULL };
    int rc = em_draft_propose(p->cpu, anchor, n_max, &chain, &oc, &err);
    if (!rc) rc = em_draft_propose(p->gpu, anchor, n_max, &chain, &og, &err);
    if (!rc) rc = em_draft_propose(p->gpu2, anchor, n_max, &chain, &o2, &err);
    /* two device drafters with the same rows propose the same bits */
    const bool twin = !rc && o2.n == og.n && !memcmp(t2, tg, (size_t)og.n * sizeof t2[0]) &&
                      !memcmp(z2, zg, sizeof z2) && !memcmp(l2, lg, (size_t)og.n * (size_t)V * sizeof *l2);
    double worst = 0, worst_z = 0;
    int same = 0, ties = 0, n = oc.n < og.n ? oc.n : og.n;
    bool ok = !rc;
    for (int k = 0; ok && k < n; k++) {
        const float *a = lc + (int64_t)k * V, *b = lg + (int64_t)k * V;
        float mx = 0, b1 = -INFINITY, b2 = -INFINITY;
        for (int i = 0; i < V; i++)
            if (isfinite(a[i])) {
                mx = fmaxf(mx, fabsf(a[i]));
                if (a[i] > b1) b2 = b1, b1 = a[i];
                else if (a[i] > b2) b2 = a[i];
            }
        for (int i = 0; i < V; i++)
            if (isfinite(a[i]) || isfinite(b[i])) worst = fmax(worst, fabs((double)a[i] - b[i]) / (mx > 0 ? mx : 1));
        if (tc[k] == tg[k]) same++;
        else if (b1 - b2 <= tol * mx) ties++, n = k + 1; /* a near tie: the chains part here */
        else ok = false;
        if (in->has_confidence) /* a logit of its own scale: relative to max(1, |z|) */
            worst_z = fmax(worst_z, fabs((double)zc[k] - zg[k]) / fmax(1.0, fabs((double)zc[k])));
    }
    /* a confidence is one dot of the slot's final row: an activation on the other side of a Q8_0
     * rounding step moves it with nothing larger to measure against, hence twice the logits' tol */
    ok = ok && worst < tol && worst_z < 2 * tol && (ties || oc.n == og.n) && og.n <= n_max && twin;
    record(label, ok, "%d/%d drafts (cpu %d, gpu %d), logits %.1e, conf %.1e, near ties %d, second gpu drafter %s (rc %d %s)",
           same, n, oc.n, og.n, worst, worst_z, ties, twin ? "identical" : "DIFFERS", rc, err.msg);
    for (int k = 0; !ok && !rc && k < oc.n && k < og.n && k < 3; k++) {
        const float *a = lc + (int64_t)k * V, *b = lg + (int64_t)k * V;
        int wi = 0;
        for (int i = 1; i < V; i++)
            if (fabs((double)a[i] - b[i]) > fabs((double)a[wi] - b[wi])) wi = i;
        printf("     slot %d: cpu %d (z %.6g), gpu %d (z %.6g); logit of cpu's %.6g / %.6g, of gpu's %.6g / %.6g; "
               "worst id %d: %.6g / %.6g\n", k, tc[k], (double)zc[k], tg[k], (double)zg[k], (double)a[tc[k]],
               (double)b[tc[k]], (double)a[tg[k]], (double)b[tg[k]], wi, (double)a[wi], (double)b[wi]);
    }
    free(lc), free(lg), free(l2);
}

static void add_rows(pair *p, int rows) {
    const int nf = em_draft_get_info(p->cpu)->n_feat;
    float *f = xcalloc((size_t)rows * (size_t)nf, 4);
    for (int64_t i = 0; i < (int64_t)rows * nf; i++) f[i] = randn();
    em_err err = { 0 };
    int rc = em_draft_add_context(p->cpu, f, rows, &err);
    if (!rc) rc = em_draft_add_context(p->gpu, f, rows, &err);
    if (!rc) rc = em_draft_add_context(p->gpu2, f, rows, &err);
    if (rc) record("add_context", 0, "%d rows: %s", rows, err.msg);
    free(f);
}

/* ---- sampled drafts --------------------------------------------------------------------------- */

typedef struct sampled {
    int32_t tok[EM_DRAFT_MAX_BLOCK];
    em_sample_dist dists[EM_DRAFT_MAX_BLOCK];
    int n;
} sampled;

static int sampled_init(sampled *x, int V, em_err *err) {
    memset(x, 0, sizeof *x);
    for (int k = 0; k < EM_DRAFT_MAX_BLOCK; k++) {
        int rc = em_sample_dist_init(&x->dists[k], V, err);
        if (rc) return rc;
    }
    return EM_OK;
}

static void sampled_free(sampled *x) {
    for (int k = 0; k < EM_DRAFT_MAX_BLOCK; k++) em_sample_dist_free(&x->dists[k]);
}

/* One sampled propose of up to n_max slots with a sampler of seed (the default filters at
 * temperature 0.8). */
static int propose_sampled(em_drafter *d, int32_t anchor, int n_max, uint64_t seed, sampled *x, em_err *err) {
    em_sampler_params sp = em_sampler_default_params();
    sp.seed = seed;
    em_sampler *sm = NULL;
    int rc = em_sampler_create(&sm, &sp, em_draft_get_info(d)->n_vocab, err);
    em_draft_out o = { .tokens = x->tok };
    if (!rc) rc = em_draft_propose(d, anchor, n_max, &(em_draft_chain){ .sampler = sm, .dists = x->dists }, &o, err);
    x->n = o.n;
    em_sampler_free(sm);
    return rc;
}

static bool same_dist(const em_sample_dist *a, const em_sample_dist *b) {
    return a->n == b->n && !memcmp(a->ids, b->ids, (size_t)a->n * sizeof a->ids[0]) &&
           !memcmp(a->probs, b->probs, (size_t)a->n * sizeof a->probs[0]);
}

/* Sampled proposes on the device (em_gpu_draft_sample): each slot's distribution well formed
 * (1..top-k ids, probabilities summing to 1, the draft among them); the same seed the same
 * drafts and distributions; slot 0's distribution against the CPU sampler's on the CPU
 * drafter's slot-0 logits (total variation within 10 tol: Q8_0 logits move probabilities
 * more than the logits themselves); slot 0's draws over 3000 seeds against its distribution
 * (chi-square, ids expected at least 5 times, the rest pooled; limit df + 6 sqrt(2 df), about
 * p = 1e-6); logits rows asked for while sampling refused. */
static void test_sampling(const char *name, pair *p, double tol) {
    const em_draft_info *in = em_draft_get_info(p->gpu);
    const int V = in->n_vocab, nd = in->n_drafts;
    char label[96];
    em_err err = { 0 };
    sampled a, b;
    int rc = sampled_init(&a, V, &err);
    if (!rc) rc = sampled_init(&b, V, &err);
    if (!rc) rc = propose_sampled(p->gpu, 11, nd, 5, &a, &err);
    if (!rc) rc = propose_sampled(p->gpu, 11, nd, 5, &b, &err);
    bool formed = !rc && a.n >= 1, same = !rc && a.n == b.n && !memcmp(a.tok, b.tok, (size_t)a.n * sizeof a.tok[0]);
    for (int k = 0; formed && k < a.n; k++) {
        const em_sample_dist *q = &a.dists[k];
        double sum = 0;
        bool has = false;
        for (int i = 0; i < q->n; i++) sum += q->probs[i], has |= q->ids[i] == a.tok[k];
        formed = q->n >= 1 && q->n <= 40 && fabs(sum - 1) < 1e-4 && has;
        same &= same_dist(q, &b.dists[k]);
    }
    snprintf(label, sizeof label, "%s: sampled drafts well formed", name);
    record(label, formed, "%d drafts, slot 0 over %d ids (rc %d %s)", a.n, a.dists[0].n, rc, err.msg);
    snprintf(label, sizeof label, "%s: sampled drafts reproducible", name);
    record(label, same, "seed 5 twice: %s", same ? "the same drafts and distributions" : "they differ");
    /* slot 0 against the CPU sampler on the CPU drafter's logits */
    float *lc = xcalloc((size_t)nd * (size_t)V, 4);
    int32_t tc[EM_DRAFT_MAX_BLOCK];
    em_draft_out oc = { .tokens = tc, .logits = lc };
    em_sampler *sm = NULL;
    em_sample_dist ref = { 0 };
    em_sampler_params sp = em_sampler_default_params();
    double tv = 1;
    rc = em_draft_propose(p->cpu, 11, 1, &(em_draft_chain){ 0 }, &oc, &err);
    if (!rc) rc = em_sampler_create(&sm, &sp, V, &err);
    if (!rc) rc = em_sample_dist_init(&ref, V, &err);
    if (!rc) rc = em_sampler_dist(sm, lc, &ref, &err);
    if (!rc) {
        tv = 0;
        for (int i = 0; i < ref.n; i++) tv += fabs((double)ref.probs[i] - em_sample_dist_prob(&a.dists[0], ref.ids[i]));
        for (int i = 0; i < a.dists[0].n; i++)
            if (em_sample_dist_prob(&ref, a.dists[0].ids[i]) == 0) tv += a.dists[0].probs[i];
        tv /= 2;
    }
    snprintf(label, sizeof label, "%s: slot 0 distribution = CPU sampler's", name);
    record(label, !rc && tv <= 10 * tol, "total variation %.2e over %d / %d ids (rc %d %s)", tv, ref.n, a.dists[0].n, rc,
           err.msg);
    em_sample_dist_free(&ref);
    em_sampler_free(sm);
    free(lc);
    /* slot 0's draws against its distribution */
    const int DRAWS = quick ? 50 : 3000;
    int *count = xcalloc((size_t)V, sizeof *count);
    bool stable = true;
    for (int r = 0; !rc && r < DRAWS; r++) {
        rc = propose_sampled(p->gpu, 11, 1, 1000 + (uint64_t)r, &b, &err);
        if (!rc && b.n == 1) count[b.tok[0]]++;
        stable &= !rc && b.n == 1 && same_dist(&b.dists[0], &a.dists[0]);
    }
    double x2 = 0, pooled_e = 0, pooled_o = DRAWS;
    int df = -1;
    for (int i = 0; i < a.dists[0].n; i++) {
        const double e = DRAWS * (double)a.dists[0].probs[i];
        if (e < 5) continue;
        const double o = count[a.dists[0].ids[i]];
        x2 += (o - e) * (o - e) / e, df++, pooled_e += e, pooled_o -= o;
    }
    if (DRAWS - pooled_e >= 5) {
        const double e = DRAWS - pooled_e;
        x2 += (pooled_o - e) * (pooled_o - e) / e, df++;
    }
    const double limit = df + 6.0 * sqrt(2.0 * (df > 0 ? df : 1));
    snprintf(label, sizeof label, "%s: slot 0 draws follow it", name);
    record(label, !rc && stable && df >= 1 && x2 <= limit, "chi-square %.1f over %d dof (limit %.1f), %d draws%s (rc %d %s)",
           x2, df, limit, DRAWS, stable ? "" : ", the distribution moved", rc, err.msg);
    free(count);
    /* the logits rows of sampled drafts are not made on the device */
    float *rows = xcalloc((size_t)nd * (size_t)V, 4);
    em_draft_out ol = { .tokens = b.tok, .logits = rows };
    em_sampler *s2 = NULL;
    rc = em_sampler_create(&s2, &sp, V, &err);
    if (!rc) rc = em_draft_propose(p->gpu, 11, nd, &(em_draft_chain){ .sampler = s2 }, &ol, &err);
    snprintf(label, sizeof label, "%s: sampled logits rows refused", name);
    record(label, rc == EM_EUNSUPPORTED && ol.n == 0, "rc %d: %s", rc, err.msg);
    em_sampler_free(s2);
    free(rows);
    sampled_free(&a);
    sampled_free(&b);
}

/* ---- lossless sampling through the loop -------------------------------------------------------- */

#define LL_K 4      /* the sampler's top-k: the support of each token */
#define LL_RUNS 3000

/* The target's last-row logits after seq (n tokens) into row [vocab]. */
static int last_row(em_target *t, const int32_t *seq, int n, float *row, em_err *err) {
    const int V = em_target_get_info(t)->n_vocab;
    float *all = xcalloc((size_t)n * (size_t)V, sizeof *all);
    em_target_reset(t);
    int rc = em_target_verify(t, seq, n, &(em_rows){ .logits = all }, err);
    if (!rc) memcpy(row, all + (size_t)(n - 1) * (size_t)V, (size_t)V * sizeof *row);
    free(all);
    return rc;
}

static int on_token(void *ud, int32_t token, const char *bytes, size_t len) {
    (void)bytes, (void)len;
    int32_t *got = ud; /* got[0]: count, then the first three tokens */
    if (token >= 0 && got[0] < 3) got[1 + got[0]++] = token;
    return 0;
}

/* The lossless check with the drafter on cuda:0: LL_RUNS seeded runs of the decode
 * loop (fixed verify width 4, every pass drafting) over the pair's CPU target; the joint of
 * the first three tokens against the exact one from the target's rows through
 * em_sampler_dist (every context of depth 0..2 in the support), by chi-square (expected
 * counts under 5 pooled; limit df + 6 sqrt(2 df), about p = 1e-6) and total variation; both
 * acceptance and the residual draw must have run. */
static void test_lossless(const char *name, pair *p) {
    const int V = em_target_get_info(p->target)->n_vocab;
    const int32_t prompt[4] = { 1, 72 % V, 316 % V, 259 % V };
    const em_sampler_params sp = { .temperature = 0.9f, .top_k = LL_K, .top_p = 1.0f, .min_p = 0 };
    enum { CELLS = LL_K * LL_K * LL_K };
    int32_t cell_tok[CELLS][3];
    double prob[CELLS];
    int n_cells = 0, count[CELLS] = { 0 };
    em_err err = { 0 };
    em_sampler *sm = NULL;
    em_sample_dist d[3] = { { 0 } };
    float *row = xcalloc((size_t)V, sizeof *row);
    int32_t seq[7];
    memcpy(seq, prompt, sizeof prompt);
    int rc = em_sampler_create(&sm, &sp, V, &err);
    for (int i = 0; !rc && i < 3; i++) rc = em_sample_dist_init(&d[i], V, &err);
    if (!rc) rc = last_row(p->target, seq, 4, row, &err);
    if (!rc) rc = em_sampler_dist(sm, row, &d[0], &err);
    for (int a = 0; !rc && a < d[0].n; a++) {
        seq[4] = d[0].ids[a];
        if ((rc = last_row(p->target, seq, 5, row, &err)) || (rc = em_sampler_dist(sm, row, &d[1], &err))) break;
        for (int b = 0; !rc && b < d[1].n; b++) {
            seq[5] = d[1].ids[b];
            if ((rc = last_row(p->target, seq, 6, row, &err)) || (rc = em_sampler_dist(sm, row, &d[2], &err))) break;
            for (int c = 0; c < d[2].n; c++) {
                memcpy(cell_tok[n_cells], (int32_t[3]){ seq[4], seq[5], d[2].ids[c] }, sizeof cell_tok[0]);
                prob[n_cells++] = (double)d[0].probs[a] * d[1].probs[b] * d[2].probs[c];
            }
        }
    }
    em_decode *dec = NULL;
    if (!rc) rc = em_decode_create(&dec, p->target, &(em_decode_opts){ .drafter = p->gpu, .verify_width = 4 }, &err);
    uint64_t drafted = 0, accepted = 0;
    int outside = 0;
    for (int run = 0; !rc && run < LL_RUNS; run++) {
        em_decode_params dp = { .sampling = sp, .n_max = 4, .ignore_eog = true };
        dp.sampling.seed = 1 + (uint64_t)run;
        int32_t got[4] = { 0 };
        em_decode_result r;
        if ((rc = em_decode_generate(dec, prompt, 4, &dp, on_token, got, &r, &err))) break;
        drafted += r.drafted, accepted += r.accepted;
        int cell = -1;
        for (int i = 0; i < n_cells && cell < 0; i++)
            if (got[0] == 3 && !memcmp(cell_tok[i], got + 1, sizeof cell_tok[i])) cell = i;
        if (cell < 0) outside++;
        else count[cell]++;
    }
    double x2 = 0, tv = 0, pooled_e = 0, pooled_o = 0;
    int df = -1;
    for (int i = 0; i < n_cells; i++) {
        const double e = LL_RUNS * prob[i];
        tv += fabs((double)count[i] / LL_RUNS - prob[i]) / 2;
        if (e < 5) {
            pooled_e += e, pooled_o += count[i];
            continue;
        }
        x2 += (count[i] - e) * (count[i] - e) / e, df++;
    }
    if (pooled_e > 0) x2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e, df++;
    const double limit = df + 6.0 * sqrt(2.0 * (df > 0 ? df : 1));
    char label[96];
    snprintf(label, sizeof label, "%s: sampled decoding lossless (drafter on cuda:0)", name);
    record(label, !rc && outside == 0 && df >= 1 && x2 <= limit && tv < 0.1 && accepted > 0 && accepted < drafted,
           "%d runs, %d cells: chi-square %.1f over %d dof (limit %.1f), total variation %.3f, %d outside; %llu of %llu "
           "drafts accepted (rc %d %s)", LL_RUNS, n_cells, x2, df, limit, tv, outside, (unsigned long long)accepted,
           (unsigned long long)drafted, rc, err.msg);
    em_decode_free(dec);
    for (int i = 0; i < 3; i++) em_sample_dist_free(&d[i]);
    em_sampler_free(sm);
    free(row);
}

/* ---- the features a target keeps on the device ------------------------------------------------- */

/* The default pair with the target on cuda:0: the drafter there reads the target's device
 * feature rows; for each ring type, a prompt's context taken from them (rounded on the device)
 * gives the same proposals, bit for bit, as the same rows downloaded, pushed through the CPU
 * feature ring of that type and added from the host (test_decode's path). */
static void test_device_features(void) {
    const char *tp = "models/kimi-linear-19m-q8_0.gguf", *dp = "models/dspark-kimi-linear-19m-q8_0.gguf";
    int taps[EM_DRAFT_MAX_TAPS], n_taps = 0;
    em_target *t = NULL;
    em_drafter *dev = NULL, *host = NULL;
    em_target_shared sh;
    em_err err = { 0 };
    int rc = em_draft_read_taps(dp, taps, &n_taps, &err);
    if (!rc) rc = em_model_open(&t, tp, &(em_model_opts){ .device = EM_DEVICE_CUDA, .cuda_index = 0, .feature_layers = taps,
                                                          .n_feature_layers = n_taps }, &err);
    if (!rc) rc = em_target_shared_weights(t, &sh, &err);
    if (!rc) rc = em_draft_open(&dev, dp, &sh, &(em_draft_opts){ .device = "cuda:0" }, &err);
    if (!rc) rc = em_draft_open(&host, dp, &sh, &(em_draft_opts){ .device = "cuda:0" }, &err);
    const bool reads = !rc && em_draft_get_info(dev)->target_features && sh.d_features && sh.feature_rows >= 128;
    record("device features: the drafter reads its target's", reads, "feature rows %d (rc %d %s)", rc ? 0 : sh.feature_rows,
           rc, err.msg);
    enum { N = 40 };
    const int types[] = { EM_TYPE_F32, EM_TYPE_F16, EM_TYPE_BF16, EM_TYPE_Q8_0 };
    const int nf = reads ? em_draft_get_info(dev)->n_feat : 0, V = reads ? em_target_get_info(t)->n_vocab : 1;
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 7919 + 13) % V);
    float *feats = xcalloc((size_t)N * (size_t)(nf ? nf : 1), 4), *kept = xcalloc((size_t)N * (size_t)(nf ? nf : 1), 4);
    /* the rows kept on the device are the rows a host copy gets */
    if (reads) {
        rc = em_target_prefill(t, tok, N, &(em_rows){ .features = feats }, &err);
        if (!rc) em_target_reset(t);
        if (!rc) rc = em_target_prefill(t, tok, N, &(em_rows){ .device_features = true }, &err);
        em_gpu *tg = sh.gpu;
        if (!rc) rc = em_gpu_download(tg, kept, sh.d_features, (uint64_t)N * (uint64_t)nf * 4, &err);
        int first = -1;
        for (int64_t i = 0; !rc && i < (int64_t)N * nf && first < 0; i++)
            if (memcmp(&feats[i], &kept[i], 4)) first = (int)i;
        record("device features: kept rows = downloaded rows", !rc && first < 0, "%d rows of %d%s%d (rc %d %s)", N, nf,
               first < 0 ? "" : ", first difference at value ", first, rc, err.msg);
        em_target_reset(t);
    }
    for (size_t ti = 0; reads && ti < sizeof types / sizeof types[0]; ti++) {
        em_decode_ring *ring = NULL;
        int32_t a[EM_DRAFT_MAX_BLOCK], b[EM_DRAFT_MAX_BLOCK];
        float za[EM_DRAFT_MAX_BLOCK], zb[EM_DRAFT_MAX_BLOCK];
        em_draft_out oa = { .tokens = a, .conf_logits = za }, ob = { .tokens = b, .conf_logits = zb };
        const int nd = em_draft_get_info(dev)->n_drafts;
        em_target_reset(t);
        em_draft_reset(dev);
        em_draft_reset(host);
        rc = em_target_prefill(t, tok, N, &(em_rows){ .features = feats }, &err);
        if (!rc) rc = em_decode_ring_create(&ring, nf, N, types[ti], &err);
        if (!rc) rc = em_decode_ring_push(ring, 0, feats, N, &err);
        if (!rc) rc = em_decode_ring_read(ring, 0, N, feats, &err);
        if (!rc) rc = em_draft_add_context(host, feats, N, &err);
        if (!rc) em_target_reset(t);
        if (!rc) rc = em_target_prefill(t, tok, N, &(em_rows){ .device_features = true }, &err);
        if (!rc) rc = em_draft_add_context_target(dev, 0, N, types[ti], &err);
        if (!rc) rc = em_draft_propose(dev, 5, nd, &(em_draft_chain){ 0 }, &oa, &err);
        if (!rc) rc = em_draft_propose(host, 5, nd, &(em_draft_chain){ 0 }, &ob, &err);
        { /* each drafter again: the same bits (a drafter that moves by itself shows here) */
            int32_t a2[EM_DRAFT_MAX_BLOCK], b2[EM_DRAFT_MAX_BLOCK];
            float za2[EM_DRAFT_MAX_BLOCK], zb2[EM_DRAFT_MAX_BLOCK];
            em_draft_out oa2 = { .tokens = a2, .conf_logits = za2 }, ob2 = { .tokens = b2, .conf_logits = zb2 };
            int rc2 = em_draft_propose(dev, 5, nd, &(em_draft_chain){ 0 }, &oa2, &err);
            if (!rc2) rc2 = em_draft_propose(host, 5, nd, &(em_draft_chain){ 0 }, &ob2, &err);
            const bool da = !rc2 && oa2.n == oa.n && !memcmp(a2, a, (size_t)oa.n * sizeof a[0]) &&
                            !memcmp(za2, za, (size_t)oa.n * sizeof za[0]);
            const bool db = !rc2 && ob2.n == ob.n && !memcmp(b2, b, (size_t)ob.n * sizeof b[0]) &&
                            !memcmp(zb2, zb, (size_t)ob.n * sizeof zb[0]);
            char l2[96];
            snprintf(l2, sizeof l2, "device features (%s): each drafter repeats itself", em_type_name(types[ti]));
            record(l2, da && db, "device-fed %s, host-fed %s (rc %d %s)", da ? "same" : "DIFFERS", db ? "same" : "DIFFERS", rc2,
                   err.msg);
        }
        const bool same = !rc && oa.n == ob.n && oa.n > 0 && !memcmp(a, b, (size_t)oa.n * sizeof a[0]) &&
                          !memcmp(za, zb, (size_t)oa.n * sizeof za[0]);
        char label[96];
        snprintf(label, sizeof label, "device features (%s) = the CPU ring's", em_type_name(types[ti]));
        record(label, same, "%d and %d drafts, %s (rc %d %s)", oa.n, ob.n, same ? "the same tokens and confidences" : "they differ",
               rc, err.msg);
        if (!same)
            for (int k = 0; k < oa.n && k < ob.n; k++)
                printf("     slot %d: device %d (z %.9g), host %d (z %.9g)\n", k, a[k], (double)za[k], b[k], (double)zb[k]);
        em_decode_ring_free(ring);
    }
    /* refusals: more rows than the target keeps; a CPU target asked to keep them */
    rc = reads ? em_draft_add_context_target(dev, sh.feature_rows - 2, 3, EM_TYPE_F32, &err) : EM_OK;
    record("device features: rows past the target's refused", reads && rc == EM_EINVAL, "rc %d: %s", rc, err.msg);
    free(feats), free(kept);
    em_draft_close(host);
    em_draft_close(dev);
    em_target_close(t);
}

/* tol: 1e-4 for F32 weights (the products' and the attention's orders differ, nothing else);
 * 3e-2 for Q8_0 weights, whose activations are quantized: a value that lands on the other side
 * of an int8 rounding step moves a product's output by up to half a step (1/254 of the row's
 * largest value) times its weight, as between the CPU and the GPU target (docs/cuda.md run 8:
 * kimi_b q8_0 1.5e-2, argmax equal). */
static void test_pair(const char *name, const char *target, const char *draft, double tol) {
    pair p;
    em_err err = { 0 };
    int rc = open_pair(&p, target, draft, &err);
    char label[96];
    snprintf(label, sizeof label, "%s: open on cuda:0", name);
    record(label, !rc, "%s", rc ? err.msg : em_draft_get_info(p.gpu)->device);
    if (rc) {
        close_pair(&p);
        return;
    }
    const int V = em_draft_get_info(p.cpu)->n_vocab, nd = em_draft_get_info(p.cpu)->n_drafts;
    for (int round = 0; round < 2; round++) {
        const int pieces[] = { 1, 5, 37 };
        for (int i = 0; i < 3; i++) {
            add_rows(&p, pieces[i]);
            for (int a = 0; a < 3; a++) {
                const int32_t anchor = (int32_t)((a * 7919 + i * 104729 + round * 31) % V);
                snprintf(label, sizeof label, "%s: r%d ctx %lld anchor %d all", name, round,
                         (long long)em_draft_get_info(p.gpu)->n_ctx, anchor);
                compare_propose(label, &p, anchor, nd, false, tol);
                snprintf(label, sizeof label, "%s: r%d keep test, n_max %d", name, round, a + 2);
                compare_propose(label, &p, anchor, a + 2 < nd ? a + 2 : nd, true, tol);
            }
        }
        if (round == 0) { /* anchors low and high over one context: whether a failure follows the anchor */
            const int32_t sweep[] = { 1, 5, 11, 31, 100, 1000, 3000, 4095, 4096, 5000, 8191, 8192, 9000, 20000 };
            for (size_t j = 0; j < sizeof sweep / sizeof sweep[0]; j++) {
                snprintf(label, sizeof label, "%s: ctx %lld anchor %d", name, (long long)em_draft_get_info(p.gpu)->n_ctx,
                         sweep[j] % V);
                compare_propose(label, &p, sweep[j] % V, nd, false, tol);
            }
        }
        em_draft_reset(p.cpu);
        em_draft_reset(p.gpu);
        em_draft_reset(p.gpu2);
    }
    add_rows(&p, 20);
    test_sampling(name, &p, tol);
    close_pair(&p);
}

static void test_refusals(const char *models) {
    char t[512], d[512];
    snprintf(t, sizeof t, "%s/kimi_a_f32.gguf", models);
    em_target *tg = NULL;
    em_drafter *dr = NULL;
    em_target_shared sh;
    em_err err = { 0 };
    int taps[EM_DRAFT_MAX_TAPS], n_taps = 0;
    snprintf(d, sizeof d, "%s/dspark_deepspec_f32.gguf", models);
    int rc = em_draft_read_taps(d, taps, &n_taps, &err);
    if (!rc)
        rc = em_model_open(&tg, t, &(em_model_opts){ .device = EM_DEVICE_CPU, .feature_layers = taps, .n_feature_layers = n_taps },
                           &err);
    if (!rc) rc = em_target_shared_weights(tg, &sh, &err);
    if (!rc) rc = em_draft_open(&dr, d, &sh, &(em_draft_opts){ .device = "cuda:7" }, &err);
    record("refused: a drafter on cuda:7", rc != EM_OK && !dr && strstr(err.msg, "cuda:7"), "rc %d: %s", rc, err.msg);
    em_draft_close(dr);
    em_target_close(tg);
}

int main(int argc, char **argv) {
    quick = argc == 3 && !strcmp(argv[2], "--quick");
    if (argc != 2 && !quick) {
        fprintf(stderr, "usage: test_gpu_draft MODELS_DIR [--quick]   (from the repository root)\n");
        return 2;
    }
    em_gpu *g = NULL;
    em_err err = { 0 };
    if (em_gpu_open(0, &g, &err)) {
        fprintf(stderr, "test_gpu_draft: no GPU: %s\n", err.msg);
        return 2;
    }
    printf("== GPU drafter checks (%s) ==\n", em_gpu_get_info(g)->name);
    test_attention(g);
    test_head_norm_rope(g);
    test_attention_rope(g);
    test_slot_begin(g);
    test_markov_chain(g, 128, 1037);
    test_markov_chain(g, 96, 1037); /* 3 blocks a row: lanes past them hold 0 */
    test_markov_chain(g, 128, 12007); /* W2's slices past what shared memory holds */
    em_gpu_close(g);
    test_pair("default pair", "models/kimi-linear-19m-q8_0.gguf", "models/dspark-kimi-linear-19m-q8_0.gguf", 3e-2);
    pair dp;
    if (quick) dp = (pair){ 0 };
    else if (!open_pair(&dp, "models/kimi-linear-19m-q8_0.gguf", "models/dspark-kimi-linear-19m-q8_0.gguf", &err))
        test_lossless("default pair", &dp);
    else record("default pair: lossless", 0, "%s", err.msg);
    close_pair(&dp);
    char t[512], d[512];
    snprintf(t, sizeof t, "%s/kimi_a_f32.gguf", argv[1]);
    snprintf(d, sizeof d, "%s/dspark_deepspec_f32.gguf", argv[1]);
    test_pair("fixture kimi_a + dspark_deepspec", t, d, 1e-4);
    /* the gated and rnn Markov heads (the rnn state carried from slot to slot, zeroed per block) */
    snprintf(d, sizeof d, "%s/dspark_deepspec_gated_f32.gguf", argv[1]);
    test_pair("fixture kimi_a + gated Markov", t, d, 1e-4);
    snprintf(d, sizeof d, "%s/dspark_specforge_rnn_f32.gguf", argv[1]);
    test_pair("fixture kimi_a + rnn Markov", t, d, 1e-4);
    test_refusals(argv[1]);
    test_device_features();
    printf("== %d checks, %d passed, %d failed ==\n", n_ok + n_fail, n_ok, n_fail);
    return n_fail ? 1 : 0;
}
