/* AVX-512 (F/BW/VL/DQ + VNNI) dot-product kernels for every weight type with a dot: F32, F16,
 * BF16, the 32-value block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4) and Q2_K..Q6_K (IQ1_M's and
 * IQ4_XS's are in dot_iq_avx512.c; the other IQ types use their AVX2 kernels).
 * em_dot_kernels_avx512 lists them; a type without an entry would fall back to AVX2 in
 * dispatch (dot.c), which calls this file only on CPUs with all of those extensions (and so
 * with AVX2: block tails here reuse the AVX2 kernels).
 *
 * Integer sums are exactly the scalar reference's: VNNI dpbusd (unsigned x signed int8,
 * four products into int32, no intermediate saturation) or maddubs + dpwssd (int16 pairs
 * times int16 scales into int32). Only float rounding differs. */
#include "quant/dot_kernels.h"
#include "quant/simd.h"

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

/* Fully unroll the short fixed loops below: gcc -O2 leaves them rolled and spills. */
#define UNROLL _Pragma("GCC unroll 8")


/* ---- float weights: 64 values per step in four accumulators, masked tail ------------------ */

static inline __m512 load_f16x16(const uint16_t *p) { return _mm512_cvtph_ps(em_load256(p)); }
static inline __m512 load_bf16x16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(em_load256(p)), 16));
}
static inline __m512 load_f16x16_tail(const uint16_t *p, int k) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((__mmask16)((1u << k) - 1), p));
}
static inline __m512 load_bf16x16_tail(const uint16_t *p, int k) {
    const __m256i raw = _mm256_maskz_loadu_epi16((__mmask16)((1u << k) - 1), p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

#define DEFINE_FLOAT_DOT(name, wtype_t, load16, load16_tail)                                        \
    static float name(const void *vw, const void *va, int64_t n) {                                   \
        const wtype_t *w = vw;                                                                       \
        const float *a = va;                                                                         \
        __m512 acc[4] = { _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),             \
                          _mm512_setzero_ps() };                                                     \
        int64_t i = 0;                                                                               \
        for (; i + 64 <= n; i += 64)                                                                 \
            UNROLL                                                                                   \
            for (int k = 0; k < 4; k++)                                                              \
                acc[k] = _mm512_fmadd_ps(load16(w + i + 16 * k), _mm512_loadu_ps(a + i + 16 * k),    \
                                         acc[k]);                                                    \
        for (; i + 16 <= n; i += 16)                                                                 \
            acc[0] = _mm512_fmadd_ps(load16(w + i), _mm512_loadu_ps(a + i), acc[0]);                 \
        if (i < n) {                                                                                 \
            const int k = (int)(n - i);                                                              \
            const __m512 av = _mm512_maskz_loadu_ps((__mmask16)((1u << k) - 1), a + i);              \
            acc[1] = _mm512_fmadd_ps(load16_tail(w + i, k), av, acc[1]);                             \
        }                                                                                            \
        return em_hsum512_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]))); \
    }

static inline __m512 load_f32x16(const float *p) { return _mm512_loadu_ps(p); }
static inline __m512 load_f32x16_tail(const float *p, int k) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << k) - 1), p);
}

DEFINE_FLOAT_DOT(dot_f32_avx512, float, load_f32x16, load_f32x16_tail)
DEFINE_FLOAT_DOT(dot_f16_avx512, uint16_t, load_f16x16, load_f16x16_tail)
DEFINE_FLOAT_DOT(dot_bf16_avx512, uint16_t, load_bf16x16, load_bf16x16_tail)

/* ---- 32-value blocks with Q8_0 activations: four blocks per step ----------------------------
 * Two blocks share a 512-bit register (bytes 0..31 block b, 32..63 block b+1). Every weight
 * type is brought to unsigned quants u = q + off (Q8_0: q ^ 0x80 = q + 128; Q4_0: the nibble
 * = q + 8; Q5_0: q + 16; MXFP4: a shifted code table, q + 12), so
 *     sum q*y = dpbusd(u, y) - dpbusd(off, y),
 * both exact in int32. The affine types (Q4_1, Q5_1) use u directly and add m * sum(y). The
 * per-block scales of four blocks are converted together and spread to the int32 lanes. A
 * tail of fewer than four blocks goes to the AVX2 kernel. */

static inline __m512i join256(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

static inline __m512i act_pair(const em_block_q8_0 *a) { return join256(em_load256(a[0].qs), em_load256(a[1].qs)); }

/* The packed nibbles of two blocks -> 64 bytes: each block's low nibbles (quants 0..15) then
 * its high nibbles (quants 16..31). */
static inline __m512i nibbles_pair(const uint8_t *q0, const uint8_t *q1) {
    const __m256i packed = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)q1), _mm_loadu_si128((const __m128i *)q0));
    const __m256i high = _mm256_srli_epi16(packed, 4);
    const __m512i order = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    const __m512i all = _mm512_permutex2var_epi64(_mm512_castsi256_si512(packed), order, _mm512_castsi256_si512(high));
    return _mm512_and_si512(all, _mm512_set1_epi8(0x0F));
}

/* 0x10 in every byte whose fifth bit (qh) is set, for two 5-bit blocks. */
static inline __m512i fifth_bits_pair(const uint8_t qh0[4], const uint8_t qh1[4]) {
    uint32_t h0, h1;
    memcpy(&h0, qh0, 4);
    memcpy(&h1, qh1, 4);
    return _mm512_maskz_mov_epi8((__mmask64)h0 | (__mmask64)h1 << 32, _mm512_set1_epi8(0x10));
}

static inline __m512i u_q8_0(const em_block_q8_0 *w) {
    return _mm512_xor_si512(join256(em_load256(w[0].qs), em_load256(w[1].qs)), _mm512_set1_epi8((char)0x80));
}
static inline __m512i u_q4_0(const em_block_q4_0 *w) { return nibbles_pair(w[0].qs, w[1].qs); }
static inline __m512i u_q4_1(const em_block_q4_1 *w) { return nibbles_pair(w[0].qs, w[1].qs); }
static inline __m512i u_q5_0(const em_block_q5_0 *w) {
    return _mm512_or_si512(nibbles_pair(w[0].qs, w[1].qs), fifth_bits_pair(w[0].qh, w[1].qh));
}
static inline __m512i u_q5_1(const em_block_q5_1 *w) {
    return _mm512_or_si512(nibbles_pair(w[0].qs, w[1].qs), fifth_bits_pair(w[0].qh, w[1].qh));
}
static inline __m512i u_mxfp4(const em_block_mxfp4 *w) {
    /* the MXFP4 code points plus 12: all in 0..24 */
#define MXFP4_U 12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0
    const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(MXFP4_U));
#undef MXFP4_U
    return _mm512_shuffle_epi8(table, nibbles_pair(w[0].qs, w[1].qs));
}

/* An fp16 field at byte offset `off` of four consecutive blocks of `bs` bytes (bs and off
 * even, off + 2 <= bs, 18 <= bs <= 62), as four floats. Two 64-byte loads that stay inside
 * the four blocks and one word permute replace four scalar loads and conversions: the low
 * window [0, 64) holds the fields of blocks 0 and 1 (and any others that fit), the high
 * window starts at block 2's field, or earlier if that would reach past the four blocks;
 * either way it holds the fields of blocks 2 and 3. bs and off are constants at every call,
 * so the indices fold. */
/* A 64-byte load whose address the compiler cannot relate to other loads (the empty asm
 * "changes" the pointer). Without it clang forwards these scale windows into the later,
 * overlapping loads of the quants and extracts the quants with 64-bit shifts through general
 * registers, at a third of the speed. */
static inline __m512i load512_opaque(const void *p) {
    __asm__("" : "+r"(p));
    return em_load512(p);
}

static inline int high_window(int bs, int off) { return 2 * bs + off < 4 * bs - 64 ? 2 * bs + off : 4 * bs - 64; }

static inline int field_word(int bs, int off, int k) {
    const int at = k * bs + off;
    return at + 2 <= 64 ? at / 2 : 32 + (at - high_window(bs, off)) / 2;
}

static inline __m128 fp16_field4(const void *blocks, int bs, int off) {
    const uint8_t *p = blocks;
    const __m512i idx = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                         0, 0, 0, 0, (short)field_word(bs, off, 3), (short)field_word(bs, off, 2),
                                         (short)field_word(bs, off, 1), (short)field_word(bs, off, 0));
    /* one window when it holds all four (the two-source permute would otherwise take some
     * unrelated register as its unused source, and wait for it) */
    const __m512i words = 3 * bs + off + 2 <= 64
                              ? _mm512_permutexvar_epi16(idx, load512_opaque(p))
                              : _mm512_permutex2var_epi16(load512_opaque(p), idx, load512_opaque(p + high_window(bs, off)));
    return _mm_cvtph_ps(_mm512_castsi512_si128(words));
}

/* d_a of four activation blocks. */
static inline __m128 act_scales4(const em_block_q8_0 *a) {
    return fp16_field4(a, (int)sizeof *a, (int)offsetof(em_block_q8_0, d));
}

/* d (or m) of four weight blocks of a type with fp16 fields; E8M0 exponents for MXFP4. d is
 * the first field of every such block and m (Q4_1, Q5_1) the second. */
_Static_assert(offsetof(em_block_q4_0, d) == 0 && offsetof(em_block_q5_0, d) == 0 &&
                   offsetof(em_block_q8_0, d) == 0 && offsetof(em_block_q4_1, d) == 0 &&
                   offsetof(em_block_q5_1, d) == 0, "d leads the block");
_Static_assert(offsetof(em_block_q4_1, m) == 2 && offsetof(em_block_q5_1, m) == 2, "m follows d");
#define D4(w) fp16_field4((w), (int)sizeof *(w), 0)
#define M4(w) fp16_field4((w), (int)sizeof *(w), 2)

/* em_dot_e8m0_half of four MXFP4 blocks' exponent bytes (offsets 0, 17, 34, 51: one 64-byte
 * load inside the 68 bytes of the four blocks; odd offsets are the high byte of a word). */
static inline __m128 e8m0_half4(const em_block_mxfp4 *w) {
    const __m512i idx = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                         0, 0, 0, 0, 51 / 2, 34 / 2, 17 / 2, 0);
    const __m128i words = _mm512_castsi512_si128(_mm512_permutexvar_epi16(idx, load512_opaque(w)));
    const __m128i bytes = _mm_srlv_epi16(words, _mm_setr_epi16(0, 8, 0, 8, 0, 0, 0, 0));
    const __m128i e = _mm_cvtepu16_epi32(_mm_and_si128(bytes, _mm_set1_epi16(0xFF)));
    const __m128i normal = _mm_slli_epi32(_mm_sub_epi32(e, _mm_set1_epi32(1)), 23); /* 2^(e-128) */
    const __m128i tiny = _mm_sllv_epi32(_mm_set1_epi32(0x00200000), e);            /* e = 0, 1 */
    return _mm_castsi128_ps(_mm_mask_blend_epi32(_mm_cmpgt_epi32_mask(e, _mm_set1_epi32(1)), tiny, normal));
}
_Static_assert(sizeof(em_block_mxfp4) == 17 && offsetof(em_block_mxfp4, e) == 0, "mxfp4 layout");
#define E8M0_4(w) e8m0_half4(w)

/* Lanes 0..7 get s[first], lanes 8..15 s[first+1]. */
static inline __m512 spread_pair(__m128 s, int first) {
    const __m512i idx = _mm512_set_epi32(first + 1, first + 1, first + 1, first + 1, first + 1, first + 1, first + 1,
                                         first + 1, first, first, first, first, first, first, first, first);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(s));
}

/* sum (u - off) * y per 4-value group, exact. */
static inline __m512i offset_dot(__m512i u, __m512i y, __m512i off) {
    const __m512i zero = _mm512_setzero_si512();
    return _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, u, y), _mm512_dpbusd_epi32(zero, off, y));
}

#define DEFINE_OFFSET_DOT(name, block_t, quants, offset, wscale4, tail_type)                      \
    static float name(const void *vw, const void *va, int64_t n) {                                \
        const block_t *w = vw;                                                                    \
        const em_block_q8_0 *a = va;                                                              \
        const int64_t nb = n / 32;                                                                \
        const __m512i off = _mm512_set1_epi8((char)(offset));                                     \
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();                            \
        int64_t b = 0;                                                                            \
        for (; b + 4 <= nb; b += 4) {                                                             \
            const __m128 s = _mm_mul_ps(wscale4(w + b), act_scales4(a + b));                      \
            const __m512i p0 = offset_dot(quants(w + b), act_pair(a + b), off);                   \
            const __m512i p1 = offset_dot(quants(w + b + 2), act_pair(a + b + 2), off);           \
            acc0 = _mm512_fmadd_ps(spread_pair(s, 0), _mm512_cvtepi32_ps(p0), acc0);              \
            acc1 = _mm512_fmadd_ps(spread_pair(s, 2), _mm512_cvtepi32_ps(p1), acc1);              \
        }                                                                                         \
        float sum = em_hsum512_ps(_mm512_add_ps(acc0, acc1));                                        \
        if (b < nb) sum += em_dot_kernels_avx2[tail_type](w + b, a + b, (nb - b) * 32);           \
        return sum;                                                                               \
    }

DEFINE_OFFSET_DOT(dot_q8_0_avx512, em_block_q8_0, u_q8_0, 0x80, D4, EM_TYPE_Q8_0)
DEFINE_OFFSET_DOT(dot_q4_0_avx512, em_block_q4_0, u_q4_0, 8, D4, EM_TYPE_Q4_0)
DEFINE_OFFSET_DOT(dot_q5_0_avx512, em_block_q5_0, u_q5_0, 16, D4, EM_TYPE_Q5_0)
DEFINE_OFFSET_DOT(dot_mxfp4_avx512, em_block_mxfp4, u_mxfp4, 12, E8M0_4, EM_TYPE_MXFP4)

/* Q4_1 / Q5_1: d_w d_a sum(u y) + m_w d_a sum(y). */
#define DEFINE_AFFINE_DOT(name, block_t, quants, tail_type)                                       \
    static float name(const void *vw, const void *va, int64_t n) {                                \
        const block_t *w = vw;                                                                    \
        const em_block_q8_0 *a = va;                                                              \
        const int64_t nb = n / 32;                                                                \
        const __m512i zero = _mm512_setzero_si512(), ones = _mm512_set1_epi8(1);                  \
        __m512 acc_d = _mm512_setzero_ps(), acc_m = _mm512_setzero_ps();                          \
        int64_t b = 0;                                                                            \
        for (; b + 4 <= nb; b += 4) {                                                             \
            const __m128 da = act_scales4(a + b);                                                 \
            const __m128 sd = _mm_mul_ps(D4(w + b), da), sm = _mm_mul_ps(M4(w + b), da);          \
            UNROLL                                                                                \
            for (int k = 0; k < 4; k += 2) {                                                      \
                const __m512i y = act_pair(a + b + k);                                            \
                const __m512i qy = _mm512_dpbusd_epi32(zero, quants(w + b + k), y);               \
                const __m512i sy = _mm512_dpbusd_epi32(zero, ones, y);                            \
                acc_d = _mm512_fmadd_ps(spread_pair(sd, k), _mm512_cvtepi32_ps(qy), acc_d);       \
                acc_m = _mm512_fmadd_ps(spread_pair(sm, k), _mm512_cvtepi32_ps(sy), acc_m);       \
            }                                                                                     \
        }                                                                                         \
        float sum = em_hsum512_ps(_mm512_add_ps(acc_d, acc_m));                                      \
        if (b < nb) sum += em_dot_kernels_avx2[tail_type](w + b, a + b, (nb - b) * 32);           \
        return sum;                                                                               \
    }

DEFINE_AFFINE_DOT(dot_q4_1_avx512, em_block_q4_1, u_q4_1, EM_TYPE_Q4_1)
DEFINE_AFFINE_DOT(dot_q5_1_avx512, em_block_q5_1, u_q5_1, EM_TYPE_Q5_1)

/* ---- K-quants with Q8_K activations --------------------------------------------------------- */

/* The int16 scale for each of the 32 int16 lanes of a maddubs result: lane i gets
 * scales16[idx[i]] (the low 16 lanes of scales16 hold the block's group or sub-block scales;
 * idx says which group each lane's values belong to). */
static inline __m512i spread_scales(__m512i scales16, __m512i idx) {
    return _mm512_permutexvar_epi16(idx, scales16);
}

static float dot_q4_K_avx512(const void *vw, const void *va, int64_t n) {
    const em_block_q4_K *w = vw;
    const em_block_q8_K *a = va;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* maddubs output of a 64-value register covering sub-blocks (s, s+1): int16 lanes 0..15
     * belong to s, 16..31 to s+1. */
    const __m512i idx0 = _mm512_set_epi16(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                          0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i two = _mm512_set1_epi16(2);
    __m512 acc = _mm512_setzero_ps();
    __m256 acc_min = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        uint64_t sc, mn;
        em_dot_k4_scales_packed(w[b].scales, &sc, &mn);
        const __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc)));
        __m512i idx = idx0;
        __m512i isum = _mm512_setzero_si512();
        UNROLL
        for (int p = 0; p < 2; p++) {
            /* 64 bytes = chunks 2p, 2p+1; low nibbles are sub-blocks 4p, 4p+2, high 4p+1, 4p+3 */
            const __m512i q = em_load512(w[b].qs + 64 * p);
            const __m512i lo = _mm512_and_si512(q, m4);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
            const __m512i first = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0));  /* 4p, 4p+1 */
            const __m512i second = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2)); /* 4p+2, 4p+3 */
            const __m512i p0 = _mm512_maddubs_epi16(first, em_load512(a[b].qs + 128 * p));
            isum = _mm512_dpwssd_epi32(isum, p0, spread_scales(sc16, idx));
            idx = _mm512_add_epi16(idx, two);
            const __m512i p1 = _mm512_maddubs_epi16(second, em_load512(a[b].qs + 128 * p + 64));
            isum = _mm512_dpwssd_epi32(isum, p1, spread_scales(sc16, idx));
            idx = _mm512_add_epi16(idx, two);
        }
        const __m128i m8 = _mm_cvtsi64_si128((long long)mn);
        const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        const __m256i msum = _mm256_madd_epi16(em_load256(a[b].bsums), m16);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(a[b].d * em_h2f(w[b].d)), _mm512_cvtepi32_ps(isum), acc);
        acc_min = _mm256_fmadd_ps(_mm256_set1_ps(-a[b].d * em_h2f(w[b].dmin)), _mm256_cvtepi32_ps(msum), acc_min);
    }
    return em_hsum512_ps(acc) + em_hsum256_ps(acc_min);
}

static float dot_q6_K_avx512(const void *vw, const void *va, int64_t n) {
    const em_block_q6_K *w = vw;
    const em_block_q8_K *a = va;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    /* [qh, qh]: the low 256 bits give quarter k=0 (bits 0-1, shifted up by 4) or k=2 (bits
     * 4-5, in place), the high 256 bits k=1 (bits 2-3, up by 2) or k=3 (bits 6-7, down 2). */
    const __m512i shl = _mm512_set_epi64(2 * 0x0001000100010001LL, 2 * 0x0001000100010001LL,
                                         2 * 0x0001000100010001LL, 2 * 0x0001000100010001LL,
                                         4 * 0x0001000100010001LL, 4 * 0x0001000100010001LL,
                                         4 * 0x0001000100010001LL, 4 * 0x0001000100010001LL);
    const __m512i shr = _mm512_set_epi64(2 * 0x0001000100010001LL, 2 * 0x0001000100010001LL,
                                         2 * 0x0001000100010001LL, 2 * 0x0001000100010001LL, 0, 0, 0, 0);
    /* maddubs output of 64 values = 4 groups of 16: int16 lanes 8g..8g+7 hold group g */
    const __m512i idx0 = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2,
                                          1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i four = _mm512_set1_epi16(4);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)w[b].scales);
        const __m256i sc16_256 = _mm256_cvtepi8_epi16(sc8);
        const __m512i sc16 = _mm512_castsi256_si512(sc16_256);
        __m512i idx = idx0;
        __m512i isum = _mm512_setzero_si512();
        UNROLL
        for (int h = 0; h < 2; h++) {
            const __m512i l = em_load512(w[b].ql + 64 * h);
            const __m512i qh = _mm512_broadcast_i64x4(em_load256(w[b].qh + 32 * h));
            const __m512i hlo = _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30);
            const __m512i hhi = _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30);
            const __m512i q01 = _mm512_or_si512(_mm512_and_si512(l, m4), hlo);
            const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4), hhi);
            const __m512i p01 = _mm512_maddubs_epi16(q01, em_load512(a[b].qs + 128 * h));
            isum = _mm512_dpwssd_epi32(isum, p01, spread_scales(sc16, idx));
            idx = _mm512_add_epi16(idx, four);
            const __m512i p23 = _mm512_maddubs_epi16(q23, em_load512(a[b].qs + 128 * h + 64));
            isum = _mm512_dpwssd_epi32(isum, p23, spread_scales(sc16, idx));
            idx = _mm512_add_epi16(idx, four);
        }
        /* the -32 offset of every quant: 32 * sum_g scale_g * bsums_g */
        const __m256i offs = _mm256_slli_epi32(_mm256_madd_epi16(em_load256(a[b].bsums), sc16_256), 5);
        const __m512i total = _mm512_sub_epi32(isum, _mm512_zextsi256_si512(offs));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(a[b].d * em_h2f(w[b].d)), _mm512_cvtepi32_ps(total), acc);
    }
    return em_hsum512_ps(acc);
}

/* Q2_K: per half of 128 values, the 32 bytes of 2-bit quants go to [q, q] and are shifted by
 * (0 | 2) and (4 | 6): 64 values each, in value order. maddubs output lanes 8g..8g+7 belong
 * to 16-value group g of the 64. */
static float dot_q2_K_avx512(const void *vw, const void *va, int64_t n) {
    const em_block_q2_K *w = vw;
    const em_block_q8_K *a = va;
    const __m512i m3 = _mm512_set1_epi8(3), four = _mm512_set1_epi16(4);
    const __m512i shift01 = _mm512_set_epi64(0x0002000200020002LL, 0x0002000200020002LL, 0x0002000200020002LL,
                                             0x0002000200020002LL, 0, 0, 0, 0);
    const __m512i shift23 = _mm512_add_epi16(shift01, four);
    const __m512i idx0 = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2,
                                          1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 acc = _mm512_setzero_ps();
    __m256 acc_min = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        const __m128i raw = _mm_loadu_si128((const __m128i *)w[b].scales);
        const __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(raw, _mm_set1_epi8(15))));
        const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15)));
        __m512i idx = idx0;
        __m512i isum = _mm512_setzero_si512();
        UNROLL
        for (int h = 0; h < 2; h++) {
            const __m512i q = _mm512_broadcast_i64x4(em_load256(w[b].qs + 32 * h));
            const __m512i v01 = _mm512_and_si512(_mm512_srlv_epi16(q, shift01), m3);
            const __m512i v23 = _mm512_and_si512(_mm512_srlv_epi16(q, shift23), m3);
            const __m512i p01 = _mm512_maddubs_epi16(v01, em_load512(a[b].qs + 128 * h));
            isum = _mm512_dpwssd_epi32(isum, p01, spread_scales(sc16, idx));
            idx = _mm512_add_epi16(idx, four);
            const __m512i p23 = _mm512_maddubs_epi16(v23, em_load512(a[b].qs + 128 * h + 64));
            isum = _mm512_dpwssd_epi32(isum, p23, spread_scales(sc16, idx));
            idx = _mm512_add_epi16(idx, four);
        }
        const __m256i msum = _mm256_madd_epi16(em_load256(a[b].bsums), mn16);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(a[b].d * em_h2f(w[b].d)), _mm512_cvtepi32_ps(isum), acc);
        acc_min = _mm256_fmadd_ps(_mm256_set1_ps(-a[b].d * em_h2f(w[b].dmin)), _mm256_cvtepi32_ps(msum), acc_min);
    }
    return em_hsum512_ps(acc) + em_hsum256_ps(acc_min);
}

/* Q3_K: as Q2_K, with the high bit (hmask bit i/32 of byte i%32) adding 4 to the crumb; the
 * -4 of every quant comes back as 4 * sum of scale * bsums. */
static float dot_q3_K_avx512(const void *vw, const void *va, int64_t n) {
    const em_block_q3_K *w = vw;
    const em_block_q8_K *a = va;
    const __m512i m3 = _mm512_set1_epi8(3), add4 = _mm512_set1_epi8(4), four = _mm512_set1_epi16(4);
    const __m512i shift01 = _mm512_set_epi64(0x0002000200020002LL, 0x0002000200020002LL, 0x0002000200020002LL,
                                             0x0002000200020002LL, 0, 0, 0, 0);
    const __m512i shift23 = _mm512_add_epi16(shift01, four);
    /* hmask bit for quarter j of the half: byte value 1 << (4h + j) */
    const __m512i bit01 = _mm512_set_epi64(0x0202020202020202LL, 0x0202020202020202LL, 0x0202020202020202LL,
                                           0x0202020202020202LL, 0x0101010101010101LL, 0x0101010101010101LL,
                                           0x0101010101010101LL, 0x0101010101010101LL);
    const __m512i idx0 = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2,
                                          1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        uint32_t sw[4];
        em_dot_q3k_scales_packed(w[b].scales, sw);
        const __m128i sc8 = _mm_sub_epi8(_mm_setr_epi32((int)sw[0], (int)sw[1], (int)sw[2], (int)sw[3]),
                                         _mm_set1_epi8(32));
        const __m256i sc16_256 = _mm256_cvtepi8_epi16(sc8);
        const __m512i sc16 = _mm512_castsi256_si512(sc16_256);
        const __m512i hm = _mm512_broadcast_i64x4(em_load256(w[b].hmask));
        __m512i idx = idx0, bits = bit01;
        __m512i isum = _mm512_setzero_si512();
        UNROLL
        for (int h = 0; h < 2; h++) {
            const __m512i q = _mm512_broadcast_i64x4(em_load256(w[b].qs + 32 * h));
            __m512i v01 = _mm512_and_si512(_mm512_srlv_epi16(q, shift01), m3);
            v01 = _mm512_mask_add_epi8(v01, _mm512_test_epi8_mask(hm, bits), v01, add4);
            bits = _mm512_slli_epi16(bits, 2);
            __m512i v23 = _mm512_and_si512(_mm512_srlv_epi16(q, shift23), m3);
            v23 = _mm512_mask_add_epi8(v23, _mm512_test_epi8_mask(hm, bits), v23, add4);
            bits = _mm512_slli_epi16(bits, 2);
            const __m512i p01 = _mm512_maddubs_epi16(v01, em_load512(a[b].qs + 128 * h));
            isum = _mm512_dpwssd_epi32(isum, p01, spread_scales(sc16, idx));
            idx = _mm512_add_epi16(idx, four);
            const __m512i p23 = _mm512_maddubs_epi16(v23, em_load512(a[b].qs + 128 * h + 64));
            isum = _mm512_dpwssd_epi32(isum, p23, spread_scales(sc16, idx));
            idx = _mm512_add_epi16(idx, four);
        }
        const __m256i offs = _mm256_slli_epi32(_mm256_madd_epi16(em_load256(a[b].bsums), sc16_256), 2);
        const __m512i total = _mm512_sub_epi32(isum, _mm512_zextsi256_si512(offs));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(a[b].d * em_h2f(w[b].d)), _mm512_cvtepi32_ps(total), acc);
    }
    return em_hsum512_ps(acc);
}

/* Q5_K: Q4_K plus the fifth bit of sub-block s (qh bit s of byte l) adding 16. */
static float dot_q5_K_avx512(const void *vw, const void *va, int64_t n) {
    const em_block_q5_K *w = vw;
    const em_block_q8_K *a = va;
    const __m512i m4 = _mm512_set1_epi8(0x0F), add16 = _mm512_set1_epi8(0x10);
    const __m512i idx0 = _mm512_set_epi16(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                          0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i two = _mm512_set1_epi16(2);
    /* qh bit for sub-blocks (s, s+1) in the two 256-bit halves, s = 0 first */
    const __m512i bit01 = _mm512_set_epi64(0x0202020202020202LL, 0x0202020202020202LL, 0x0202020202020202LL,
                                           0x0202020202020202LL, 0x0101010101010101LL, 0x0101010101010101LL,
                                           0x0101010101010101LL, 0x0101010101010101LL);
    __m512 acc = _mm512_setzero_ps();
    __m256 acc_min = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / EM_QK_K; b++) {
        uint64_t sc, mn;
        em_dot_k4_scales_packed(w[b].scales, &sc, &mn);
        const __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc)));
        const __m512i qh = _mm512_broadcast_i64x4(em_load256(w[b].qh));
        __m512i idx = idx0, bits = bit01;
        __m512i isum = _mm512_setzero_si512();
        UNROLL
        for (int p = 0; p < 2; p++) {
            const __m512i q = em_load512(w[b].qs + 64 * p);
            const __m512i lo = _mm512_and_si512(q, m4);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
            __m512i first = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0));  /* 4p, 4p+1 */
            __m512i second = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2)); /* 4p+2, 4p+3 */
            first = _mm512_mask_add_epi8(first, _mm512_test_epi8_mask(qh, bits), first, add16);
            bits = _mm512_slli_epi16(bits, 2);
            second = _mm512_mask_add_epi8(second, _mm512_test_epi8_mask(qh, bits), second, add16);
            bits = _mm512_slli_epi16(bits, 2);
            const __m512i p0 = _mm512_maddubs_epi16(first, em_load512(a[b].qs + 128 * p));
            isum = _mm512_dpwssd_epi32(isum, p0, spread_scales(sc16, idx));
            idx = _mm512_add_epi16(idx, two);
            const __m512i p1 = _mm512_maddubs_epi16(second, em_load512(a[b].qs + 128 * p + 64));
            isum = _mm512_dpwssd_epi32(isum, p1, spread_scales(sc16, idx));
            idx = _mm512_add_epi16(idx, two);
        }
        const __m128i m8 = _mm_cvtsi64_si128((long long)mn);
        const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        const __m256i msum = _mm256_madd_epi16(em_load256(a[b].bsums), m16);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(a[b].d * em_h2f(w[b].d)), _mm512_cvtepi32_ps(isum), acc);
        acc_min = _mm256_fmadd_ps(_mm256_set1_ps(-a[b].d * em_h2f(w[b].dmin)), _mm256_cvtepi32_ps(msum), acc_min);
    }
    return em_hsum512_ps(acc) + em_hsum256_ps(acc_min);
}

const em_dot_fn em_dot_kernels_avx512[EM_TYPE_COUNT] = {
    [EM_TYPE_F32] = dot_f32_avx512,   [EM_TYPE_F16] = dot_f16_avx512,
    [EM_TYPE_BF16] = dot_bf16_avx512, [EM_TYPE_Q8_0] = dot_q8_0_avx512,
    [EM_TYPE_Q4_0] = dot_q4_0_avx512, [EM_TYPE_Q4_1] = dot_q4_1_avx512,
    [EM_TYPE_Q5_0] = dot_q5_0_avx512, [EM_TYPE_Q5_1] = dot_q5_1_avx512,
    [EM_TYPE_MXFP4] = dot_mxfp4_avx512, [EM_TYPE_Q2_K] = dot_q2_K_avx512,
    [EM_TYPE_Q3_K] = dot_q3_K_avx512, [EM_TYPE_Q4_K] = dot_q4_K_avx512,
    [EM_TYPE_Q5_K] = dot_q5_K_avx512, [EM_TYPE_Q6_K] = dot_q6_K_avx512,
    /* IQ formats (dot_iq_avx512.c); the other IQ types fall back to AVX2 (faster for them) */
    [EM_TYPE_IQ1_M] = em_dot_iq1_m_avx512, [EM_TYPE_IQ4_XS] = em_dot_iq4_xs_avx512,
};
