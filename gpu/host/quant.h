// Reference (scalar) dequantization of the stored types; fast kernels are tested against it.
#pragma once
#include <cstdint>

#include "model/tensor.h"

namespace specula {

float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);  // round to nearest even

// Sub-block j (0..7, 32 values) of a Q4_K super-block `sb` (144 bytes): value l is
// d * q[l] - m, with d = super d * 6-bit scale and m = super dmin * 6-bit min (both exact in f32).
void q4_k_subblock(const uint8_t* sb, int j, float* d, float* m, uint8_t q[32]);

// A Q5_1 block `b` (24 bytes) as its fp16 d and m (exact in f32) and 32 five-bit quants q (0..31,
// the nibble with bit j of qh above it): value j is q[j] * d + m.
void q5_1_block(const uint8_t* b, float* d, float* m, uint8_t q[32]);

// Sub-block j of a Q5_K super-block `sb` (176 bytes), as q4_k_subblock: value l is d * q[l] - m,
// q (0..31) the nibble with the fifth bit (bit j of qh[l]) above it.
void q5_k_subblock(const uint8_t* sb, int j, float* d, float* m, uint8_t q[32]);

// Sub-block j (0..7, 32 values) of an IQ4_XS super-block `sb` (136 bytes: fp16 d, the 6-bit
// scales' high bit pairs as a little-endian u16 and their low nibbles in 4 bytes, then 8 x 16 bytes
// of IQ4_NL's nibbles): its scale d * (ls - 32), exact in f32. Its nibbles are the 16 bytes at
// sb + 8 + 16 j, in IQ4_NL's order: value l of the sub-block is scale * level[index l].
float iq4_xs_subblock_scale(const uint8_t* sb, int j);

// The 2-bit quant of value v (0..255) of a Q2_K super-block, or the low two bits of a Q3_K one's,
// from their 64 bytes `qs`: in each 128 values, 32 bytes hold four 2-bit planes (value 32s + l at
// bits 2s of byte l).
inline int two_bit_quant(const uint8_t* qs, int v) { return (qs[32 * (v / 128) + v % 32] >> (2 * ((v % 128) / 32))) & 3; }

// IQ1_M's fp16 d (its bits), kept in the top nibbles of its four little-endian scale words at
// sb + 48 (the lowest nibble in the first word); set_iq1_m_d writes them, leaving the scales.
uint16_t iq1_m_d(const uint8_t* sb);
void set_iq1_m_d(uint8_t* sb, uint16_t d);

// A Q6_K super-block `sb` (210 bytes) as 256 unsigned 6-bit quants q (0..63), 16 int8 scales
// (value v uses sc[v / 16]) and d: value v is d * sc[v / 16] * (q[v] - 32).
void q6_k_superblock(const uint8_t* sb, uint8_t q[256], int8_t sc[16], float* d);

// dst[0..cols) = the values of one stored row. cols is a multiple of the type's block size.
void dequantize_row(DType t, const void* src, float* dst, int64_t cols);

}  // namespace specula
