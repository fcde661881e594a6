/* Dot products of weight rows with activation rows: the scalar reference kernels (the IQ
 * formats' in dot_iq.c), the
 * weight -> activation type pairing, and runtime ISA dispatch (cpuid, EMBER_ISA).
 *
 * The scalar kernels are written for clarity, element by element from the block fields:
 * each block's integer products are summed exactly in int32 and then scaled by d_w * d_a,
 * so they equal dequantize-then-f32-dot up to float rounding. The SIMD kernels
 * (dot_avx2.c, dot_avx512.c) must compute the same integer sums. Dispatch reads constant
 * tables only; the one piece of process state is what the CPU supports and the ISA choice,
 * computed once (pthread_once) from cpuid and EMBER_ISA and never changed afterwards. */
#include "quant/dot_kernels.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

static inline float h2f(uint16_t h) { return em_fp16_to_fp32(h); }

/* ---- float weights (f32 activations) ------------------------------------------------ */

#define AS_F32(v) (v)

/* sum_i w_i * a_i in index order, w_i converted with TO_F32. */
#define DOT_FLOAT(name, T, TO_F32)                                                \
    static float dot_##name##_scalar(const void *vw, const void *va, int64_t n) { \
        const T *w = vw;                                                          \
        const float *a = va;                                                      \
        float sum = 0.0f;                                                         \
        for (int64_t i = 0; i < n; i++) sum += TO_F32(w[i]) * a[i];               \
        return sum;                                                               \
    }

DOT_FLOAT(f32, float, AS_F32)
DOT_FLOAT(f16, uint16_t, h2f)
DOT_FLOAT(bf16, uint16_t, em_bf16_to_fp32)

#undef DOT_FLOAT
#undef AS_F32

/* ---- 32-value blocks with Q8_0 activations ------------------------------------------ */

/* Quant j (0..31) of a 4-bit block: low nibbles hold 0..15, high nibbles 16..31. */
static inline int nibble(const uint8_t *qs, int j) {
    return j < 16 ? qs[j] & 15 : qs[j - 16] >> 4;
}

/* Fifth bit of quant j of a 5-bit block (bit j of the little-endian qh word). */
static inline int fifth_bit(const uint8_t qh[4], int j) { return (qh[j / 8] >> (j % 8)) & 1; }

/* Quant j of each 32-value weight format, as the integer it stands for. */
static const int8_t mxfp4_values[16] = { EM_DOT_MXFP4_VALUES };

static inline int q8_0_quant(const em_block_q8_0 *x, int j) { return x->qs[j]; }
static inline int q4_0_quant(const em_block_q4_0 *x, int j) { return nibble(x->qs, j) - 8; }
static inline int q4_1_quant(const em_block_q4_1 *x, int j) { return nibble(x->qs, j); }
static inline int q5_0_quant(const em_block_q5_0 *x, int j) {
    return (nibble(x->qs, j) | (fifth_bit(x->qh, j) << 4)) - 16;
}
static inline int q5_1_quant(const em_block_q5_1 *x, int j) {
    return nibble(x->qs, j) | (fifth_bit(x->qh, j) << 4);
}
static inline int mxfp4_quant(const em_block_mxfp4 *x, int j) {
    return mxfp4_values[nibble(x->qs, j)];
}

/* The weight block's scale: an fp16 d, or MXFP4's e8m0 exponent. */
#define FP16_D(x) h2f((x)->d)
#define E8M0_E(x) em_dot_e8m0_half((x)->e)

/* Weights d*q: each block adds d_w * d_a * sum_j q_j a_j. */
#define DOT_SCALED_32(fmt, SCALE)                                                       \
    static float dot_##fmt##_scalar(const void *vw, const void *va, int64_t n) {        \
        const em_block_##fmt *w = vw;                                                   \
        const em_block_q8_0 *a = va;                                                    \
        float sum = 0.0f;                                                               \
        for (int64_t b = 0; b < n / QK8_0; b++) {                                       \
            int32_t isum = 0;                                                           \
            for (int j = 0; j < QK8_0; j++) isum += fmt##_quant(&w[b], j) * a[b].qs[j]; \
            sum += SCALE(&w[b]) * h2f(a[b].d) * (float)isum;                            \
        }                                                                               \
        return sum;                                                                     \
    }

/* Weights d*q + m: the m part multiplies the activation block's own sum. */
#define DOT_OFFSET_32(fmt)                                                          \
    static float dot_##fmt##_scalar(const void *vw, const void *va, int64_t n) {    \
        const em_block_##fmt *w = vw;                                               \
        const em_block_q8_0 *a = va;                                                \
        float sum = 0.0f;                                                           \
        for (int64_t b = 0; b < n / QK8_0; b++) {                                   \
            int32_t isum = 0, asum = 0;                                             \
            for (int j = 0; j < QK8_0; j++) {                                       \
                isum += fmt##_quant(&w[b], j) * a[b].qs[j];                         \
                asum += a[b].qs[j];                                                 \
            }                                                                       \
            const float da = h2f(a[b].d);                                           \
            sum += h2f(w[b].d) * da * (float)isum + h2f(w[b].m) * da * (float)asum; \
        }                                                                           \
        return sum;                                                                 \
    }

DOT_SCALED_32(q8_0, FP16_D)
DOT_SCALED_32(q4_0, FP16_D)
DOT_SCALED_32(q5_0, FP16_D)
DOT_SCALED_32(mxfp4, E8M0_E)
DOT_OFFSET_32(q4_1)
DOT_OFFSET_32(q5_1)

#undef DOT_OFFSET_32
#undef DOT_SCALED_32
#undef E8M0_E
#undef FP16_D

/* ---- 256-value super-blocks with Q8_K activations ------------------------------------ */

/* Value i (0..255) of a super-block is laid out in halves of 128 (h = i/128); within a half,
 * bit pair j = (i/32)%4 of byte l = i%32 (Q2_K, Q3_K); 16-value groups g = i/16 carry the
 * scales of Q2_K, Q3_K and Q6_K, 32-value sub-blocks s = i/32 those of Q4_K and Q5_K. */
static inline int crumb(const uint8_t *qs, int i) {
    return (qs[32 * (i / 128) + i % 32] >> (2 * ((i / 32) % 4))) & 3;
}

static float dot_q2_K_scalar(const void *vw, const void *va, int64_t n) {
    const em_block_q2_K *w = vw;
    const em_block_q8_K *a = va;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        int32_t isum = 0, msum = 0;
        for (int g = 0; g < 16; g++) {
            int32_t qsum = 0, asum = 0;
            for (int i = 16 * g; i < 16 * g + 16; i++) {
                qsum += crumb(w[b].qs, i) * a[b].qs[i];
                asum += a[b].qs[i];
            }
            isum += (w[b].scales[g] & 15) * qsum;
            msum += (w[b].scales[g] >> 4) * asum;
        }
        sum += a[b].d * (h2f(w[b].d) * (float)isum - h2f(w[b].dmin) * (float)msum);
    }
    return sum;
}

static float dot_q3_K_scalar(const void *vw, const void *va, int64_t n) {
    const em_block_q3_K *w = vw;
    const em_block_q8_K *a = va;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        int8_t sc[16];
        em_dot_q3k_scales(w[b].scales, sc);
        int32_t isum = 0;
        for (int g = 0; g < 16; g++) {
            int32_t qsum = 0;
            for (int i = 16 * g; i < 16 * g + 16; i++) {
                int high = (w[b].hmask[i % 32] >> (i / 32)) & 1; /* bit 4h+j == i/32 */
                qsum += (crumb(w[b].qs, i) - (high ? 0 : 4)) * a[b].qs[i];
            }
            isum += sc[g] * qsum;
        }
        sum += a[b].d * h2f(w[b].d) * (float)isum;
    }
    return sum;
}

/* Q4_K / Q5_K: value i is the low (sub-block s even) or high nibble of qs[32*(i/64) + i%32]. */
static inline int k_nibble(const uint8_t *qs, int i) {
    uint8_t byte = qs[32 * (i / 64) + i % 32];
    return (i / 32) % 2 ? byte >> 4 : byte & 15;
}

static inline int q4_K_quant(const em_block_q4_K *x, int i) { return k_nibble(x->qs, i); }
/* Q5_K's fifth bit of value i is bit s = i/32 of qh[i%32]. */
static inline int q5_K_quant(const em_block_q5_K *x, int i) {
    return k_nibble(x->qs, i) | (((x->qh[i % 32] >> (i / 32)) & 1) << 4);
}

/* Q4_K / Q5_K: 8 sub-blocks with 6-bit scale and min; y = d*sc*q - dmin*mn. */
#define DOT_K4(fmt)                                                                     \
    static float dot_##fmt##_scalar(const void *vw, const void *va, int64_t n) {        \
        const em_block_##fmt *w = vw;                                                   \
        const em_block_q8_K *a = va;                                                    \
        float sum = 0.0f;                                                               \
        for (int64_t b = 0; b < n / EM_QK_K; b++) {                                     \
            uint8_t sc[8], mn[8];                                                       \
            em_dot_k4_scales(w[b].scales, sc, mn);                                      \
            int32_t isum = 0, msum = 0;                                                 \
            for (int s = 0; s < 8; s++) {                                               \
                int32_t qsum = 0, asum = 0;                                             \
                for (int i = 32 * s; i < 32 * s + 32; i++) {                            \
                    qsum += fmt##_quant(&w[b], i) * a[b].qs[i];                         \
                    asum += a[b].qs[i];                                                 \
                }                                                                       \
                isum += sc[s] * qsum;                                                   \
                msum += mn[s] * asum;                                                   \
            }                                                                           \
            sum += a[b].d * (h2f(w[b].d) * (float)isum - h2f(w[b].dmin) * (float)msum); \
        }                                                                               \
        return sum;                                                                     \
    }

DOT_K4(q4_K)
DOT_K4(q5_K)

#undef DOT_K4

/* Q6_K value i: half h = i/128, quarter k = (i/32)%4, l = i%32. Low 4 bits from
 * ql[64h + 32(k%2) + l] (low nibble for k < 2, high for k >= 2), high 2 bits from
 * qh[32h + l] at bit 2k; minus 32. */
static inline int q6_value(const em_block_q6_K *x, int i) {
    int h = i / 128, k = (i / 32) % 4, l = i % 32;
    uint8_t lo = x->ql[64 * h + 32 * (k % 2) + l];
    int low = k < 2 ? lo & 15 : lo >> 4;
    int high = (x->qh[32 * h + l] >> (2 * k)) & 3;
    return (low | (high << 4)) - 32;
}

static float dot_q6_K_scalar(const void *vw, const void *va, int64_t n) {
    const em_block_q6_K *w = vw;
    const em_block_q8_K *a = va;
    float sum = 0.0f;
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        int32_t isum = 0;
        for (int g = 0; g < 16; g++) {
            int32_t qsum = 0;
            for (int i = 16 * g; i < 16 * g + 16; i++) qsum += q6_value(&w[b], i) * a[b].qs[i];
            isum += w[b].scales[g] * qsum;
        }
        sum += a[b].d * h2f(w[b].d) * (float)isum;
    }
    return sum;
}

static const em_dot_fn scalar_kernels[EM_TYPE_COUNT] = {
    [EM_TYPE_F32] = dot_f32_scalar,     [EM_TYPE_F16] = dot_f16_scalar,
    [EM_TYPE_BF16] = dot_bf16_scalar,   [EM_TYPE_Q8_0] = dot_q8_0_scalar,
    [EM_TYPE_Q4_0] = dot_q4_0_scalar,   [EM_TYPE_Q4_1] = dot_q4_1_scalar,
    [EM_TYPE_Q5_0] = dot_q5_0_scalar,   [EM_TYPE_Q5_1] = dot_q5_1_scalar,
    [EM_TYPE_MXFP4] = dot_mxfp4_scalar, [EM_TYPE_Q2_K] = dot_q2_K_scalar,
    [EM_TYPE_Q3_K] = dot_q3_K_scalar,   [EM_TYPE_Q4_K] = dot_q4_K_scalar,
    [EM_TYPE_Q5_K] = dot_q5_K_scalar,   [EM_TYPE_Q6_K] = dot_q6_K_scalar,
    [EM_TYPE_IQ2_XXS] = em_dot_iq2_xxs_scalar, [EM_TYPE_IQ2_XS] = em_dot_iq2_xs_scalar,
    [EM_TYPE_IQ2_S] = em_dot_iq2_s_scalar,     [EM_TYPE_IQ3_XXS] = em_dot_iq3_xxs_scalar,
    [EM_TYPE_IQ3_S] = em_dot_iq3_s_scalar,     [EM_TYPE_IQ1_S] = em_dot_iq1_s_scalar,
    [EM_TYPE_IQ1_M] = em_dot_iq1_m_scalar,     [EM_TYPE_IQ4_NL] = em_dot_iq4_nl_scalar,
    [EM_TYPE_IQ4_XS] = em_dot_iq4_xs_scalar,
};

/* ---- type pairing -------------------------------------------------------------------- */

int em_dot_act_type(int wtype) {
    switch (wtype) {
    case EM_TYPE_F32:
    case EM_TYPE_F16:
    case EM_TYPE_BF16: return EM_TYPE_F32;
    case EM_TYPE_Q8_0:
    case EM_TYPE_Q4_0:
    case EM_TYPE_Q4_1:
    case EM_TYPE_Q5_0:
    case EM_TYPE_Q5_1:
    case EM_TYPE_MXFP4:
    case EM_TYPE_IQ4_NL: return EM_TYPE_Q8_0;
    case EM_TYPE_IQ2_XXS:
    case EM_TYPE_IQ2_XS:
    case EM_TYPE_IQ2_S:
    case EM_TYPE_IQ3_XXS:
    case EM_TYPE_IQ3_S:
    case EM_TYPE_IQ1_S:
    case EM_TYPE_IQ1_M:
    case EM_TYPE_IQ4_XS:
    case EM_TYPE_Q2_K:
    case EM_TYPE_Q3_K:
    case EM_TYPE_Q4_K:
    case EM_TYPE_Q5_K:
    case EM_TYPE_Q6_K: return EM_TYPE_Q8_K;
    default: return -1;
    }
}

int em_dot_block_elems(int wtype) {
    switch (em_dot_act_type(wtype)) {
    case EM_TYPE_F32: return 1;
    case EM_TYPE_Q8_0: return QK8_0; /* every Q8_0 partner has 32-value blocks */
    case EM_TYPE_Q8_K: return EM_QK_K;
    default: return 0;
    }
}

/* ---- ISA detection and the default choice --------------------------------------------- */

static const char *const isa_names[EM_ISA_COUNT] = { "scalar", "avx2", "avx512" };

const char *em_isa_name(int isa) {
    return isa >= 0 && isa < EM_ISA_COUNT ? isa_names[isa] : "unknown";
}

int em_isa_from_name(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < EM_ISA_COUNT; i++)
        if (strcmp(name, isa_names[i]) == 0) return i;
    return -1;
}

/* What the CPU supports and which ISA dispatch uses: computed once per process (cpuid can
 * trap to the hypervisor in a VM, far too slow for every em_matvec call). */
typedef struct isa_facts {
    bool supported[EM_ISA_COUNT];
    int best, chosen;
} isa_facts;

static pthread_once_t facts_once = PTHREAD_ONCE_INIT;
static isa_facts facts; /* written once, under facts_once; read-only afterwards */

static void detect_support(bool supported[EM_ISA_COUNT]) {
    supported[EM_ISA_SCALAR] = true;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    __builtin_cpu_init();
    supported[EM_ISA_AVX2] = f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    supported[EM_ISA_AVX512] = supported[EM_ISA_AVX2] && __builtin_cpu_supports("avx512f") &&
                               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
#endif
}

static void compute_facts(void) {
    detect_support(facts.supported);
    facts.best = EM_ISA_SCALAR;
    for (int isa = EM_ISA_COUNT - 1; isa > EM_ISA_SCALAR; isa--)
        if (facts.supported[isa]) {
            facts.best = isa;
            break;
        }
    facts.chosen = facts.best;
    const char *env = getenv("EMBER_ISA");
    if (!env || !*env) return;
    int want = em_isa_from_name(env);
    if (want < 0)
        em_log(EM_LOG_WARN, "EMBER_ISA=%s is not scalar, avx2 or avx512; using %s", env, em_isa_name(facts.best));
    else if (!facts.supported[want])
        em_log(EM_LOG_WARN, "EMBER_ISA=%s: this CPU cannot run it; using %s", env, em_isa_name(facts.best));
    else
        facts.chosen = want;
}

static const isa_facts *get_facts(void) {
    pthread_once(&facts_once, compute_facts);
    return &facts;
}

bool em_isa_cpu_supports(int isa) {
    return isa >= 0 && isa < EM_ISA_COUNT && get_facts()->supported[isa];
}

int em_isa_cpu_best(void) { return get_facts()->best; }

int em_isa_default(void) { return get_facts()->chosen; }

/* ---- dispatch ------------------------------------------------------------------------- */

static const em_dot_fn *isa_table(int isa) {
    switch (isa) {
    case EM_ISA_AVX2: return em_dot_kernels_avx2;
    case EM_ISA_AVX512: return em_dot_kernels_avx512;
    default: return scalar_kernels;
    }
}

em_dot_fn em_dot_kernel(int wtype, int isa, int *used_isa) {
    if (wtype < 0 || wtype >= EM_TYPE_COUNT || !scalar_kernels[wtype]) return NULL;
    if (isa < 0 || isa >= EM_ISA_COUNT || !em_isa_cpu_supports(isa)) return NULL;
    for (int level = isa; level >= EM_ISA_SCALAR; level--) {
        em_dot_fn fn = isa_table(level)[wtype];
        if (fn) {
            if (used_isa) *used_isa = level;
            return fn;
        }
    }
    return NULL; /* unreachable: every type with a dot has a scalar kernel */
}

em_dot_fn em_dot_get(int wtype) { return em_dot_kernel(wtype, em_isa_default(), NULL); }

/* ---- checked entry points ------------------------------------------------------------- */

static int check_len(int wtype, int64_t n, em_err *err) {
    int blk = em_dot_block_elems(wtype);
    if (blk == 0)
        return em_err_set(err, EM_EUNSUPPORTED, "no dot product for weight type %s (%d)",
                          em_type_name(wtype), wtype);
    if (n < 0 || n % blk != 0)
        return em_err_set(err, EM_EINVAL, "dot of %s: length %lld is not a multiple of %d",
                          em_type_name(wtype), (long long)n, blk);
    return EM_OK;
}

int em_dot_act_bytes(int wtype, int64_t n, uint64_t *bytes, em_err *err) {
    int rc = check_len(wtype, n, err);
    if (rc) return rc;
    return em_type_row_bytes(em_dot_act_type(wtype), (uint64_t)n, bytes, err);
}

int em_dot_quantize_act(int wtype, const float *x, void *act, int64_t n, em_err *err) {
    int rc = check_len(wtype, n, err);
    if (rc) return rc;
    if (n > 0 && (!x || !act))
        return em_err_set(err, EM_EINVAL, "dot activations of %s: NULL buffer", em_type_name(wtype));
    int act_type = em_dot_act_type(wtype);
    if (act_type == EM_TYPE_F32) {
        if (n > 0 && act != (const void *)x) memmove(act, x, (size_t)n * sizeof(float));
        return EM_OK;
    }
    return em_quantize(act_type, x, act, n, err);
}

int em_dot(int wtype, const void *w, const void *act, int64_t n, float *out, em_err *err) {
    int rc = check_len(wtype, n, err);
    if (rc) return rc;
    if (!out || (n > 0 && (!w || !act)))
        return em_err_set(err, EM_EINVAL, "dot of %s: NULL argument", em_type_name(wtype));
    *out = em_dot_get(wtype)(w, act, n);
    return EM_OK;
}
