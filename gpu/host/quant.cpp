// Scalar reference dequantization of GGUF block types, written after ggml-quants.c
// (dequantize_row_q4_0 / q4_1 / q5_0 / q5_1 / q8_0 / q2_K / q3_K / q4_K / q5_K / q6_K). The fast matmul kernels are checked
// against these, so they stay plain: one value at a time, no intrinsics.
#include "gpu/host/quant.h"

#include "gpu/host/iq_grids.h"

#include <bit>
#include <cassert>
#include <cstring>

namespace specula {

// ---- half and bfloat16 -------------------------------------------------------------------

float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {  // inf / nan: keep the payload
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {  // normal: rebias 15 -> 127
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {  // signed zero
    bits = sign;
  } else {  // subnormal half = mant * 2^-24, always a normal float
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400u) == 0);
    bits = sign | ((112u - static_cast<uint32_t>(e)) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t f32_to_fp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or nan (nan stays a quiet nan)
    return sign | (absx > 0x7f800000u ? 0x7e00u : 0x7c00u);
  }
  if (absx >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: overflow to inf
  const int32_t exp = static_cast<int32_t>(absx >> 23) - 127;
  if (exp >= -14) {  // normal half: drop 13 mantissa bits, round to nearest even
    uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | ((absx >> 13) & 0x3ffu);
    const uint32_t rest = absx & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // carry may bump the exponent
    return sign | static_cast<uint16_t>(h);
  }
  if (exp < -25) return sign;  // below half the smallest subnormal: rounds to zero
  // subnormal half: value = m * 2^-24 with the implicit bit made explicit
  const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
  const int shift = -exp - 14 + 13;  // 14..24
  uint32_t h = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);  // nearest, ties to even
  return static_cast<uint16_t>((x + rounding) >> 16);
}

// ---- block layouts (ggml-common.h); all fields little-endian, fp16 scales -----------------

namespace {

uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
float load_fp16(const uint8_t* p) { return fp16_to_f32(load_u16(p)); }

// Q4_0: 18 bytes = fp16 d, 16 bytes of nibbles. Value j (< 16) is the low nibble of byte j,
// value j + 16 the high nibble; y = (q - 8) * d.
void dequantize_q4_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 18, y += 32) {
    const float d = load_fp16(b);
    const uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
      y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

// Q4_1: 20 bytes = fp16 d, fp16 m, 16 bytes of nibbles (same order as Q4_0); y = q * d + m.
void dequantize_q4_1(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 20, y += 32) {
    const float d = load_fp16(b);
    const float m = load_fp16(b + 2);
    const uint8_t* qs = b + 4;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(qs[j] & 0x0f) * d + m;
      y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
}

// Q5_0: 22 bytes = fp16 d, 32 fifth bits (a little-endian u32), 16 bytes of nibbles; value j
// < 16 is the low nibble of qs[j] with bit j above it, j + 16 the high nibble with bit j + 16;
// y = (q - 16) * d. (Loading converts it to Q8_0, model/tensor.h kernel_view; this is the
// definition the conversion is tested against.)
void dequantize_q5_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 22, y += 32) {
    const float d = load_fp16(b);
    const uint32_t qh = static_cast<uint32_t>(b[2]) | static_cast<uint32_t>(b[3]) << 8 | static_cast<uint32_t>(b[4]) << 16 |
                        static_cast<uint32_t>(b[5]) << 24;
    const uint8_t* qs = b + 6;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(static_cast<int>((qs[j] & 0x0f) | ((qh >> j) & 1u) << 4) - 16) * d;
      y[j + 16] = static_cast<float>(static_cast<int>((qs[j] >> 4) | ((qh >> (j + 16)) & 1u) << 4) - 16) * d;
    }
  }
}

// Q5_1: 24 bytes = fp16 d, fp16 m, 32 fifth bits (a little-endian u32), 16 bytes of nibbles;
// the quant q (0..31) as Q5_0 joins it; y = q * d + m.
void dequantize_q5_1(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 24, y += 32) {
    float d, m;
    uint8_t q[32];
    q5_1_block(b, &d, &m, q);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q[j]) * d + m;
  }
}

// 32 values d * level from 16 bytes of 4-bit indices into IQ4_NL's 16 levels (value j < 16 the low
// nibble of qs[j], j + 16 the high one).
void iq4_values(const uint8_t* qs, float d, float* y) {
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(kIq4NlLevels[qs[j] & 0x0f]);
    y[j + 16] = d * static_cast<float>(kIq4NlLevels[qs[j] >> 4]);
  }
}

// IQ4_NL: 18 bytes = fp16 d, 16 bytes of indices.
void dequantize_iq4_nl(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 18, y += 32) iq4_values(b + 2, load_fp16(b), y);
}

// IQ4_XS: 136 bytes a super-block, eight 32-value sub-blocks each IQ4_NL's with a scale of its own
// (iq4_xs_subblock_scale).
void dequantize_iq4_xs(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 136)
    for (int j = 0; j < 8; ++j, y += 32) iq4_values(b + 8 + 16 * j, iq4_xs_subblock_scale(b, j), y);
}

// Q8_0: 34 bytes = fp16 d, 32 int8; y = q * d.
void dequantize_q8_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 34, y += 32) {
    const float d = load_fp16(b);
    const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
  }
}

// ggml's get_scale_min_k4: eight 6-bit scales and eight 6-bit mins packed into 12 bytes.
void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
  }
}

// Q4_K: 144 bytes per 256 values = fp16 d, fp16 dmin, 12 bytes of scales/mins, 128 bytes of
// nibbles. Each 64 values use 32 bytes: low nibbles with (scale, min) 2i, high with 2i + 1;
// y = d * sc * q - dmin * m.
void dequantize_q4_K(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 144) {
    const float d = load_fp16(b);
    const float min = load_fp16(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* q = b + 16;
    int is = 0;
    uint8_t sc, m;
    for (int j = 0; j < 256; j += 64) {
      get_scale_min_k4(is + 0, scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = min * m;
      get_scale_min_k4(is + 1, scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
      q += 32;
      is += 2;
    }
  }
}

// Q2_K: 84 bytes per 256 values = 16 bytes of scales (sub-block j of 16 values: scale in the low
// nibble of byte j, min in the high one), qs[64] (two_bit_quant), fp16 d, fp16 dmin;
// y = d * sc * q - dmin * m.
void dequantize_q2_K(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 84, y += 256) {
    const uint8_t* sc = b;
    const uint8_t* qs = b + 16;
    const float d = load_fp16(b + 80);
    const float min = load_fp16(b + 82);
    for (int j = 0; j < 16; ++j) {
      const float dl = d * static_cast<float>(sc[j] & 15);
      const float ml = min * static_cast<float>(sc[j] >> 4);
      for (int v = 16 * j; v < 16 * j + 16; ++v) y[v] = dl * static_cast<float>(two_bit_quant(qs, v)) - ml;
    }
  }
}

// Q3_K: 110 bytes per 256 values = hmask[32], qs[64], 12 bytes of 6-bit scales, fp16 d. qs holds
// the low two bits (two_bit_quant); the third bit of value v is bit v / 32 of hmask[v % 32]; the scale of each 16 values has its low
// four bits in the 8 first scale bytes (low nibbles for sub-blocks 0..7, high for 8..15) and its
// top two in the last 4 (sub-block j at bit 2 (j / 4) of byte 8 + j % 4). y = d * (s - 32) * (q - 4).
void dequantize_q3_K(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 110, y += 256) {
    const uint8_t* hmask = b;
    const uint8_t* qs = b + 32;
    const uint8_t* sc = b + 96;
    const float d = load_fp16(b + 108);
    for (int j = 0; j < 16; ++j) {
      const int s = (((j < 8 ? sc[j] : sc[j - 8] >> 4) & 15) | ((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
      const float dl = d * static_cast<float>(s);
      for (int k = 0; k < 16; ++k) {
        const int v = 16 * j + k;
        const int q = two_bit_quant(qs, v) | ((hmask[v % 32] >> (v / 32)) & 1) << 2;
        y[v] = dl * static_cast<float>(q - 4);
      }
    }
  }
}

// Q6_K: 210 bytes per 256 values = 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits),
// 16 int8 scales (one per 16 values), fp16 d last; y = d * scale * (q - 32).
void dequantize_q6_K(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 210) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = load_fp16(b + 208);
    for (int n = 0; n < 256; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int8_t q1 = static_cast<int8_t>((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int8_t q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int8_t q3 = static_cast<int8_t>((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int8_t q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

// The IQ1, IQ2 and IQ3 types (256-value super-blocks), as ggml's dequantize_row_iq* compute them:
// groups of 8 (IQ2, IQ1) or 4 (IQ3) values take one entry of their type's grid (iq_grids.h), the
// IQ2 and IQ3 types with a sign per value, each 16- or 32-value sub-block a scale of its own.
// Every product is exact in f32 (an fp16 d times integers of at most 5 and 6 bits, or times 7/8
// and 9/8 for IQ1's delta), so the order of the multiplies does not change a bit.

// 8 values: db * grid[j], negated where bit j of `signs` is set.
void signed_group(const uint8_t* grid, int width, uint8_t signs, int first_sign, float db, float* y) {
  for (int j = 0; j < width; ++j)
    y[j] = db * static_cast<float>(grid[j]) * ((signs >> (first_sign + j)) & 1 ? -1.0f : 1.0f);
}

uint32_t load_u32(const uint8_t* p) { return static_cast<uint32_t>(load_u16(p)) | static_cast<uint32_t>(load_u16(p + 2)) << 16; }

// IQ2_XXS, 66 bytes: fp16 d, then per 32 values two u32: four grid indices (bytes), and four 7-bit
// sign indices under a 4-bit scale s (bits 28..31): db = d (0.5 + s) / 4.
void dequantize_iq2_xxs(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 66) {
    const float d = load_fp16(b);
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* q = b + 2 + 8 * ib;
      const uint32_t aux = load_u32(q + 4);
      const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.25f;
      for (int l = 0; l < 4; ++l, y += 8) signed_group(iq::kIq2xxsGrid[q[l]], 8, iq::kIqSigns[(aux >> (7 * l)) & 127], 0, db, y);
    }
  }
}

// IQ2_XS, 74 bytes: fp16 d, 32 u16 (a 9-bit grid index under a 7-bit sign index), 8 bytes of
// two 4-bit scales (one per 16 values).
void dequantize_iq2_xs(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 74) {
    const float d = load_fp16(b);
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t sc = b[66 + ib];
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint16_t q = load_u16(b + 2 + 2 * (4 * ib + l));
        const float db = d * (0.5f + static_cast<float>(l < 2 ? sc & 15 : sc >> 4)) * 0.25f;
        signed_group(iq::kIq2xsGrid[q & 511], 8, iq::kIqSigns[q >> 9], 0, db, y);
      }
    }
  }
}

// IQ2_S, 82 bytes: fp16 d, 32 low bytes of 10-bit grid indices, 32 sign bytes, 8 bytes of the
// indices' top two bits (per 32 values), 8 bytes of two 4-bit scales.
void dequantize_iq2_s(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 82) {
    const float d = load_fp16(b);
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t sc = b[74 + ib], qh = b[66 + ib];
      for (int l = 0; l < 4; ++l, y += 8) {
        const int idx = b[2 + 4 * ib + l] | ((qh >> (2 * l)) & 3) << 8;
        const float db = d * (0.5f + static_cast<float>(l < 2 ? sc & 15 : sc >> 4)) * 0.25f;
        signed_group(iq::kIq2sGrid[idx], 8, b[34 + 4 * ib + l], 0, db, y);
      }
    }
  }
}

// IQ3_XXS, 98 bytes: fp16 d, 64 grid indices (4 values each), then per 32 values a u32 of four
// 7-bit sign indices under a 4-bit scale s: db = d (0.5 + s) / 2.
void dequantize_iq3_xxs(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 98) {
    const float d = load_fp16(b);
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t aux = load_u32(b + 66 + 4 * ib);
      const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t signs = iq::kIqSigns[(aux >> (7 * l)) & 127];
        signed_group(iq::kIq3xxsGrid[b[2 + 8 * ib + 2 * l]], 4, signs, 0, db, y);
        signed_group(iq::kIq3xxsGrid[b[2 + 8 * ib + 2 * l + 1]], 4, signs, 4, db, y + 4);
      }
    }
  }
}

// IQ3_S, 110 bytes: fp16 d, 64 low bytes of 9-bit grid indices, 8 bytes of their top bits, 32
// sign bytes, 4 bytes of two 4-bit scales s (one per 32 values): db = d (1 + 2 s).
void dequantize_iq3_s(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 110) {
    const float d = load_fp16(b);
    for (int ib = 0; ib < 8; ++ib) {
      const int s = (b[106 + ib / 2] >> (4 * (ib % 2))) & 15;
      const float db = d * static_cast<float>(1 + 2 * s);
      const uint8_t qh = b[66 + ib];
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t signs = b[74 + 4 * ib + l];
        for (int h = 0; h < 2; ++h) {
          const int k = 2 * l + h;
          signed_group(iq::kIq3sGrid[b[2 + 8 * ib + k] | ((qh >> k) & 1) << 8], 4, signs, 4 * h, db, y + 4 * h);
        }
      }
    }
  }
}

// 8 values of an IQ1 type: dl * (grid[j] + delta), grid values -1, 0 or 1.
void iq1_group(int idx, float dl, float delta, float* y) {
  for (int j = 0; j < 8; ++j) y[j] = dl * (static_cast<float>(iq::kIq1sGrid[idx][j]) + delta);
}
constexpr float kIq1Delta = 0.125f;

// IQ1_S, 50 bytes: fp16 d, 32 low bytes of 11-bit grid indices, then per 32 values a u16: the
// four indices' top 3 bits, a 3-bit scale s (bits 12..14, dl = d (2 s + 1)) and delta's sign (bit 15).
void dequantize_iq1_s(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 50) {
    const float d = load_fp16(b);
    for (int ib = 0; ib < 8; ++ib) {
      const uint16_t qh = load_u16(b + 34 + 2 * ib);
      const float dl = d * static_cast<float>(2 * ((qh >> 12) & 7) + 1);
      const float delta = qh & 0x8000 ? -kIq1Delta : kIq1Delta;
      for (int l = 0; l < 4; ++l, y += 8) iq1_group(b[2 + 4 * ib + l] | ((qh >> (3 * l)) & 7) << 8, dl, delta, y);
    }
  }
}

// IQ1_M, 56 bytes: 32 low bytes of 11-bit grid indices, 16 bytes of two nibbles (per 8 values:
// the index's top 3 bits and delta's sign), four u16 of four 3-bit scales (per 16 values) each,
// the fp16 d in their top nibbles.
void dequantize_iq1_m(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 56) {
    uint16_t sc[4];
    for (int k = 0; k < 4; ++k) sc[k] = load_u16(b + 48 + 2 * k);
    const float d = fp16_to_f32(iq1_m_d(b));
    for (int g = 0; g < 32; ++g, y += 8) {  // group g: sub-block g / 4, scale g / 2
      const int nib = (b[32 + g / 2] >> (4 * (g % 2))) & 15;
      const int s = (sc[g / 8] >> (3 * ((g / 2) % 4))) & 7;
      iq1_group(b[g] | (nib & 7) << 8, d * static_cast<float>(2 * s + 1), nib & 8 ? -kIq1Delta : kIq1Delta, y);
    }
  }
}

}  // namespace

void q6_k_superblock(const uint8_t* sb, uint8_t q[256], int8_t sc[16], float* d) {
  *d = load_fp16(sb + 208);
  std::memcpy(sc, sb + 192, 16);
  for (int n = 0; n < 2; ++n) {  // each 128 values: 64 bytes of low nibbles, 32 of high bit pairs
    const uint8_t* ql = sb + 64 * n;
    const uint8_t* qh = sb + 128 + 32 * n;
    uint8_t* y = q + 128 * n;
    for (int l = 0; l < 32; ++l) {
      y[l + 0] = static_cast<uint8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4));
      y[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
      y[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
      y[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
    }
  }
}

void q4_k_subblock(const uint8_t* sb, int j, float* d, float* m, uint8_t q[32]) {
  uint8_t sc, mn;
  get_scale_min_k4(j, sb + 4, &sc, &mn);
  *d = load_fp16(sb) * sc;
  *m = load_fp16(sb + 2) * mn;
  const uint8_t* qs = sb + 16 + 32 * (j / 2);
  const int shift = 4 * (j % 2);
  for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>((qs[l] >> shift) & 0xF);
}

float iq4_xs_subblock_scale(const uint8_t* sb, int j) {
  const int high = (sb[2] | sb[3] << 8) >> (2 * j) & 3;
  const int low = sb[4 + j / 2] >> (4 * (j % 2)) & 15;
  return load_fp16(sb) * static_cast<float>((low | high << 4) - 32);
}

void q5_1_block(const uint8_t* b, float* d, float* m, uint8_t q[32]) {
  *d = load_fp16(b);
  *m = load_fp16(b + 2);
  const uint32_t qh = static_cast<uint32_t>(b[4]) | static_cast<uint32_t>(b[5]) << 8 | static_cast<uint32_t>(b[6]) << 16 |
                      static_cast<uint32_t>(b[7]) << 24;
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<uint8_t>((qs[j] & 0x0f) | ((qh >> j) & 1u) << 4);
    q[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | ((qh >> (j + 16)) & 1u) << 4);
  }
}

void q5_k_subblock(const uint8_t* sb, int j, float* d, float* m, uint8_t q[32]) {
  uint8_t sc, mn;
  get_scale_min_k4(j, sb + 4, &sc, &mn);
  *d = load_fp16(sb) * sc;
  *m = load_fp16(sb + 2) * mn;
  const uint8_t* qh = sb + 16;
  const uint8_t* qs = sb + 48 + 32 * (j / 2);
  const int shift = 4 * (j % 2);
  for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(((qs[l] >> shift) & 0xF) | ((qh[l] >> j) & 1) << 4);
}

// Q5_K: 176 bytes per 256 values = fp16 d, fp16 dmin, 12 bytes of scales/mins (as Q4_K), 32
// bytes qh, 128 bytes of nibbles (as Q4_K's); y = d * sc * q - dmin * m, sub-block by sub-block.
static void dequantize_q5_K(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 176)
    for (int j = 0; j < 8; ++j, y += 32) {
      float d, m;
      uint8_t q[32];
      q5_k_subblock(b, j, &d, &m, q);
      for (int l = 0; l < 32; ++l) y[l] = d * static_cast<float>(q[l]) - m;
    }
}

uint16_t iq1_m_d(const uint8_t* sb) {
  uint16_t d = 0;
  for (int k = 0; k < 4; ++k) d = static_cast<uint16_t>(d | (load_u16(sb + 48 + 2 * k) >> 12) << (4 * k));
  return d;
}

void set_iq1_m_d(uint8_t* sb, uint16_t d) {
  for (int k = 0; k < 4; ++k) {
    const uint16_t w = static_cast<uint16_t>((load_u16(sb + 48 + 2 * k) & 0x0FFF) | ((d >> (4 * k)) & 15) << 12);
    sb[48 + 2 * k] = static_cast<uint8_t>(w);
    sb[49 + 2 * k] = static_cast<uint8_t>(w >> 8);
  }
}

void dequantize_row(DType t, const void* src, float* dst, int64_t cols) {
  const auto* b = static_cast<const uint8_t*>(src);
  const int64_t block = dtype_info(t).block_elems;
  assert(cols % block == 0);
  const int64_t nb = cols / block;
  switch (t) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(cols) * sizeof(float));
      return;
    case DType::F16:
      for (int64_t j = 0; j < cols; ++j) dst[j] = fp16_to_f32(load_u16(b + 2 * j));
      return;
    case DType::BF16:
      for (int64_t j = 0; j < cols; ++j) dst[j] = bf16_to_f32(load_u16(b + 2 * j));
      return;
    case DType::Q4_0: return dequantize_q4_0(b, dst, nb);
    case DType::Q4_1: return dequantize_q4_1(b, dst, nb);
    case DType::Q5_0: return dequantize_q5_0(b, dst, nb);
    case DType::Q5_1: return dequantize_q5_1(b, dst, nb);
    case DType::Q8_0: return dequantize_q8_0(b, dst, nb);
    case DType::IQ4_NL: return dequantize_iq4_nl(b, dst, nb);
    case DType::IQ4_XS: return dequantize_iq4_xs(b, dst, nb);
    case DType::Q2_K: return dequantize_q2_K(b, dst, nb);
    case DType::Q3_K: return dequantize_q3_K(b, dst, nb);
    case DType::Q4_K: return dequantize_q4_K(b, dst, nb);
    case DType::Q5_K: return dequantize_q5_K(b, dst, nb);
    case DType::Q6_K: return dequantize_q6_K(b, dst, nb);
    case DType::IQ2_XXS: return dequantize_iq2_xxs(b, dst, nb);
    case DType::IQ2_XS: return dequantize_iq2_xs(b, dst, nb);
    case DType::IQ2_S: return dequantize_iq2_s(b, dst, nb);
    case DType::IQ3_XXS: return dequantize_iq3_xxs(b, dst, nb);
    case DType::IQ3_S: return dequantize_iq3_s(b, dst, nb);
    case DType::IQ1_S: return dequantize_iq1_s(b, dst, nb);
    case DType::IQ1_M: return dequantize_iq1_m(b, dst, nb);
  }
  throw ModelError(std::string("dequantize_row: no kernel for type ") + dtype_name(t));
}

}  // namespace specula
