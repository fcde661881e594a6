/* quant/: tensor element types as ggml numbers and lays them out. Per type: block size,
 * block bytes, dequantization to f32 (bit-identical to ggml's to_float), quantization from
 * f32 for the types Ember writes (bit-identical to ggml_quantize_chunk without an importance
 * matrix), and dot products of quantized weights with activations for the matmul path,
 * with runtime dispatch between a scalar reference and AVX2 / AVX-512 kernels.
 * Knows nothing of files or models. */
#ifndef EM_QUANT_H
#define EM_QUANT_H

#include "base/base.h"

/* ggml's type ids (they are what GGUF files store). */
enum em_type {
    EM_TYPE_F32 = 0,
    EM_TYPE_F16 = 1,
    EM_TYPE_Q4_0 = 2,
    EM_TYPE_Q4_1 = 3,
    EM_TYPE_Q5_0 = 6,
    EM_TYPE_Q5_1 = 7,
    EM_TYPE_Q8_0 = 8,
    EM_TYPE_Q8_1 = 9,
    EM_TYPE_Q2_K = 10,
    EM_TYPE_Q3_K = 11,
    EM_TYPE_Q4_K = 12,
    EM_TYPE_Q5_K = 13,
    EM_TYPE_Q6_K = 14,
    EM_TYPE_Q8_K = 15,
    EM_TYPE_IQ2_XXS = 16,
    EM_TYPE_IQ2_XS = 17,
    EM_TYPE_IQ3_XXS = 18,
    EM_TYPE_IQ1_S = 19,
    EM_TYPE_IQ4_NL = 20,
    EM_TYPE_IQ3_S = 21,
    EM_TYPE_IQ2_S = 22,
    EM_TYPE_IQ4_XS = 23,
    EM_TYPE_I8 = 24,
    EM_TYPE_I16 = 25,
    EM_TYPE_I32 = 26,
    EM_TYPE_I64 = 27,
    EM_TYPE_F64 = 28,
    EM_TYPE_IQ1_M = 29,
    EM_TYPE_BF16 = 30,
    EM_TYPE_TQ1_0 = 34,
    EM_TYPE_TQ2_0 = 35,
    EM_TYPE_MXFP4 = 39,
    EM_TYPE_NVFP4 = 40, /* 40..42: newer ggml types, known by name and size only */
    EM_TYPE_Q1_0 = 41,
    EM_TYPE_Q2_0 = 42,
    EM_TYPE_COUNT = 43, /* ids are < EM_TYPE_COUNT */
};

#define EM_QK_K 256

typedef void (*em_to_float_fn)(const void *src, float *dst, int64_t n);
typedef void (*em_from_float_fn)(const float *src, void *dst, int64_t n);

typedef struct em_type_info {
    const char *name;          /* "q8_0", "bf16", ... as ggml names them */
    int block_elems;           /* values per block (1 for plain types) */
    int block_bytes;           /* bytes per block */
    em_to_float_fn to_float;   /* NULL: Ember cannot read this type */
    em_from_float_fn from_float; /* NULL: Ember cannot write this type */
} em_type_info;

/* NULL when type is not a ggml type id Ember knows by name. */
const em_type_info *em_type_get(int type);
const char *em_type_name(int type); /* "unknown" for unknown ids */
/* Type id from a ggml name ("q8_0", "Q8_0", "bf16"); -1 when unknown. */
int em_type_from_name(const char *name);
/* Bytes of a row of n values; EM_EFORMAT when n is not a multiple of the block size,
 * EM_EUNSUPPORTED for an unknown type, EM_EOVERFLOW on overflow. */
int em_type_row_bytes(int type, uint64_t n, uint64_t *bytes, em_err *err);

/* Dequantize / quantize n values (n a multiple of the block size; checked). Results are
 * bit-identical to ggml's to_float and to ggml_quantize_chunk without an importance matrix
 * (Q8_K: quantize_row_q8_K_ref) for finite input; any input bytes / floats are safe. The
 * quantized buffer may sit at any byte address (the float one needs float alignment).
 * EM_EUNSUPPORTED: unknown type or no converter
 * (to_float / from_float NULL); EM_EFORMAT: n not a block multiple; EM_EINVAL: n < 0 or a
 * NULL buffer; EM_EOVERFLOW: the byte size does not fit in size_t. */
int em_dequantize(int type, const void *src, float *dst, int64_t n, em_err *err);
int em_quantize(int type, const float *src, void *dst, int64_t n, em_err *err);

/* ==== dot products (dot.c, dot_avx2.c, dot_avx512.c) ===================================
 * A weight row of type W meets an activation row of type em_dot_act_type(W):
 *   Q8_0 for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4 (ggml pairs Q4_1 / Q5_1 with Q8_1; Ember
 *        uses Q8_0 and sums the activation block in the kernel: same quants, one less
 *        activation format, and no fp16 rounding of the block sum);
 *   Q8_0 also for IQ4_NL;
 *   Q8_K for Q2_K .. Q6_K and IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_XS
 *        (as ggml pairs them);
 *   F32  for F32, F16, BF16 (ggml rounds activations to F16 / BF16; Ember keeps f32).
 * Quantized kernels accumulate int8 x int8 products per block in integers and scale them
 * by d_w * d_a, so every ISA computes the same sum up to float rounding. The scalar kernels
 * are the reference: they equal dequantize-then-f32-dot up to float rounding. */

enum em_isa { EM_ISA_SCALAR = 0, EM_ISA_AVX2 = 1, EM_ISA_AVX512 = 2, EM_ISA_COUNT = 3 };

/* Dot product of n weights w with n activations act; n >= 0 and a multiple of the block
 * sizes of both types. Unchecked (hot path): see em_dot for the checked form. */
typedef float (*em_dot_fn)(const void *w, const void *act, int64_t n);

/* Activation type for weights of type wtype; -1 when Ember has no dot kernel for it. */
int em_dot_act_type(int wtype);
/* Values per block that n must be a multiple of for (wtype, its activation type); 0 when
 * wtype has no dot kernel. */
int em_dot_block_elems(int wtype);

/* "scalar", "avx2", "avx512" ("unknown" otherwise); -1 from em_isa_from_name when unknown. */
const char *em_isa_name(int isa);
int em_isa_from_name(const char *name);
/* Whether this CPU (and OS) can run kernels of that ISA. AVX2 means AVX2+FMA+F16C; AVX-512
 * means F+BW+VL+DQ+VNNI. */
bool em_isa_cpu_supports(int isa);
/* The best ISA this CPU supports. */
int em_isa_cpu_best(void);
/* The ISA dispatch uses: em_isa_cpu_best(), or EMBER_ISA=scalar|avx2|avx512 when set (a
 * level above what the CPU supports is lowered to em_isa_cpu_best(), with a warning).
 * CPU support and EMBER_ISA are read once per process, at the first call of any em_isa_* or
 * em_dot_* dispatch function. */
int em_isa_default(void);

/* The kernel for weights of type wtype at ISA isa: the fastest one at or below isa (a type
 * without a kernel at that level falls back to a lower one). NULL when wtype has no dot
 * kernel, isa is out of range, or the CPU cannot run isa. *used_isa (if non-NULL) gets the
 * ISA of the returned kernel. */
em_dot_fn em_dot_kernel(int wtype, int isa, int *used_isa);
/* em_dot_kernel(wtype, em_isa_default(), NULL). */
em_dot_fn em_dot_get(int wtype);

/* Bytes of an activation row of n values for weights of type wtype (checked). */
int em_dot_act_bytes(int wtype, int64_t n, uint64_t *bytes, em_err *err);
/* Converts an f32 activation row of n values to em_dot_act_type(wtype) in act
 * (em_dot_act_bytes big). */
int em_dot_quantize_act(int wtype, const float *x, void *act, int64_t n, em_err *err);
/* Checked dot product with the default kernel: *out = w . act. */
int em_dot(int wtype, const void *w, const void *act, int64_t n, float *out, em_err *err);

/* ==== end of dot products ============================================================ */

#endif
