/* Internal to quant/: the codebooks of ggml's IQ formats (format constants, carried as data
 * in iq_grids.c with the notice of their origin). Each grid entry packs the 8 (u64) or 4
 * (u32) byte-sized values of one group, value j in byte j (little-endian):
 *   iq2xxs / iq2xs / iq2s grids: magnitudes in {8, 25, 43} (unsigned bytes);
 *   iq3xxs / iq3s grids: magnitudes in {4, 12, ..., 62} (unsigned bytes);
 *   iq1s grid: values in {-1, 0, 1} (signed bytes).
 * em_iq_ksigns[k] is a 7-bit sign index k completed with its parity as bit 7: bit j set means
 * value j of the group is negated. em_iq4nl_values are the 16 IQ4_NL / IQ4_XS code points. */
#ifndef EM_QUANT_IQ_GRIDS_H
#define EM_QUANT_IQ_GRIDS_H

#include <stdint.h>

extern const uint8_t em_iq_ksigns[128];
extern const int8_t em_iq4nl_values[16];
extern const uint64_t em_iq2xxs_grid[256];
extern const uint64_t em_iq2xs_grid[512];
extern const uint64_t em_iq2s_grid[1024];
extern const uint32_t em_iq3xxs_grid[256];
extern const uint32_t em_iq3s_grid[512];
extern const uint64_t em_iq1s_grid[2048];

/* The IQ4_NL code points as a brace-free list, for SIMD table constants. */
#define EM_IQ4NL_VALUES -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113

#endif
