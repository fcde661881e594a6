/* Internal to quant/: the byte layouts of ggml's quant blocks. Every struct here is packed
 * exactly as ggml writes it (sizes asserted below); fp16 fields are stored as uint16_t. */
#ifndef EM_QUANT_BLOCKS_H
#define EM_QUANT_BLOCKS_H

#include <stdint.h>

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_MXFP4 32
#define QK4_NL 32
#define K_SCALE_SIZE 12

typedef struct { uint16_t d; uint8_t qs[QK4_0 / 2]; } em_block_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[QK4_1 / 2]; } em_block_q4_1;
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } em_block_q5_0;
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } em_block_q5_1;
typedef struct { uint16_t d; int8_t qs[QK8_0]; } em_block_q8_0;
typedef struct { uint16_t d, s; int8_t qs[QK8_1]; } em_block_q8_1;
typedef struct { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; } em_block_mxfp4;

typedef struct { uint8_t scales[16]; uint8_t qs[256 / 4]; uint16_t d, dmin; } em_block_q2_K;
typedef struct { uint8_t hmask[256 / 8]; uint8_t qs[256 / 4]; uint8_t scales[12]; uint16_t d; } em_block_q3_K;
typedef struct { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[256 / 2]; } em_block_q4_K;
typedef struct { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[256 / 8]; uint8_t qs[256 / 2]; } em_block_q5_K;
typedef struct { uint8_t ql[256 / 2]; uint8_t qh[256 / 4]; int8_t scales[256 / 16]; uint16_t d; } em_block_q6_K;
/* Q8_K is an activation-only type: float scale, int8 values, sums of groups of 16. */
typedef struct { float d; int8_t qs[256]; int16_t bsums[256 / 16]; } em_block_q8_K;

typedef struct { uint16_t d; uint16_t qs[256 / 8]; } em_block_iq2_xxs;
typedef struct { uint16_t d; uint16_t qs[256 / 8]; uint8_t scales[256 / 32]; } em_block_iq2_xs;
typedef struct { uint16_t d; uint8_t qs[256 / 4]; uint8_t qh[256 / 32]; uint8_t scales[256 / 32]; } em_block_iq2_s;
typedef struct { uint16_t d; uint8_t qs[3 * 256 / 8]; } em_block_iq3_xxs;
typedef struct { uint16_t d; uint8_t qs[256 / 4]; uint8_t qh[256 / 32]; uint8_t signs[256 / 8]; uint8_t scales[256 / 64]; } em_block_iq3_s;
typedef struct { uint16_t d; uint8_t qs[256 / 8]; uint16_t qh[256 / 32]; } em_block_iq1_s;
typedef struct { uint8_t qs[256 / 8]; uint8_t qh[256 / 16]; uint8_t scales[256 / 32]; } em_block_iq1_m;
typedef struct { uint16_t d; uint8_t qs[QK4_NL / 2]; } em_block_iq4_nl;
typedef struct { uint16_t d; uint16_t scales_h; uint8_t scales_l[256 / 64]; uint8_t qs[256 / 2]; } em_block_iq4_xs;

_Static_assert(sizeof(em_block_q4_0) == 18, "q4_0");
_Static_assert(sizeof(em_block_q4_1) == 20, "q4_1");
_Static_assert(sizeof(em_block_q5_0) == 22, "q5_0");
_Static_assert(sizeof(em_block_q5_1) == 24, "q5_1");
_Static_assert(sizeof(em_block_q8_0) == 34, "q8_0");
_Static_assert(sizeof(em_block_q8_1) == 36, "q8_1");
_Static_assert(sizeof(em_block_mxfp4) == 17, "mxfp4");
_Static_assert(sizeof(em_block_q2_K) == 84, "q2_K");
_Static_assert(sizeof(em_block_q3_K) == 110, "q3_K");
_Static_assert(sizeof(em_block_q4_K) == 144, "q4_K");
_Static_assert(sizeof(em_block_q5_K) == 176, "q5_K");
_Static_assert(sizeof(em_block_q6_K) == 210, "q6_K");
_Static_assert(sizeof(em_block_q8_K) == 292, "q8_K");
_Static_assert(sizeof(em_block_iq2_xxs) == 66, "iq2_xxs");
_Static_assert(sizeof(em_block_iq2_xs) == 74, "iq2_xs");
_Static_assert(sizeof(em_block_iq2_s) == 82, "iq2_s");
_Static_assert(sizeof(em_block_iq3_xxs) == 98, "iq3_xxs");
_Static_assert(sizeof(em_block_iq3_s) == 110, "iq3_s");
_Static_assert(sizeof(em_block_iq1_s) == 50, "iq1_s");
_Static_assert(sizeof(em_block_iq1_m) == 56, "iq1_m");
_Static_assert(sizeof(em_block_iq4_nl) == 18, "iq4_nl");
_Static_assert(sizeof(em_block_iq4_xs) == 136, "iq4_xs");

#endif
