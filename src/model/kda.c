/* model/kda.c: the Kimi Delta Attention core (see kda.h for the math). Owns the per-head
 * forward (conv + SiLU, L2 norms, gates, delta rule, gated RMSNorm), its two forms, the
 * transition log and the ReplaySSM commit, and the portable scalar kernel table.
 *
 * Invariants:
 * - em_kda_forward never writes the committed state; forward_commit and commit write only
 *   the state they are given.
 * - One pool task per head (from KDA_PAR_WORK rows x head_dim^2 per head on; less work runs
 *   on the caller); a head's result never depends on which thread ran it or on how many
 *   threads there are (each thread has its own workspace; kernels are deterministic).
 * - Recurrent form per row: u = (diag(a) S)^T k and w = (diag(a) S)^T q are read in one pass
 *   over S, then delta = beta (v - u), o = w + (k.q) delta (= S_new^T q), and the update
 *   S = diag(a) S + k delta^T is fused with the next row's read pass. commit replays rows
 *   with the same kernels and operation order, so commit(k) is bit-identical to feeding the
 *   k rows one call at a time.
 * - Chunked form (WY/UT, chunk EM_KDA_CHUNK, sub-blocks of KDA_SUB rows): the decay between
 *   rows j < i, exp(c_i - c_j) with c the cumulative log-decay, is never formed from a
 *   difference of cumulative sums nor from exp(c) alone. It is the running product of the
 *   per-row factors a_s = exp(g_s) <= 1 from a reference row outward, exactly the factors
 *   the recurrent form multiplies S by: no overflow, no cancellation when a huge negative
 *   gate precedes small ones (transformers/fla subtract fp32 cumsums there), and one exp
 *   per row and channel instead of one per pair. Off-diagonal sub-blocks go through a
 *   reference row n between them (P(j,i] = P(n,i] P(j,n], both <= 1) as plain GEMMs.
 * Must not: allocate in the per-row paths (workspace comes from the caller's arena or one
 * malloc per call), or touch anything above model/. */
#include "model/kda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/kda_kern.h"
#include "quant/quant.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#define KDA_SUB 16               /* sub-block rows inside a chunk (diagonal blocks pairwise) */
/* Heads go to the pool from this much work per head on (rows x head_dim^2: one row at head
 * dim 64 or more); below, a head's work (head_dim 32: well under a microsecond a row) does
 * not pay for the hand-off. At head_dim 64 one row of four heads took 5-6 us a layer on one
 * thread and 4 us on two (the default pair on a 2-core AVX-512 VM, `ember bench --phases`:
 * kda.recurrence 0.032-0.037 -> 0.023-0.029 ms a token over six layers). At head_dim 128
 * one decode row is ~20 us a head, as S (64 KiB a head) comes back from memory after a
 * token's weights streamed through the caches: both cores' bandwidth halves it. The result is
 * the same either way. */
#define KDA_PAR_WORK (1 * 64 * 64)
#define KDA_MAX_HEAD_DIM 1024
#define KDA_MAX_HEADS (1 << 16)

/* ==== subnormals ========================================================================
 * Strongly decaying channels drive rows of S (and the chunk's decay products) through the
 * subnormal range on their way to 0, where x86 arithmetic is ~100x slower. Each head task
 * runs with flush-to-zero and denormals-are-zero on (values below FLT_MIN ~ 1.2e-38 become
 * 0; no effect on anything the model can see) and restores the thread's previous mode. */
#if defined(__x86_64__) || defined(__i386__)
typedef unsigned int fpmode;
static fpmode fpmode_fast(void) {
    fpmode old = _mm_getcsr();
    _mm_setcsr(old | 0x8040u); /* FTZ (bit 15) | DAZ (bit 6) */
    return old;
}
static void fpmode_restore(fpmode old) { _mm_setcsr(old); }
#else
typedef int fpmode;
static fpmode fpmode_fast(void) { return 0; }
static void fpmode_restore(fpmode old) { (void)old; }
#endif

/* ==== scalar kernels ===================================================================== */

static void sweep_scalar(float *S, const float *src, int D, const float *a, const float *k,
                         const float *delta, const float *x, const float *y, float *u, float *w) {
    if (x) memset(u, 0, (size_t)D * sizeof(float));
    if (y) memset(w, 0, (size_t)D * sizeof(float));
    for (int r = 0; r < D; r++) {
        const float *row = src + (size_t)r * D;
        if (a) {
            const float ar = a[r], kr = k[r];
            float *dst = S + (size_t)r * D;
            for (int c = 0; c < D; c++) dst[c] = ar * row[c] + kr * delta[c];
            row = dst;
        }
        if (x) {
            const float xr = x[r];
            for (int c = 0; c < D; c++) u[c] += xr * row[c];
        }
        if (y) {
            const float yr = y[r];
            for (int c = 0; c < D; c++) w[c] += yr * row[c];
        }
    }
}

static void gemm_scalar(int M, int N, int K, float alpha, const float *A, ptrdiff_t ars,
                        ptrdiff_t acs, const float *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc) {
    for (int i = 0; i < M; i++) {
        float *restrict c = C + (ptrdiff_t)i * ldc;
        for (int p = 0; p < K; p++) {
            const float av = alpha * A[(ptrdiff_t)i * ars + (ptrdiff_t)p * acs];
            const float *restrict b = B + (ptrdiff_t)p * ldb;
            for (int j = 0; j < N; j++) c[j] += av * b[j];
        }
    }
}

static void dot2_scalar(const float *a, const float *b, const float *c, int n, float *r1,
                        float *r2) {
    float s1 = 0.0f, s2 = 0.0f;
    for (int i = 0; i < n; i++) {
        s1 += a[i] * c[i];
        if (b) s2 += b[i] * c[i];
    }
    *r1 = s1;
    if (b) *r2 = s2;
}

static void vexp_scalar(const float *x, float *y, int n) {
    for (int i = 0; i < n; i++) y[i] = expf(x[i]);
}

static void add_scalar(float *y, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += x[i];
}
static void mul_scalar(float *y, const float *a, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] = a[i] * x[i];
}
static void muladd_scalar(float *y, const float *a, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += a[i] * x[i];
}
static void axpy_scalar(float *y, float s, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += s * x[i];
}
static void scale_scalar(float *y, float s, int n) {
    for (int i = 0; i < n; i++) y[i] *= s;
}
static void wxpy_scalar(float *y, const float *w, float s, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] = w[i] + s * x[i];
}
static void delta_scalar(float *y, float beta, const float *v, const float *u, int n) {
    for (int i = 0; i < n; i++) y[i] = beta * (v[i] - u[i]);
}
static void silu_scalar(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = x[i] / (1.0f + expf(-x[i]));
}
static void gate_softplus_scalar(float *g, float a, int n) {
    for (int i = 0; i < n; i++) g[i] = a * (g[i] > 20.0f ? g[i] : log1pf(expf(g[i])));
}
static void gate_bounded_scalar(float *g, float a, float lb, int n) {
    for (int i = 0; i < n; i++) g[i] = lb / (1.0f + expf(a * g[i]));
}
static void norm_gate_scalar(float *y, const float *w, const float *o, float rs, const float *g2,
                             int n) {
    for (int i = 0; i < n; i++) y[i] = w[i] * (o[i] * rs) / (1.0f + expf(-g2[i]));
}

static const em_kda_kern kern_scalar = {
    .sweep = sweep_scalar,
    .gemm = gemm_scalar,
    .dot2 = dot2_scalar,
    .vexp = vexp_scalar,
    .add = add_scalar,
    .mul = mul_scalar,
    .muladd = muladd_scalar,
    .axpy = axpy_scalar,
    .scale = scale_scalar,
    .wxpy = wxpy_scalar,
    .delta = delta_scalar,
    .silu = silu_scalar,
    .gate_softplus = gate_softplus_scalar,
    .gate_bounded = gate_bounded_scalar,
    .norm_gate = norm_gate_scalar,
};

static const em_kda_kern *kern_pick(void) {
    const int isa = em_isa_default();
    return isa >= EM_ISA_AVX512 ? em_kda_kern_avx512() : isa >= EM_ISA_AVX2 ? em_kda_kern_avx2() : &kern_scalar;
}

/* ==== dims, sizes, state ================================================================ */

int em_kda_dims_check(const em_kda_dims *d, em_err *err) {
    if (!d) return em_err_set(err, EM_EINVAL, "kda: dims is NULL");
    if (d->n_head < 1 || d->n_head > KDA_MAX_HEADS)
        return em_err_set(err, EM_EINVAL, "kda: n_head %d out of range [1, %d]", d->n_head,
                          KDA_MAX_HEADS);
    if (d->head_dim < 1 || d->head_dim > KDA_MAX_HEAD_DIM)
        return em_err_set(err, EM_EINVAL, "kda: head_dim %d out of range [1, %d]", d->head_dim,
                          KDA_MAX_HEAD_DIM);
    if (d->d_conv < 1 || d->d_conv > EM_KDA_MAX_CONV)
        return em_err_set(err, EM_EINVAL, "kda: d_conv %d out of range [1, %d]", d->d_conv,
                          EM_KDA_MAX_CONV);
    if (!isfinite(d->norm_eps) || d->norm_eps < 0.0f)
        return em_err_set(err, EM_EINVAL, "kda: norm_eps %g is not a finite value >= 0",
                          (double)d->norm_eps);
    if (!isfinite(d->l2_eps) || d->l2_eps < 0.0f)
        return em_err_set(err, EM_EINVAL, "kda: l2_eps %g is not a finite value >= 0",
                          (double)d->l2_eps);
    if (d->bounded_gate && !(isfinite(d->gate_lower_bound) && d->gate_lower_bound < 0.0f))
        return em_err_set(err, EM_EINVAL,
                          "kda: gate_lower_bound %g must be finite and < 0 for the bounded gate",
                          (double)d->gate_lower_bound);
    if (d->chunk_min_rows < 0)
        return em_err_set(err, EM_EINVAL, "kda: chunk_min_rows %d is negative", d->chunk_min_rows);
    return EM_OK;
}

/* With the limits above, every size below fits easily in size_t (< 2^37 floats). */
static size_t d_inner_of(const em_kda_dims *d) { return (size_t)d->n_head * (size_t)d->head_dim; }
static size_t conv_floats(const em_kda_dims *d) { return 3 * (size_t)(d->d_conv - 1) * d_inner_of(d); }
static size_t s_floats(const em_kda_dims *d) {
    return (size_t)d->n_head * (size_t)d->head_dim * (size_t)d->head_dim;
}

/* A zeroed S, 64-byte aligned inside *mem (what to free). calloc, not memset: a large zeroed
 * block comes as fresh pages, so a model with many big states (Kimi-K3: 69 of 6 MiB) opens
 * without touching them. */
static float *alloc_S(const em_kda_dims *d, void **mem, em_err *err) {
    *mem = em_calloc(1, s_floats(d) * sizeof(float) + 63, "kda state", err);
    return *mem ? (float *)(((uintptr_t)*mem + 63) & ~(uintptr_t)63) : NULL;
}

size_t em_kda_state_floats(const em_kda_dims *d) {
    if (em_kda_dims_check(d, NULL) != EM_OK) return 0;
    return conv_floats(d) + s_floats(d);
}

int em_kda_state_init(em_kda_state *s, const em_kda_dims *d, em_err *err) {
    if (!s) return em_err_set(err, EM_EINVAL, "kda: state is NULL");
    s->conv = s->S = NULL;
    s->mem = NULL;
    int rc = em_kda_dims_check(d, err);
    if (rc) return rc;
    if (!(s->S = alloc_S(d, &s->mem, err))) return EM_ENOMEM;
    if (conv_floats(d) && !(s->conv = em_calloc(conv_floats(d), sizeof(float), "kda conv window", err))) {
        em_kda_state_free(s);
        return EM_ENOMEM;
    }
    return EM_OK;
}

void em_kda_state_free(em_kda_state *s) {
    if (!s) return;
    if (s->mem) free(s->conv); /* caller memory (mem NULL) is the caller's */
    free(s->mem);
    s->mem = NULL;
    s->S = s->conv = NULL;
}

void em_kda_state_reset(em_kda_state *s, const em_kda_dims *d) {
    if (!s || em_kda_dims_check(d, NULL) != EM_OK) return;
    if (s->conv && conv_floats(d)) memset(s->conv, 0, conv_floats(d) * sizeof(float));
    if (s->S) memset(s->S, 0, s_floats(d) * sizeof(float));
}

void em_kda_state_copy(em_kda_state *dst, const em_kda_state *src, const em_kda_dims *d) {
    if (!dst || !src || dst == src || em_kda_dims_check(d, NULL) != EM_OK) return;
    if (dst->conv && src->conv && conv_floats(d))
        memcpy(dst->conv, src->conv, conv_floats(d) * sizeof(float));
    if (dst->S && src->S) memcpy(dst->S, src->S, s_floats(d) * sizeof(float));
}

/* ==== per-thread workspace ============================================================== */

typedef struct kda_ws {
    float *S;                     /* [D][D] working state when the caller's must stay intact */
    float *Q, *K, *V, *G;         /* [C][D] prepared rows of the current block */
    float *EF, *ER, *W, *U, *O;   /* [C][D] */
    float *Qt, *Kt;               /* [KDA_SUB][D] */
    float *KbT;                   /* [D][C] (also [C][D] scratch) */
    float *Lm, *Am, *T;           /* [C][C] */
    float *beta;                  /* [C] */
    float *rows;                  /* 8 x [D] temporaries */
    float *wT;                    /* [3][d_conv][D] this head's conv taps, tap-major */
} kda_ws;

/* Lays the workspace out from base (or only counts when base is NULL); returns floats used.
 * Each piece is rounded up to 16 floats so every piece stays 64-byte aligned. */
static size_t ws_layout(int D, int dc, float *base, kda_ws *w) {
    const size_t C = EM_KDA_CHUNK, d = (size_t)D;
    size_t off = 0;
#define WS_PIECE(field, count)                                                               \
    do {                                                                                     \
        if (base) w->field = base + off;                                                     \
        off += ((size_t)(count) + 15) / 16 * 16;                                             \
    } while (0)
    WS_PIECE(S, d * d);
    WS_PIECE(Q, C * d);
    WS_PIECE(K, C * d);
    WS_PIECE(V, C * d);
    WS_PIECE(G, C * d);
    WS_PIECE(EF, C * d);
    WS_PIECE(ER, C * d);
    WS_PIECE(W, C * d);
    WS_PIECE(U, C * d);
    WS_PIECE(O, C * d);
    WS_PIECE(Qt, KDA_SUB * d);
    WS_PIECE(Kt, KDA_SUB * d);
    WS_PIECE(KbT, C * d);
    WS_PIECE(Lm, C * C);
    WS_PIECE(Am, C * C);
    WS_PIECE(T, C * C);
    WS_PIECE(beta, C);
    WS_PIECE(rows, 8 * d);
    WS_PIECE(wT, 3 * (size_t)dc * d);
#undef WS_PIECE
    return off;
}

size_t em_kda_scratch_bytes(const em_kda_dims *d, int n_threads, int n) {
    if (em_kda_dims_check(d, NULL) != EM_OK || n_threads < 1) return 0;
    size_t f = (size_t)n_threads * ws_layout(d->head_dim, d->d_conv, NULL, NULL);
    if (n > EM_KDA_CHUNK) f += s_floats(d); /* em_kda_forward without a kept final state */
    return f * sizeof(float);
}

/* ==== the transition log ================================================================ */

struct em_kda_log {
    em_kda_dims d;
    int max_rows;
    int n;          /* rows of the last forward */
    bool consumed;  /* commit already applied (a second one would double-apply) */
    float *k, *v, *g; /* [max_rows][d_inner] post-conv normed k, post-conv v, decay */
    float *beta;      /* [max_rows][n_head] */
    float *pre;       /* [max_rows][3*d_inner] pre-conv q|k|v */
    float *S_final;   /* [n_head][D][D] state after all n rows, or NULL */
    void *S_final_mem; /* its allocation (exchanged with a state's by commit) */
    float *hbuf;      /* [n_head][8*D] replay temporaries */
    float *mem;
};

int em_kda_log_create(em_kda_log **out, const em_kda_dims *d, int max_rows, bool keep_final,
                      em_err *err) {
    if (!out) return em_err_set(err, EM_EINVAL, "kda log: out is NULL");
    *out = NULL;
    int rc = em_kda_dims_check(d, err);
    if (rc) return rc;
    if (max_rows < 1)
        return em_err_set(err, EM_EINVAL, "kda log: max_rows %d must be >= 1", max_rows);
    uint64_t di = d_inner_of(d), per_row, rows_f, total, extra;
    /* per row: k, v, g (3 d_inner) + pre (3 d_inner) + beta (n_head) */
    if (em_mul_overflow(di, 6, &per_row) || em_add_overflow(per_row, (uint64_t)d->n_head, &per_row) ||
        em_mul_overflow(per_row, (uint64_t)max_rows, &rows_f))
        return em_err_set(err, EM_EOVERFLOW, "kda log: %d rows overflow the size", max_rows);
    extra = (uint64_t)d->n_head * 8 * (uint64_t)d->head_dim;
    if (em_add_overflow(rows_f, extra, &total) || em_mul_overflow(total, sizeof(float), &total) ||
        total > SIZE_MAX / 2)
        return em_err_set(err, EM_EOVERFLOW, "kda log: %d rows overflow the size", max_rows);
    em_kda_log *l = em_calloc(1, sizeof(*l), "kda log", err);
    if (!l) return EM_ENOMEM;
    l->mem = em_aligned_alloc(64, (size_t)total, "kda log buffers", err);
    if (l->mem && keep_final) l->S_final = alloc_S(d, &l->S_final_mem, err);
    if (!l->mem || (keep_final && !l->S_final)) {
        em_kda_log_free(l);
        return EM_ENOMEM;
    }
    l->d = *d;
    l->max_rows = max_rows;
    float *p = l->mem;
    size_t mr = (size_t)max_rows;
    l->hbuf = p, p += (size_t)d->n_head * 8 * (size_t)d->head_dim;
    l->k = p, p += mr * di;
    l->v = p, p += mr * di;
    l->g = p, p += mr * di;
    l->pre = p, p += mr * 3 * di;
    l->beta = p;
    *out = l;
    return EM_OK;
}

void em_kda_log_free(em_kda_log *l) {
    if (!l) return;
    free(l->mem);
    free(l->S_final_mem);
    free(l);
}

int em_kda_log_rows(const em_kda_log *l) { return l ? l->n : 0; }

static bool dims_equal(const em_kda_dims *a, const em_kda_dims *b) {
    return a->n_head == b->n_head && a->head_dim == b->head_dim && a->d_conv == b->d_conv &&
           a->norm_eps == b->norm_eps && a->l2_eps == b->l2_eps &&
           a->bounded_gate == b->bounded_gate &&
           (!a->bounded_gate || a->gate_lower_bound == b->gate_lower_bound);
}

/* ==== row preparation and output ======================================================== */

typedef struct kda_run {
    const em_kda_dims *d;
    const em_kda_params *p;
    const em_kda_kern *kern;
    const float *win;   /* committed conv window [3][d_conv-1][d_inner] */
    const float *S_in;  /* committed S */
    float *S_out;       /* final S per head goes here (may equal S_in); NULL: discarded */
    float *S_heads;     /* per-head working states when S_out is NULL and rows span blocks */
    int n, t0, t1;      /* all rows; the block of rows the current pool run works on */
    const float *qkv, *f, *b, *g2;
    float *out;
    em_kda_log *log;
    kda_ws *ws; /* one per pool thread */
    bool chunked;
} kda_run;

/* ws->wT[m][i][c] = conv_m[h*D + c][i]: head h's taps laid out for contiguous rows. */
static void conv_taps(const kda_run *run, int h, kda_ws *ws) {
    const em_kda_params *p = run->p;
    const int D = run->d->head_dim, dc = run->d->d_conv;
    const float *conv_w[3] = { p->conv_q, p->conv_k, p->conv_v };
    for (int m = 0; m < 3; m++) {
        const float *src = conv_w[m] + (size_t)h * (size_t)D * (size_t)dc;
        for (int i = 0; i < dc; i++) {
            float *dst = ws->wT + ((size_t)m * (size_t)dc + (size_t)i) * (size_t)D;
            for (int c = 0; c < D; c++) dst[c] = src[(size_t)c * (size_t)dc + (size_t)i];
        }
    }
}

/* Fills ws Q, K, V, G, beta for rows [t0, t1) of head h (at most EM_KDA_CHUNK rows). */
static void prep_rows(const kda_run *run, int h, int t0, int t1, kda_ws *ws) {
    const em_kda_dims *d = run->d;
    const em_kda_params *p = run->p;
    const em_kda_kern *kern = run->kern;
    const int D = d->head_dim, dc = d->d_conv, W = dc - 1;
    const size_t di = d_inner_of(d), ch0 = (size_t)h * (size_t)D;
    const float q_scale = 1.0f / sqrtf((float)D);
    for (int t = t0; t < t1; t++) {
        const size_t r = (size_t)(t - t0) * (size_t)D;
        float *dst3[3] = { ws->Q + r, ws->K + r, ws->V + r };
        for (int m = 0; m < 3; m++) {
            float *acc = dst3[m];
            memset(acc, 0, (size_t)D * sizeof(float));
            for (int i = 0; i < dc; i++) { /* taps oldest first; tap dc-1 is row t */
                const int tau = t - W + i;
                const float *z =
                    tau < 0 ? run->win + ((size_t)m * (size_t)W + (size_t)(tau + W)) * di + ch0
                            : run->qkv + (size_t)tau * 3 * di + (size_t)m * di + ch0;
                kern->muladd(acc, ws->wT + ((size_t)m * (size_t)dc + (size_t)i) * (size_t)D, z, D);
            }
            kern->silu(acc, D);
        }
        float ssq, ssk;
        kern->dot2(dst3[0], NULL, dst3[0], D, &ssq, NULL);
        kern->dot2(dst3[1], NULL, dst3[1], D, &ssk, NULL);
        kern->scale(dst3[0], (1.0f / sqrtf(ssq + d->l2_eps)) * q_scale, D);
        kern->scale(dst3[1], 1.0f / sqrtf(ssk + d->l2_eps), D);

        float *g = ws->G + r;
        memcpy(g, run->f + (size_t)t * di + ch0, (size_t)D * sizeof(float));
        kern->add(g, p->dt_bias + ch0, D);
        if (d->bounded_gate) /* lb * sigmoid(exp(A_log) raw) = lb / (1 + exp(ssm_a raw)) */
            kern->gate_bounded(g, p->ssm_a[h], d->gate_lower_bound, D);
        else
            kern->gate_softplus(g, p->ssm_a[h], D);
        ws->beta[t - t0] = 1.0f / (1.0f + expf(-run->b[(size_t)t * (size_t)d->n_head + (size_t)h]));
    }
}

/* Copies the block's transitions into the log (head h's slice of each row). */
static void log_rows(const kda_run *run, int h, int t0, int t1, const kda_ws *ws) {
    em_kda_log *l = run->log;
    const int D = run->d->head_dim;
    const size_t di = d_inner_of(run->d), ch0 = (size_t)h * (size_t)D, bytes = (size_t)D * sizeof(float);
    for (int t = t0; t < t1; t++) {
        const size_t r = (size_t)(t - t0) * (size_t)D, lr = (size_t)t * di + ch0;
        memcpy(l->k + lr, ws->K + r, bytes);
        memcpy(l->v + lr, ws->V + r, bytes);
        memcpy(l->g + lr, ws->G + r, bytes);
        l->beta[(size_t)t * (size_t)run->d->n_head + (size_t)h] = ws->beta[t - t0];
    }
}

/* out = o_norm * o * rsqrt(mean(o^2) + eps) * sigmoid(g2), rows [t0, t1) of head h. */
static void finish_rows(const kda_run *run, int h, int t0, int t1, kda_ws *ws) {
    const em_kda_dims *d = run->d;
    const int D = d->head_dim;
    const size_t di = d_inner_of(d), ch0 = (size_t)h * (size_t)D;
    for (int t = t0; t < t1; t++) {
        const float *o = ws->O + (size_t)(t - t0) * (size_t)D;
        float ss;
        run->kern->dot2(o, NULL, o, D, &ss, NULL);
        const float rs = 1.0f / sqrtf(ss / (float)D + d->norm_eps);
        run->kern->norm_gate(run->out + (size_t)t * di + ch0, run->p->o_norm, o, rs,
                             run->g2 + (size_t)t * di + ch0, D);
    }
}

/* ==== recurrent form ==================================================================== */

/* Rows of transitions with strides: row t of k/v/g/q at t*ld, beta at t*ldb, o at t*ldo. */
typedef struct kda_rows {
    const float *q, *k, *v, *g, *beta; /* q NULL: no outputs */
    ptrdiff_t ld, ldb, ldo;
    float *o;
} kda_rows;

/* Feeds L >= 1 rows through the state one by one: read from src (== S allowed), the state
 * after the rows in S. buf: 7*D floats. */
static void recurrent_rows(const em_kda_kern *kern, const float *src, float *S, int D, int L,
                           const kda_rows *rw, float *buf) {
    float *a_cur = buf, *a_next = buf + D, *x = buf + 2 * D, *y = buf + 3 * D;
    float *u = buf + 4 * D, *w = buf + 5 * D, *delta = buf + 6 * D;
    const bool out = rw->q != NULL;
    kern->vexp(rw->g, a_cur, D);
    kern->mul(x, a_cur, rw->k, D);
    if (out) kern->mul(y, a_cur, rw->q, D);
    kern->sweep(S, src, D, NULL, NULL, NULL, x, out ? y : NULL, u, w); /* S not written */
    for (int t = 0; t < L; t++) {
        const float *k = rw->k + t * rw->ld, *v = rw->v + t * rw->ld;
        const float beta = rw->beta[t * rw->ldb];
        kern->delta(delta, beta, v, u, D);
        if (out) {
            float kq;
            kern->dot2(k, NULL, rw->q + t * rw->ld, D, &kq, NULL);
            kern->wxpy(rw->o + t * rw->ldo, w, kq, delta, D);
        }
        if (t + 1 < L) {
            const ptrdiff_t nx = (t + 1) * rw->ld;
            kern->vexp(rw->g + nx, a_next, D);
            kern->mul(x, a_next, rw->k + nx, D);
            if (out) kern->mul(y, a_next, rw->q + nx, D);
            kern->sweep(S, src, D, a_cur, k, delta, x, out ? y : NULL, u, w);
            src = S;
            float *sw = a_cur;
            a_cur = a_next;
            a_next = sw;
        } else {
            kern->sweep(S, src, D, a_cur, k, delta, NULL, NULL, NULL, NULL);
        }
    }
}

/* ==== chunked (WY/UT) form ============================================================== */

/* Intra-chunk matrices for sub-block rows [I0, I1): Am[i][j] = sum_d Q_i K_j P(j,i] (j <= i)
 * and Lm[i][j] = beta_i sum_d K_i K_j P(j,i] (j < i), where P(j,i] = prod_{j<s<=i} a_s is the
 * per-channel decay between rows j and i (ws->G holds a = exp(g) here). */
static void intra_block(const em_kda_kern *kern, kda_ws *ws, int D, int I0, int I1) {
    const int C = EM_KDA_CHUNK;
    const size_t dz = (size_t)D * sizeof(float);
    float *e = ws->rows, *ke = ws->rows + D;
    /* Diagonal block, pairwise: ke = K_j P(j,i] grows one factor per row i. */
    for (int j = I0; j < I1; j++) {
        const float *kj = ws->K + (size_t)j * D;
        float a_jj;
        kern->dot2(ws->Q + (size_t)j * D, NULL, kj, D, &a_jj, NULL);
        ws->Am[(size_t)j * C + j] = a_jj;
        memcpy(ke, kj, dz);
        for (int i = j + 1; i < I1; i++) {
            float a_ij, l_ij;
            kern->mul(ke, ke, ws->G + (size_t)i * D, D);
            kern->dot2(ws->Q + (size_t)i * D, ws->K + (size_t)i * D, ke, D, &a_ij, &l_ij);
            ws->Am[(size_t)i * C + j] = a_ij;
            ws->Lm[(size_t)i * C + j] = ws->beta[i] * l_ij;
        }
    }
    if (I0 == 0) return;
    /* Off-diagonal block against all rows j < I0, through the reference row n = I0:
     * P(j,i] = P(n,i] P(j,n], so it is one GEMM of (Q_i P(n,i]) and (K_j P(j,n])^T. */
    for (int i = I0; i < I1; i++) {
        float *qt = ws->Qt + (size_t)(i - I0) * D, *kt = ws->Kt + (size_t)(i - I0) * D;
        const float *qi = ws->Q + (size_t)i * D, *ki = ws->K + (size_t)i * D;
        if (i == I0) {
            for (int c = 0; c < D; c++) e[c] = 1.0f;
            memcpy(qt, qi, dz);
            memcpy(kt, ki, dz);
            continue;
        }
        kern->mul(e, e, ws->G + (size_t)i * D, D);
        kern->mul(qt, qi, e, D);
        kern->mul(kt, ki, e, D);
    }
    for (int c = 0; c < D; c++) e[c] = 1.0f;
    for (int j = I0 - 1; j >= 0; j--) {
        kern->mul(e, e, ws->G + (size_t)(j + 1) * D, D);
        kern->mul(ke, e, ws->K + (size_t)j * D, D);
        for (int c = 0; c < D; c++) ws->KbT[(size_t)c * C + j] = ke[c];
    }
    const int M = I1 - I0;
    kern->gemm(M, I0, D, 1.0f, ws->Qt, D, 1, ws->KbT, C, ws->Am + (size_t)I0 * C, C);
    kern->gemm(M, I0, D, 1.0f, ws->Kt, D, 1, ws->KbT, C, ws->Lm + (size_t)I0 * C, C);
    for (int i = I0; i < I1; i++) kern->scale(ws->Lm + (size_t)i * C, ws->beta[i], I0);
}

/* T = (I + Lm)^-1 (unit lower triangular) by forward substitution, a row at a time as one
 * vector-matrix product over the rows above: T[i][:i] = -Lm[i][:i] - Lm[i][:i] Ts[:i][:i],
 * where Ts is T without its unit diagonal (filled in at the end); zeros above. */
static void invert_unit_lower(const em_kda_kern *kern, kda_ws *ws, int L) {
    const int C = EM_KDA_CHUNK;
    for (int i = 0; i < L; i++) {
        float *ti = ws->T + (size_t)i * C;
        const float *li = ws->Lm + (size_t)i * C;
        for (int j = 0; j < i; j++) ti[j] = -li[j];
        for (int j = i; j < C; j++) ti[j] = 0.0f;
        if (i > 1) kern->gemm(1, i, i, -1.0f, li, C, 1, ws->T, C, ti, C);
    }
    for (int i = 0; i < L; i++) ws->T[(size_t)i * C + i] = 1.0f;
}

/* dst = T src for a unit lower-triangular T, block row by block row (only the columns
 * up to each block's end are non-zero). dst is overwritten. */
static void tri_apply(const em_kda_kern *kern, const kda_ws *ws, int D, int L, const float *src,
                      float *dst) {
    memset(dst, 0, (size_t)L * D * sizeof(float));
    for (int I0 = 0; I0 < L; I0 += KDA_SUB) {
        const int I1 = I0 + KDA_SUB < L ? I0 + KDA_SUB : L;
        kern->gemm(I1 - I0, D, I1, 1.0f, ws->T + (size_t)I0 * EM_KDA_CHUNK, EM_KDA_CHUNK, 1, src,
                   D, dst + (size_t)I0 * D, D);
    }
}

/* L (1..EM_KDA_CHUNK) rows prepared in ws through state S; outputs into ws->O. */
static void chunk_rows(const em_kda_kern *kern, kda_ws *ws, float *S, int D, int L) {
    const int C = EM_KDA_CHUNK;
    const size_t dz = (size_t)D * sizeof(float);
    /* a = exp(g) in place; EF[i] = prod_{s<=i} a_s, ER[j] = prod_{j<s<=L-1} a_s. */
    for (int i = 0; i < L; i++) kern->vexp(ws->G + (size_t)i * D, ws->G + (size_t)i * D, D);
    memcpy(ws->EF, ws->G, dz);
    for (int i = 1; i < L; i++)
        kern->mul(ws->EF + (size_t)i * D, ws->EF + (size_t)(i - 1) * D, ws->G + (size_t)i * D, D);
    for (int c = 0; c < D; c++) ws->ER[(size_t)(L - 1) * D + c] = 1.0f;
    for (int j = L - 2; j >= 0; j--)
        kern->mul(ws->ER + (size_t)j * D, ws->ER + (size_t)(j + 1) * D, ws->G + (size_t)(j + 1) * D, D);
    /* Am, Lm, then T = (I + Lm)^-1. */
    for (int i = 0; i < L; i++) {
        memset(ws->Am + (size_t)i * C, 0, (size_t)C * sizeof(float));
        memset(ws->Lm + (size_t)i * C, 0, (size_t)C * sizeof(float));
    }
    for (int I0 = 0; I0 < L; I0 += KDA_SUB)
        intra_block(kern, ws, D, I0, I0 + KDA_SUB < L ? I0 + KDA_SUB : L);
    invert_unit_lower(kern, ws, L);
    /* U = T (beta V); W = T (beta K e^c). ws->O and ws->KbT serve as the inputs. */
    for (int i = 0; i < L; i++) {
        float *vb = ws->O + (size_t)i * D, *kb = ws->KbT + (size_t)i * D;
        memcpy(vb, ws->V + (size_t)i * D, dz);
        kern->scale(vb, ws->beta[i], D);
        kern->mul(kb, ws->K + (size_t)i * D, ws->EF + (size_t)i * D, D);
        kern->scale(kb, ws->beta[i], D);
    }
    tri_apply(kern, ws, D, L, ws->O, ws->U);
    tri_apply(kern, ws, D, L, ws->KbT, ws->W);
    /* Delta = U - W S (the true per-row delta updates), in U. */
    kern->gemm(L, D, D, -1.0f, ws->W, D, 1, S, D, ws->U, D);
    /* O = (Q e^c) S + Am Delta; Q e^c goes into W (free now). */
    for (int i = 0; i < L; i++)
        kern->mul(ws->W + (size_t)i * D, ws->Q + (size_t)i * D, ws->EF + (size_t)i * D, D);
    memset(ws->O, 0, (size_t)L * dz);
    kern->gemm(L, D, D, 1.0f, ws->W, D, 1, S, D, ws->O, D);
    for (int I0 = 0; I0 < L; I0 += KDA_SUB) {
        const int I1 = I0 + KDA_SUB < L ? I0 + KDA_SUB : L;
        kern->gemm(I1 - I0, D, I1, 1.0f, ws->Am + (size_t)I0 * C, C, 1, ws->U, D,
                   ws->O + (size_t)I0 * D, D);
    }
    /* S = diag(e^c_last) S + (K e^(c_last - c))^T Delta. */
    const float *last = ws->EF + (size_t)(L - 1) * D;
    for (int r = 0; r < D; r++) kern->scale(S + (size_t)r * D, last[r], D);
    for (int i = 0; i < L; i++)
        kern->mul(ws->ER + (size_t)i * D, ws->ER + (size_t)i * D, ws->K + (size_t)i * D, D);
    kern->gemm(D, D, L, 1.0f, ws->ER, 1, D, ws->U, D, S, D);
}

/* ==== forward ============================================================================ */
/* Both forms process rows in blocks of EM_KDA_CHUNK; the recurrent form fuses each row's
 * update with the next row's read, so a block costs one pass over S per row plus one. */

/* Rows [t0, t1) of head h. Blocks run in order, all heads per block, so the rows a block
 * reads (qkv, f, g2: n x d_inner wide) stay in cache across heads. */
static void forward_head(void *ctx, int h, int thread) {
    const kda_run *run = ctx;
    kda_ws *ws = &run->ws[thread];
    const fpmode mode = fpmode_fast();
    const int D = run->d->head_dim, t0 = run->t0, t1 = run->t1, L = t1 - t0;
    const size_t hs = (size_t)h * (size_t)D * (size_t)D;
    float *S = run->S_out ? run->S_out + hs : run->S_heads ? run->S_heads + hs : ws->S;
    /* The first block reads the committed state; the recurrent form writes its first update
     * straight into the working copy, the chunked form starts from a copy. */
    const float *src = t0 == 0 ? run->S_in + hs : S;
    if (run->chunked && src != S) {
        memcpy(S, src, (size_t)D * (size_t)D * sizeof(float));
        src = S;
    }
    conv_taps(run, h, ws);
    prep_rows(run, h, t0, t1, ws);
    if (run->log) log_rows(run, h, t0, t1, ws);
    if (run->chunked) {
        chunk_rows(run->kern, ws, S, D, L);
    } else {
        kda_rows rw = { .q = ws->Q, .k = ws->K, .v = ws->V, .g = ws->G, .beta = ws->beta,
                        .ld = D, .ldb = 1, .ldo = D, .o = ws->O };
        recurrent_rows(run->kern, src, S, D, L, &rw, ws->rows);
    }
    finish_rows(run, h, t0, t1, ws);
    fpmode_restore(mode);
}

/* Moves the conv window forward over the first k rows (pre-conv q|k|v, row stride ld). */
static void window_advance(float *win, const em_kda_dims *d, const float *rows, size_t ld, int k) {
    const int W = d->d_conv - 1;
    const size_t di = d_inner_of(d), bytes = di * sizeof(float);
    if (W == 0 || k == 0) return;
    for (int m = 0; m < 3; m++) {
        for (int j = 0; j < W; j++) { /* ascending j: a shifted source row is always later */
            const int tau = k - W + j;
            float *dst = win + ((size_t)m * (size_t)W + (size_t)j) * di;
            const float *src = tau < 0 ? win + ((size_t)m * (size_t)W + (size_t)(tau + W)) * di
                                       : rows + (size_t)tau * ld + (size_t)m * di;
            memcpy(dst, src, bytes);
        }
    }
}

static int check_inputs(const char *fn, const em_kda_dims *d, const em_kda_params *p,
                        const em_kda_state *st, int n, const float *qkv, const float *f,
                        const float *b, const float *g2, const float *out, em_err *err) {
    int rc = em_kda_dims_check(d, err);
    if (rc) return em_err_prefix(err, "%s", fn);
    if (n < 0) return em_err_set(err, EM_EINVAL, "%s: n = %d rows", fn, n);
    if (!p || !p->conv_q || !p->conv_k || !p->conv_v || !p->ssm_a || !p->dt_bias || !p->o_norm)
        return em_err_set(err, EM_EINVAL, "%s: a KDA weight pointer is NULL", fn);
    if (!st || !st->S || (d->d_conv > 1 && !st->conv))
        return em_err_set(err, EM_EINVAL, "%s: state is NULL or not initialised", fn);
    if (n > 0 && (!qkv || !f || !b || !g2 || !out))
        return em_err_set(err, EM_EINVAL, "%s: an input or output row pointer is NULL", fn);
    return EM_OK;
}

static bool par_worth(const em_kda_dims *d, int rows) {
    return (size_t)rows * (size_t)d->head_dim * (size_t)d->head_dim >= KDA_PAR_WORK;
}

static int run_forward(kda_run *run, em_pool *pool, em_arena *scratch, const char *fn,
                       em_err *err) {
    const int nt = pool ? em_pool_threads(pool) : 1;
    const size_t per = ws_layout(run->d->head_dim, run->d->d_conv, NULL, NULL);
    /* several blocks and nowhere to keep each head's S between them: S_heads */
    const size_t heads_f = run->S_out || run->n <= EM_KDA_CHUNK ? 0 : s_floats(run->d);
    const size_t bytes = ((size_t)nt * per + heads_f) * sizeof(float);
    float *mem = NULL, *heap = NULL;
    if (scratch) {
        mem = em_arena_alloc(scratch, bytes);
        if (!mem)
            return em_err_set(err, EM_ENOMEM, "%s: scratch arena cannot give %zu bytes", fn, bytes);
    } else {
        mem = heap = em_aligned_alloc(64, bytes, "kda workspace", err);
        if (!mem) return EM_ENOMEM;
    }
    kda_ws wss[64], *ws = wss;
    if (nt > 64) {
        ws = em_malloc((size_t)nt * sizeof(*ws), "kda workspace table", err);
        if (!ws) {
            free(heap);
            return EM_ENOMEM;
        }
    }
    for (int i = 0; i < nt; i++)
        ws_layout(run->d->head_dim, run->d->d_conv, mem + (size_t)i * per, &ws[i]);
    run->ws = ws;
    run->S_heads = heads_f ? mem + (size_t)nt * per : NULL;
    run->chunked = run->d->chunk_min_rows > 0 && run->n >= run->d->chunk_min_rows;
    for (run->t0 = 0; run->t0 < run->n; run->t0 += EM_KDA_CHUNK) {
        run->t1 = run->t0 + EM_KDA_CHUNK < run->n ? run->t0 + EM_KDA_CHUNK : run->n;
        if (pool && par_worth(run->d, run->t1 - run->t0)) {
            em_pool_run(pool, run->d->n_head, forward_head, run);
        } else {
            for (int h = 0; h < run->d->n_head; h++) forward_head(run, h, 0);
        }
    }
    if (ws != wss) free(ws);
    free(heap);
    return EM_OK;
}

int em_kda_forward(const em_kda_dims *d, const em_kda_params *p, const em_kda_state *committed,
                   int n, const float *qkv_pre, const float *f_raw, const float *b_raw,
                   const float *g2, float *out, em_kda_log *log, em_pool *pool,
                   em_arena *scratch, em_err *err) {
    static const char fn[] = "kda forward";
    int rc = check_inputs(fn, d, p, committed, n, qkv_pre, f_raw, b_raw, g2, out, err);
    if (rc) return rc;
    if (log) {
        if (!dims_equal(&log->d, d))
            return em_err_set(err, EM_EINVAL, "%s: the log was created for other dims", fn);
        if (n > log->max_rows)
            return em_err_set(err, EM_EINVAL, "%s: %d rows exceed the log's max_rows %d", fn, n,
                              log->max_rows);
        log->n = 0;
        log->consumed = false;
    }
    if (n == 0) {
        if (log && log->S_final) memcpy(log->S_final, committed->S, s_floats(d) * sizeof(float));
        return EM_OK;
    }
    kda_run run = { .d = d, .p = p, .kern = kern_pick(), .win = committed->conv,
                    .S_in = committed->S, .S_out = log ? log->S_final : NULL, .n = n,
                    .qkv = qkv_pre, .f = f_raw, .b = b_raw, .g2 = g2, .out = out, .log = log };
    rc = run_forward(&run, pool, scratch, fn, err);
    if (rc) return rc;
    if (log) {
        memcpy(log->pre, qkv_pre, (size_t)n * 3 * d_inner_of(d) * sizeof(float));
        log->n = n;
    }
    return EM_OK;
}

int em_kda_forward_commit(const em_kda_dims *d, const em_kda_params *p, em_kda_state *st, int n,
                          const float *qkv_pre, const float *f_raw, const float *b_raw,
                          const float *g2, float *out, em_pool *pool, em_arena *scratch,
                          em_err *err) {
    static const char fn[] = "kda forward_commit";
    int rc = check_inputs(fn, d, p, st, n, qkv_pre, f_raw, b_raw, g2, out, err);
    if (rc || n == 0) return rc;
    kda_run run = { .d = d, .p = p, .kern = kern_pick(), .win = st->conv, .S_in = st->S,
                    .S_out = st->S, .n = n, .qkv = qkv_pre, .f = f_raw, .b = b_raw, .g2 = g2,
                    .out = out, .log = NULL };
    rc = run_forward(&run, pool, scratch, fn, err);
    if (rc) return rc;
    /* Heads read only their own window channels during the run; advance it afterwards. */
    window_advance(st->conv, d, qkv_pre, 3 * d_inner_of(d), n);
    return EM_OK;
}

/* ==== commit (ReplaySSM) ================================================================= */

typedef struct kda_replay {
    const em_kda_dims *d;
    const em_kda_kern *kern;
    const em_kda_log *log;
    float *S;
    int k;
} kda_replay;

static void replay_head(void *ctx, int h, int thread) {
    (void)thread;
    const kda_replay *rp = ctx;
    const int D = rp->d->head_dim;
    const size_t di = d_inner_of(rp->d), ch0 = (size_t)h * (size_t)D;
    const em_kda_log *l = rp->log;
    kda_rows rw = { .q = NULL, .k = l->k + ch0, .v = l->v + ch0, .g = l->g + ch0,
                    .beta = l->beta + h, .ld = (ptrdiff_t)di, .ldb = rp->d->n_head };
    const fpmode mode = fpmode_fast();
    recurrent_rows(rp->kern, rp->S + ch0 * (size_t)D, rp->S + ch0 * (size_t)D, D, rp->k, &rw,
                   l->hbuf + (size_t)h * 8 * (size_t)D);
    fpmode_restore(mode);
}

int em_kda_commit(const em_kda_dims *d, em_kda_state *st, em_kda_log *log, int k,
                  em_pool *pool, em_err *err) {
    int rc = em_kda_dims_check(d, err);
    if (rc) return em_err_prefix(err, "kda commit");
    if (!log) return em_err_set(err, EM_EINVAL, "kda commit: log is NULL");
    if (!st || !st->S || (d->d_conv > 1 && !st->conv))
        return em_err_set(err, EM_EINVAL, "kda commit: state is NULL or not initialised");
    if (!dims_equal(&log->d, d))
        return em_err_set(err, EM_EINVAL, "kda commit: the log was created for other dims");
    if (k < 0 || k > log->n)
        return em_err_set(err, EM_EINVAL, "kda commit: k = %d outside [0, %d] logged rows", k,
                          log->n);
    if (log->consumed)
        return em_err_set(err, EM_EINVAL, "kda commit: this log was already committed");
    log->consumed = true;
    if (k == 0) return EM_OK;
    window_advance(st->conv, d, log->pre, 3 * d_inner_of(d), k);
    if (k == log->n && log->S_final) { /* every row: the forward's final state, taken */
        if (!st->mem) {
            memcpy(st->S, log->S_final, s_floats(d) * sizeof(float));
            return EM_OK;
        }
        float *S = st->S;
        void *mem = st->mem;
        st->S = log->S_final;
        st->mem = log->S_final_mem;
        log->S_final = S;
        log->S_final_mem = mem;
        return EM_OK;
    }
    kda_replay rp = { .d = d, .kern = kern_pick(), .log = log, .S = st->S, .k = k };
    if (pool && par_worth(d, k)) {
        em_pool_run(pool, d->n_head, replay_head, &rp);
    } else {
        for (int h = 0; h < d->n_head; h++) replay_head(&rp, h, 0);
    }
    return EM_OK;
}
