/* AVX2 (+FMA, F16C) dot-product kernels, one per weight type; em_dot_kernels_avx2 lists
 * them for dispatch (dot.c), which calls them only on CPUs that have AVX2, FMA and F16C.
 *
 * Integer work mirrors the scalar reference: per block (or 16/32-value group) the int8
 * products are summed in int16 pairs (maddubs: unsigned x signed, no saturation for the
 * value ranges here) and int32, then scaled in float by d_w * d_a. Offsets such as the -8 of
 * Q4_0 are applied either in the int8 values or through the activation block sums (Q8_K
 * bsums), which is the same integer. Only float rounding differs from the scalar kernels. */
#include "quant/dot_kernels.h"
#include "quant/simd.h"

#include <immintrin.h>
#include <string.h>

/* Fully unroll the short fixed loops below: gcc -O2 leaves them rolled and spills. */
#define UNROLL _Pragma("GCC unroll 8")

/* ---- helpers ---------------------------------------------------------------------------- */

static inline __m128i load128(const void *p) { return _mm_loadu_si128((const __m128i *)p); }

/* Sums of adjacent int16 pairs as int32. */
static inline __m256i pairs_to_i32(__m256i v) { return _mm256_madd_epi16(v, _mm256_set1_epi16(1)); }

/* 32 signed int8 x 32 signed int8 -> 8 int32 partial sums. |x| goes unsigned, x's sign moves
 * to y, so maddubs sees unsigned x signed (exact unless both are -128). */
static inline __m256i dot_i8(__m256i x, __m256i y) {
    const __m256i ax = _mm256_sign_epi8(x, x);
    const __m256i sy = _mm256_sign_epi8(y, x);
    return pairs_to_i32(_mm256_maddubs_epi16(ax, sy));
}

/* 32 unsigned int8 (< 128) x 32 signed int8 -> 8 int32 partial sums. */
static inline __m256i dot_u8(__m256i x, __m256i y) { return pairs_to_i32(_mm256_maddubs_epi16(x, y)); }

/* 16 bytes of a 32-value 4-bit block -> 32 bytes: low nibbles (quants 0..15), then high
 * nibbles (quants 16..31). */
static inline __m256i nibbles32(const uint8_t *qs) {
    const __m128i raw = load128(qs);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

/* 32 bits -> 32 bytes, byte k = 0xFF when bit k is set. */
static inline __m256i bits_to_bytes(const uint8_t qh[4]) {
    uint32_t bits;
    memcpy(&bits, qh, 4);
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* Sum of the 32 int8 of an activation block as 8 int32 partial sums. */
static inline __m256i sum_i8(__m256i y) { return dot_u8(_mm256_set1_epi8(1), y); }

/* ---- float weights ----------------------------------------------------------------------- */

static float dot_f32_avx2(const void *vw, const void *va, int64_t n) {
    const float *w = vw, *a = va;
    __m256 acc[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps() };
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        UNROLL
        for (int k = 0; k < 4; k++)
            acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8 * k), _mm256_loadu_ps(a + i + 8 * k), acc[k]);
    for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(a + i), acc[0]);
    float sum = em_hsum256_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) sum += w[i] * a[i];
    return sum;
}

static inline __m256 load_f16x8(const uint16_t *p) { return _mm256_cvtph_ps(load128(p)); }

static inline __m256 load_bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(p)), 16));
}

static float dot_f16_avx2(const void *vw, const void *va, int64_t n) {
    const uint16_t *w = vw;
    const float *a = va;
    __m256 acc[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps() };
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        UNROLL
        for (int k = 0; k < 4; k++)
            acc[k] = _mm256_fmadd_ps(load_f16x8(w + i + 8 * k), _mm256_loadu_ps(a + i + 8 * k), acc[k]);
    for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load_f16x8(w + i), _mm256_loadu_ps(a + i), acc[0]);
    float sum = em_hsum256_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) sum += em_h2f(w[i]) * a[i];
    return sum;
}

static float dot_bf16_avx2(const void *vw, const void *va, int64_t n) {
    const uint16_t *w = vw;
    const float *a = va;
    __m256 acc[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps() };
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        UNROLL
        for (int k = 0; k < 4; k++)
            acc[k] = _mm256_fmadd_ps(load_bf16x8(w + i + 8 * k), _mm256_loadu_ps(a + i + 8 * k), acc[k]);
    for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load_bf16x8(w + i), _mm256_loadu_ps(a + i), acc[0]);
    float sum = em_hsum256_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) sum += em_bf16_to_fp32(w[i]) * a[i];
    return sum;
}

/* ---- 32-value blocks, Q8_0 activations ------------------------------------------------------ */

/* The symmetric types differ only in how a block becomes 32 signed int8 and its scale; the
 * loop (two blocks per step, two accumulators) is shared through these inline decoders. */
static inline __m256i q8_0_quants(const em_block_q8_0 *b) { return em_load256(b->qs); }

static inline __m256i q4_0_quants(const em_block_q4_0 *b) {
    return _mm256_sub_epi8(nibbles32(b->qs), _mm256_set1_epi8(8));
}

/* q - 16 = nibble | 0xF0 when the fifth bit is clear, the nibble when it is set. */
static inline __m256i q5_0_quants(const em_block_q5_0 *b) {
    const __m256i high_clear = _mm256_andnot_si256(bits_to_bytes(b->qh), _mm256_set1_epi8((char)0xF0));
    return _mm256_or_si256(nibbles32(b->qs), high_clear);
}

static inline __m256i mxfp4_quants(const em_block_mxfp4 *b) {
    const __m256i table = _mm256_setr_epi8(EM_DOT_MXFP4_VALUES, EM_DOT_MXFP4_VALUES);
    return _mm256_shuffle_epi8(table, nibbles32(b->qs));
}

#define DEFINE_SYMMETRIC_DOT(name, block_t, quants, wscale)                                          \
    static float name(const void *vw, const void *va, int64_t n) {                                   \
        const block_t *w = vw;                                                                       \
        const em_block_q8_0 *a = va;                                                                 \
        const int64_t nb = n / 32;                                                                   \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                               \
        int64_t b = 0;                                                                               \
        for (; b + 2 <= nb; b += 2) {                                                                \
            const __m256i p0 = dot_i8(quants(&w[b]), em_load256(a[b].qs));                              \
            const __m256i p1 = dot_i8(quants(&w[b + 1]), em_load256(a[b + 1].qs));                      \
            const __m256 d0 = _mm256_set1_ps(wscale(w[b]) * em_h2f(a[b].d));                           \
            const __m256 d1 = _mm256_set1_ps(wscale(w[b + 1]) * em_h2f(a[b + 1].d));                   \
            acc0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(p0), acc0);                               \
            acc1 = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(p1), acc1);                               \
        }                                                                                            \
        if (b < nb) {                                                                                \
            const __m256i p0 = dot_i8(quants(&w[b]), em_load256(a[b].qs));                              \
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(wscale(w[b]) * em_h2f(a[b].d)),                      \
                                   _mm256_cvtepi32_ps(p0), acc0);                                    \
        }                                                                                            \
        return em_hsum256_ps(_mm256_add_ps(acc0, acc1));                                                   \
    }

#define FP16_SCALE(blk) em_h2f((blk).d)
#define E8M0_SCALE(blk) em_dot_e8m0_half((blk).e)

DEFINE_SYMMETRIC_DOT(dot_q8_0_avx2, em_block_q8_0, q8_0_quants, FP16_SCALE)
DEFINE_SYMMETRIC_DOT(dot_q4_0_avx2, em_block_q4_0, q4_0_quants, FP16_SCALE)
DEFINE_SYMMETRIC_DOT(dot_q5_0_avx2, em_block_q5_0, q5_0_quants, FP16_SCALE)
DEFINE_SYMMETRIC_DOT(dot_mxfp4_avx2, em_block_mxfp4, mxfp4_quants, E8M0_SCALE)

/* Q4_1 / Q5_1: unsigned quants, plus m times the activation block sum. */
static inline __m256i q4_1_quants(const em_block_q4_1 *b) { return nibbles32(b->qs); }

static inline __m256i q5_1_quants(const em_block_q5_1 *b) {
    const __m256i high = _mm256_and_si256(bits_to_bytes(b->qh), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(nibbles32(b->qs), high);
}

#define DEFINE_AFFINE_DOT(name, block_t, quants)                                                    \
    static float name(const void *vw, const void *va, int64_t n) {                                   \
        const block_t *w = vw;                                                                       \
        const em_block_q8_0 *a = va;                                                                 \
        __m256 acc_d = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();                             \
        for (int64_t b = 0; b < n / 32; b++) {                                                       \
            const __m256i y = em_load256(a[b].qs);                                                      \
            const float da = em_h2f(a[b].d);                                                            \
            acc_d = _mm256_fmadd_ps(_mm256_set1_ps(em_h2f(w[b].d) * da),                               \
                                    _mm256_cvtepi32_ps(dot_u8(quants(&w[b]), y)), acc_d);           \
            acc_m = _mm256_fmadd_ps(_mm256_set1_ps(em_h2f(w[b].m) * da),                               \
                                    _mm256_cvtepi32_ps(sum_i8(y)), acc_m);                          \
        }                                                                                            \
        return em_hsum256_ps(_mm256_add_ps(acc_d, acc_m));                                                 \
    }

DEFINE_AFFINE_DOT(dot_q4_1_avx2, em_block_q4_1, q4_1_quants)
DEFINE_AFFINE_DOT(dot_q5_1_avx2, em_block_q5_1, q5_1_quants)

/* ---- 256-value super-blocks, Q8_K activations ----------------------------------------------- */

/* Per-group int16 scales for the maddubs output of one 32-value chunk (16 values per 128-bit
 * lane): lane 0 needs the scale of group 2k, lane 1 that of group 2k+1. scales_lo holds the
 * int16 scales of groups 0..7 in both lanes, scales_hi those of groups 8..15; the selector
 * for pair k picks word 2k%8 in lane 0 and word (2k+1)%8 in lane 1. */
typedef struct group_scales {
    __m256i lo, hi; /* int16 scales of groups 0..7 / 8..15, in both 128-bit lanes */
} group_scales;

static inline group_scales spread_group_scales(__m128i sc8) {
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    return (group_scales){ _mm256_permute2x128_si256(sc16, sc16, 0x00), _mm256_permute2x128_si256(sc16, sc16, 0x11) };
}

/* shuffle_epi8 controls: pair_sel[j] picks int16 word 2j in lane 0 and 2j+1 in lane 1;
 * word_sel[j] picks word j in both lanes. Loaded from memory: building them from scalars
 * inside a loop the compiler does not unroll costs more than the work they steer. */
#define W2(w) (2 * (w)), (2 * (w) + 1)
#define W8(w) W2(w), W2(w), W2(w), W2(w), W2(w), W2(w), W2(w), W2(w)
static const uint8_t pair_sel[4][32] __attribute__((aligned(32))) = {
    { W8(0), W8(1) }, { W8(2), W8(3) }, { W8(4), W8(5) }, { W8(6), W8(7) },
};
static const uint8_t word_sel[8][32] __attribute__((aligned(32))) = {
    { W8(0), W8(0) }, { W8(1), W8(1) }, { W8(2), W8(2) }, { W8(3), W8(3) },
    { W8(4), W8(4) }, { W8(5), W8(5) }, { W8(6), W8(6) }, { W8(7), W8(7) },
};
#undef W8
#undef W2

/* Scales for the group pair (8h + 2j, 8h + 2j + 1): h selects groups 0..7 or 8..15. */
static inline __m256i scale_pair(const group_scales *g, int h, int j) {
    return _mm256_shuffle_epi8(h ? g->hi : g->lo, _mm256_load_si256((const __m256i *)pair_sel[j]));
}

/* int16 scale of sub-block j (of 8) in all 16 lanes; sc16 holds the 8 int16 scales in both
 * 128-bit lanes. */
static inline __m256i broadcast_word(__m256i sc16, int j) {
    return _mm256_shuffle_epi8(sc16, _mm256_load_si256((const __m256i *)word_sel[j]));
}

/* sum over the 16 groups of bsums[g] * c[g], as 8 int32 partial sums (c int8). */
static inline __m256i bsums_dot(const int16_t bsums[16], __m128i c8) {
    return _mm256_madd_epi16(em_load256(bsums), _mm256_cvtepi8_epi16(c8));
}

static float dot_q2_K_avx2(const void *vw, const void *va, int64_t n) {
    const em_block_q2_K *w = vw;
    const em_block_q8_K *a = va;
    const __m256i m3 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        const __m128i raw = load128(w[b].scales);
        const group_scales sc = spread_group_scales(_mm_and_si128(raw, _mm_set1_epi8(15)));
        const __m128i mn = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15));
        __m256i isum = _mm256_setzero_si256();
        UNROLL
        for (int h = 0; h < 2; h++) {
            const __m256i q = em_load256(w[b].qs + 32 * h);
            UNROLL
            for (int j = 0; j < 4; j++) {
                const __m256i v = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
                const __m256i p = _mm256_maddubs_epi16(v, em_load256(a[b].qs + 128 * h + 32 * j));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scale_pair(&sc, h, j)));
            }
        }
        const __m256i msum = bsums_dot(a[b].bsums, mn);
        const __m256 dd = _mm256_set1_ps(a[b].d * em_h2f(w[b].d));
        const __m256 dm = _mm256_set1_ps(-a[b].d * em_h2f(w[b].dmin));
        acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum), acc);
        acc = _mm256_fmadd_ps(dm, _mm256_cvtepi32_ps(msum), acc);
    }
    return em_hsum256_ps(acc);
}

/* Q3_K: quants are crumb + 4*highbit (0..7) here; the -4 comes back as 4 * bsums. */
static float dot_q3_K_avx2(const void *vw, const void *va, int64_t n) {
    const em_block_q3_K *w = vw;
    const em_block_q8_K *a = va;
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        uint32_t sw[4];
        em_dot_q3k_scales_packed(w[b].scales, sw);
        const __m128i sc8 = _mm_sub_epi8(_mm_setr_epi32((int)sw[0], (int)sw[1], (int)sw[2], (int)sw[3]),
                                         _mm_set1_epi8(32));
        const group_scales sc = spread_group_scales(sc8);
        __m256i hbits = em_load256(w[b].hmask); /* bit i/32 of byte i%32: high bit of value i */
        __m256i isum = _mm256_setzero_si256();
        UNROLL
        for (int h = 0; h < 2; h++) {
            const __m256i q = em_load256(w[b].qs + 32 * h);
            UNROLL
            for (int j = 0; j < 4; j++) {
                const __m256i crumbs = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
                const __m256i high = _mm256_slli_epi16(_mm256_and_si256(hbits, one), 2);
                hbits = _mm256_srli_epi16(hbits, 1);
                const __m256i v = _mm256_or_si256(crumbs, high);
                const __m256i p = _mm256_maddubs_epi16(v, em_load256(a[b].qs + 128 * h + 32 * j));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scale_pair(&sc, h, j)));
            }
        }
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(bsums_dot(a[b].bsums, sc8), 2));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(a[b].d * em_h2f(w[b].d)), _mm256_cvtepi32_ps(isum), acc);
    }
    return em_hsum256_ps(acc);
}

/* Q4_K / Q5_K: 8 sub-blocks of 32 with a 6-bit scale and a 6-bit min each. The mins meet
 * the activation sums of their sub-block (two bsums each). */
static inline __m256i k4_min_sum(const int16_t bsums[16], uint64_t mn) {
    const __m128i m8 = _mm_cvtsi64_si128((long long)mn);
    const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)); /* m0 m0 m1 m1 ... */
    return _mm256_madd_epi16(em_load256(bsums), m16);
}

/* The 8 sub-block scales as int16 in both 128-bit lanes. */
static inline __m256i k4_scales16(uint64_t sc) {
    return _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc)));
}

static float dot_q4_K_avx2(const void *vw, const void *va, int64_t n) {
    const em_block_q4_K *w = vw;
    const em_block_q8_K *a = va;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        uint64_t sc, mn;
        em_dot_k4_scales_packed(w[b].scales, &sc, &mn);
        const __m256i sc16 = k4_scales16(sc);
        __m256i isum = _mm256_setzero_si256();
        UNROLL
        for (int c = 0; c < 4; c++) {
            const __m256i q = em_load256(w[b].qs + 32 * c);
            const __m256i lo = _mm256_and_si256(q, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            const __m256i plo = _mm256_maddubs_epi16(lo, em_load256(a[b].qs + 64 * c));
            const __m256i phi = _mm256_maddubs_epi16(hi, em_load256(a[b].qs + 64 * c + 32));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(plo, broadcast_word(sc16, 2 * c)));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(phi, broadcast_word(sc16, 2 * c + 1)));
        }
        const __m256 dd = _mm256_set1_ps(a[b].d * em_h2f(w[b].d));
        const __m256 dm = _mm256_set1_ps(-a[b].d * em_h2f(w[b].dmin));
        acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum), acc);
        acc = _mm256_fmadd_ps(dm, _mm256_cvtepi32_ps(k4_min_sum(a[b].bsums, mn)), acc);
    }
    return em_hsum256_ps(acc);
}

static float dot_q5_K_avx2(const void *vw, const void *va, int64_t n) {
    const em_block_q5_K *w = vw;
    const em_block_q8_K *a = va;
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        uint64_t sc, mn;
        em_dot_k4_scales_packed(w[b].scales, &sc, &mn);
        const __m256i sc16 = k4_scales16(sc);
        __m256i hbits = em_load256(w[b].qh); /* bit s of byte l: fifth bit of sub-block s */
        __m256i isum = _mm256_setzero_si256();
        UNROLL
        for (int c = 0; c < 4; c++) {
            const __m256i q = em_load256(w[b].qs + 32 * c);
            const __m256i hlo = _mm256_slli_epi16(_mm256_and_si256(hbits, one), 4);
            const __m256i hhi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 1), one), 4);
            hbits = _mm256_srli_epi16(hbits, 2);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), hlo);
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), hhi);
            const __m256i plo = _mm256_maddubs_epi16(lo, em_load256(a[b].qs + 64 * c));
            const __m256i phi = _mm256_maddubs_epi16(hi, em_load256(a[b].qs + 64 * c + 32));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(plo, broadcast_word(sc16, 2 * c)));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(phi, broadcast_word(sc16, 2 * c + 1)));
        }
        const __m256 dd = _mm256_set1_ps(a[b].d * em_h2f(w[b].d));
        const __m256 dm = _mm256_set1_ps(-a[b].d * em_h2f(w[b].dmin));
        acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(isum), acc);
        acc = _mm256_fmadd_ps(dm, _mm256_cvtepi32_ps(k4_min_sum(a[b].bsums, mn)), acc);
    }
    return em_hsum256_ps(acc);
}

/* Q6_K: quants are 0..63 here; the -32 comes back as 32 * sum of scale * bsums. */
static float dot_q6_K_avx2(const void *vw, const void *va, int64_t n) {
    const em_block_q6_K *w = vw;
    const em_block_q8_K *a = va;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        const __m128i sc8 = load128(w[b].scales);
        const group_scales sc = spread_group_scales(sc8);
        __m256i isum = _mm256_setzero_si256();
        UNROLL
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = em_load256(w[b].ql + 64 * h);
            const __m256i l1 = em_load256(w[b].ql + 64 * h + 32);
            const __m256i qh = em_load256(w[b].qh + 32 * h);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C)), 2));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_and_si256(qh, _mm256_set1_epi8(0x30)));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8((char)0xC0)), 2));
            UNROLL
            for (int k = 0; k < 4; k++) {
                const __m256i p = _mm256_maddubs_epi16(q[k], em_load256(a[b].qs + 128 * h + 32 * k));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scale_pair(&sc, h, k)));
            }
        }
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(bsums_dot(a[b].bsums, sc8), 5));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(a[b].d * em_h2f(w[b].d)), _mm256_cvtepi32_ps(isum), acc);
    }
    return em_hsum256_ps(acc);
}

const em_dot_fn em_dot_kernels_avx2[EM_TYPE_COUNT] = {
    [EM_TYPE_F32] = dot_f32_avx2,     [EM_TYPE_F16] = dot_f16_avx2,
    [EM_TYPE_BF16] = dot_bf16_avx2,   [EM_TYPE_Q8_0] = dot_q8_0_avx2,
    [EM_TYPE_Q4_0] = dot_q4_0_avx2,   [EM_TYPE_Q4_1] = dot_q4_1_avx2,
    [EM_TYPE_Q5_0] = dot_q5_0_avx2,   [EM_TYPE_Q5_1] = dot_q5_1_avx2,
    [EM_TYPE_MXFP4] = dot_mxfp4_avx2, [EM_TYPE_Q2_K] = dot_q2_K_avx2,
    [EM_TYPE_Q3_K] = dot_q3_K_avx2,   [EM_TYPE_Q4_K] = dot_q4_K_avx2,
    [EM_TYPE_Q5_K] = dot_q5_K_avx2,   [EM_TYPE_Q6_K] = dot_q6_K_avx2,
    /* the IQ formats: dot_iq_avx2.c */
    [EM_TYPE_IQ2_XXS] = em_dot_iq2_xxs_avx2, [EM_TYPE_IQ2_XS] = em_dot_iq2_xs_avx2,
    [EM_TYPE_IQ2_S] = em_dot_iq2_s_avx2,     [EM_TYPE_IQ3_XXS] = em_dot_iq3_xxs_avx2,
    [EM_TYPE_IQ3_S] = em_dot_iq3_s_avx2,     [EM_TYPE_IQ1_S] = em_dot_iq1_s_avx2,
    [EM_TYPE_IQ1_M] = em_dot_iq1_m_avx2,     [EM_TYPE_IQ4_NL] = em_dot_iq4_nl_avx2,
    [EM_TYPE_IQ4_XS] = em_dot_iq4_xs_avx2,
};
