// Reference dequantization: half/bfloat16 conversions and every block type, checked against
// blocks packed by hand here (the test packs chosen values; the library unpacks them).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gpu/host/iq_grids.h"
#include "gpu/host/quant.h"

namespace specula {
namespace {

void put_u16(std::vector<uint8_t>& b, size_t off, uint16_t v) {
  b[off] = static_cast<uint8_t>(v & 0xff);
  b[off + 1] = static_cast<uint8_t>(v >> 8);
}

TEST(Fp16, KnownValuesConvertBothWays) {
  EXPECT_EQ(fp16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(fp16_to_f32(0x3800), 0.5f);
  EXPECT_EQ(fp16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(fp16_to_f32(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(fp16_to_f32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_TRUE(std::signbit(fp16_to_f32(0x8000)));
  EXPECT_EQ(fp16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp16_to_f32(0x7e00)));

  EXPECT_EQ(f32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_fp16(65519.0f), 0x7bff);  // below the halfway point to 65536
  EXPECT_EQ(f32_to_fp16(65520.0f), 0x7c00);  // the tie rounds to even: overflow
  EXPECT_EQ(f32_to_fp16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);       // tie between 0 and 2^-24: even
  EXPECT_EQ(f32_to_fp16(std::ldexp(1.5f, -25)), 0x0001);       // above the tie
  EXPECT_EQ(f32_to_fp16(std::ldexp(3.0f, -25)), 0x0002);       // tie between 1 and 2: even
  EXPECT_EQ(f32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie: stays at even 1.0
  EXPECT_EQ(f32_to_fp16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie: rounds up to even
  EXPECT_TRUE(std::isnan(fp16_to_f32(f32_to_fp16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Fp16, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) continue;  // nan payloads are not kept
    ASSERT_EQ(f32_to_fp16(fp16_to_f32(static_cast<uint16_t>(h))), h) << "half 0x" << std::hex << h;
  }
}

#if defined(__FLT16_MAX__)
// The compiler's _Float16 (libgcc's soft conversion on x86 without AVX-512) is an independent
// correctly rounded implementation: compare on every half and on a million random floats.
TEST(Fp16, ConversionsAgreeWithTheCompilersFloat16) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float ours = fp16_to_f32(static_cast<uint16_t>(h));
    const float theirs = static_cast<float>(std::bit_cast<_Float16>(static_cast<uint16_t>(h)));
    if (std::isnan(theirs)) {
      ASSERT_TRUE(std::isnan(ours));
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(ours), std::bit_cast<uint32_t>(theirs)) << "half 0x" << std::hex << h;
    }
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 1000000; ++i) {
    // Spread the exponents over the half range and around it (2^-30 .. 2^18).
    uint32_t u = bits(rng);
    u = (u & 0x807fffffu) | ((97u + (u >> 23) % 48u) << 23);
    const float f = std::bit_cast<float>(u);
    ASSERT_EQ(f32_to_fp16(f), std::bit_cast<uint16_t>(static_cast<_Float16>(f))) << "float " << f;
  }
}
#endif

TEST(Bf16, ConvertsAndRoundsToNearestEven) {
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0xc040), -3.0f);
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
}

TEST(Dequantize, FloatTypesConvertEachValue) {
  const float f32[3] = {1.5f, -2.0f, 0.25f};
  float out[3];
  dequantize_row(DType::F32, f32, out, 3);
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[2], 0.25f);
  const uint16_t f16[3] = {0x3c00, 0xc000, 0x3400};  // 1, -2, 0.25
  dequantize_row(DType::F16, f16, out, 3);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 0.25f);
  const uint16_t bf16[3] = {0x3f80, 0xc000, 0x3e80};  // 1, -2, 0.25
  dequantize_row(DType::BF16, bf16, out, 3);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 0.25f);
}

// Packs 32 nibbles the GGUF way: value j < 16 in the low nibble of byte j, j + 16 in the high.
void pack_nibbles(const int q[32], uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
}

TEST(Dequantize, Q4_0SubtractsEightAndScales) {
  // Two blocks: d = 0.5 and d = -2; nibble values chosen to hit 0, 8 and 15.
  std::vector<uint8_t> b(36);
  int q[2][32];
  for (int j = 0; j < 32; ++j) q[0][j] = j % 16, q[1][j] = 15 - (j * 7) % 16;
  put_u16(b, 0, 0x3800);   // 0.5
  put_u16(b, 18, 0xc000);  // -2
  pack_nibbles(q[0], &b[2]);
  pack_nibbles(q[1], &b[20]);
  float y[64];
  dequantize_row(DType::Q4_0, b.data(), y, 64);
  EXPECT_EQ(y[0], -4.0f);   // (0 - 8) * 0.5
  EXPECT_EQ(y[8], 0.0f);    // (8 - 8) * 0.5
  EXPECT_EQ(y[15], 3.5f);   // (15 - 8) * 0.5
  EXPECT_EQ(y[32], -14.0f);  // (15 - 8) * -2
  for (int k = 0; k < 2; ++k)
    for (int j = 0; j < 32; ++j) EXPECT_EQ(y[32 * k + j], (q[k][j] - 8) * (k == 0 ? 0.5f : -2.0f)) << k << "," << j;
}

TEST(Dequantize, Q4_1ScalesAndAddsTheMinimum) {
  std::vector<uint8_t> b(20);
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = (j * 5) % 16;
  put_u16(b, 0, 0x3400);  // d = 0.25
  put_u16(b, 2, 0xbc00);  // m = -1
  pack_nibbles(q, &b[4]);
  float y[32];
  dequantize_row(DType::Q4_1, b.data(), y, 32);
  EXPECT_EQ(y[0], -1.0f);       // 0 * 0.25 - 1
  EXPECT_EQ(y[3], 2.75f);       // 15 * 0.25 - 1
  EXPECT_EQ(y[16], -1.0f);      // q[16] = 80 % 16 = 0
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], q[j] * 0.25f - 1.0f) << j;
}

// Q5_0: a fifth bit per value above its nibble (bit j of qh for value j), then minus 16. Packed
// by hand as ggml's quantize_row_q5_0 does.
TEST(Dequantize, Q5_0JoinsTheFifthBitAboveEachNibbleAndSubtractsSixteen) {
  std::vector<uint8_t> b(22);
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = (j * 11 + 3) % 32;  // every value 0..31 once
  put_u16(b, 0, 0xb800);  // d = -0.5
  uint32_t qh = 0;
  for (int j = 0; j < 32; ++j) qh |= static_cast<uint32_t>(q[j] >> 4) << j;
  for (int k = 0; k < 4; ++k) b[2 + k] = static_cast<uint8_t>(qh >> (8 * k));
  for (int j = 0; j < 16; ++j) b[6 + j] = static_cast<uint8_t>((q[j] & 15) | (q[j + 16] & 15) << 4);
  float y[32];
  dequantize_row(DType::Q5_0, b.data(), y, 32);
  EXPECT_EQ(y[0], -0.5f * (3 - 16));
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], -0.5f * (q[j] - 16)) << j;
}

// Q5_1: Q5_0's five-bit quants (no offset), times d plus the minimum m.
TEST(Dequantize, Q5_1JoinsTheFifthBitAboveEachNibbleScalesAndAddsTheMinimum) {
  std::vector<uint8_t> b(24);
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = (j * 13 + 5) % 32;  // every value 0..31 once
  put_u16(b, 0, 0x3400);  // d = 0.25
  put_u16(b, 2, 0xbc00);  // m = -1
  uint32_t qh = 0;
  for (int j = 0; j < 32; ++j) qh |= static_cast<uint32_t>(q[j] >> 4) << j;
  for (int k = 0; k < 4; ++k) b[4 + k] = static_cast<uint8_t>(qh >> (8 * k));
  for (int j = 0; j < 16; ++j) b[8 + j] = static_cast<uint8_t>((q[j] & 15) | (q[j + 16] & 15) << 4);
  float y[32];
  dequantize_row(DType::Q5_1, b.data(), y, 32);
  EXPECT_EQ(y[0], 0.25f * 5 - 1.0f);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 0.25f * q[j] - 1.0f) << j;
}

// IQ4_NL: each nibble indexes ggml's sixteen non-linear levels, times d.
TEST(Dequantize, IQ4_NLLooksEachNibbleUpInTheSixteenLevelsAndScales) {
  const int levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  std::vector<uint8_t> b(18);
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = (j * 7 + 3) % 16;
  put_u16(b, 0, 0x3400);  // d = 0.25
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(q[j] | q[j + 16] << 4);
  float y[32];
  dequantize_row(DType::IQ4_NL, b.data(), y, 32);
  EXPECT_EQ(y[0], 0.25f * -65);  // index 3
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 0.25f * levels[q[j]]) << j;
}

// IQ4_XS: eight IQ4_NL sub-blocks under one fp16 d, sub-block j scaled by d * (ls - 32), ls's low
// nibble in byte 4 + j / 2 (the high one for odd j) and its top two bits at bit 2j of the u16 at 2.
TEST(Dequantize, IQ4_XSScalesEachSubBlockOfLevelsByItsSixBitScale) {
  const int levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  std::vector<uint8_t> b(136);
  put_u16(b, 0, 0x3400);  // d = 0.25
  const int ls[8] = {0, 63, 32, 33, 31, 17, 48, 5};
  uint16_t high = 0;
  for (int j = 0; j < 8; ++j) {
    b[4 + j / 2] = static_cast<uint8_t>(b[4 + j / 2] | (ls[j] & 15) << (4 * (j % 2)));
    high = static_cast<uint16_t>(high | (ls[j] >> 4) << (2 * j));
  }
  put_u16(b, 2, high);
  int q[256];
  for (int v = 0; v < 256; ++v) q[v] = (v * 5 + 1) % 16;
  for (int j = 0; j < 8; ++j)
    for (int l = 0; l < 16; ++l) b[8 + 16 * j + l] = static_cast<uint8_t>(q[32 * j + l] | q[32 * j + l + 16] << 4);
  float y[256];
  dequantize_row(DType::IQ4_XS, b.data(), y, 256);
  EXPECT_EQ(y[0], 0.25f * -32 * -104);  // ls 0, index 1
  EXPECT_EQ(y[32], 0.25f * 31 * -104);   // ls 63, index 1
  for (int v = 0; v < 256; ++v) EXPECT_EQ(y[v], 0.25f * static_cast<float>(ls[v / 32] - 32) * levels[q[v]]) << v;
}

// Q2_K: sixteen 16-value sub-blocks, sub-block j's 4-bit scale in the low nibble of byte j and its
// 4-bit min in the high one; the 2-bit quants of values 128h + 32p + l at bits 2p of byte 16 + 32h + l;
// fp16 d and dmin last. Value v is d * sc * q - dmin * m.
TEST(Dequantize, Q2_KScalesAndOffsetsEachSixteenValuesByTheirFourBitScaleAndMin) {
  std::vector<uint8_t> b(84);
  put_u16(b, 80, 0x3400);  // d = 0.25
  put_u16(b, 82, 0x3800);  // dmin = 0.5
  const int sc[16] = {0, 15, 1, 7, 3, 9, 2, 11, 4, 13, 5, 6, 8, 10, 12, 14};
  const int m[16] = {15, 0, 3, 1, 7, 2, 9, 4, 11, 5, 13, 6, 8, 10, 12, 14};
  for (int j = 0; j < 16; ++j) b[j] = static_cast<uint8_t>(sc[j] | m[j] << 4);
  int q[256];
  for (int v = 0; v < 256; ++v) q[v] = (v * 7 + v / 64) % 4;
  for (int v = 0; v < 256; ++v) b[16 + 32 * (v / 128) + v % 32] = static_cast<uint8_t>(b[16 + 32 * (v / 128) + v % 32] | q[v] << (2 * ((v % 128) / 32)));
  float y[256];
  dequantize_row(DType::Q2_K, b.data(), y, 256);
  EXPECT_EQ(y[0], -7.5f);           // sc 0, m 15
  EXPECT_EQ(y[17], 0.25f * 15 * q[17]);  // sc 15, m 0
  for (int v = 0; v < 256; ++v)
    EXPECT_EQ(y[v], 0.25f * static_cast<float>(sc[v / 16]) * static_cast<float>(q[v]) - 0.5f * static_cast<float>(m[v / 16])) << v;
}

// IQ2_XXS: per 32 values, four grid indices (bytes), then a u32 of four 7-bit sign indices under
// a 4-bit scale s: value = d (0.5 + s) / 4 * grid[index][j], negated where the sign pattern says.
TEST(Dequantize, IQ2_XXSTakesEachGroupOfEightFromTheGridWithItsSignPatternAndTheSubBlockScale) {
  std::vector<uint8_t> b(66);
  put_u16(b, 0, 0x3800);  // d = 0.5
  const uint8_t idx[4] = {1, 2, 255, 0};
  const uint32_t sign[4] = {0, 1, 127, 5};
  for (int ib = 0; ib < 8; ++ib) {
    for (int l = 0; l < 4; ++l) b[2 + 8 * ib + l] = static_cast<uint8_t>(idx[l] + ib);
    const uint32_t aux = sign[0] | sign[1] << 7 | sign[2] << 14 | sign[3] << 21 | static_cast<uint32_t>(ib + 3) << 28;
    for (int k = 0; k < 4; ++k) b[2 + 8 * ib + 4 + k] = static_cast<uint8_t>(aux >> (8 * k));
  }
  float y[256];
  dequantize_row(DType::IQ2_XXS, b.data(), y, 256);
  EXPECT_EQ(y[0], 0.4375f * 43.0f);  // d (0.5 + 3) / 4, grid entry 1's first value 43, sign pattern 0
  EXPECT_EQ(y[8], -0.4375f * static_cast<float>(iq::kIq2xxsGrid[2][0]));  // pattern 1 = 0x81: values 0 and 7 negative
  EXPECT_EQ(y[15], -0.4375f * static_cast<float>(iq::kIq2xxsGrid[2][7]));
  EXPECT_EQ(y[9], 0.4375f * static_cast<float>(iq::kIq2xxsGrid[2][1]));
  for (int v = 0; v < 256; ++v) {
    const int ib = v / 32, l = (v % 32) / 8, j = v % 8;
    const float db = 0.5f * (0.5f + static_cast<float>(ib + 3)) * 0.25f;
    const bool negative = (iq::kIqSigns[sign[l]] >> j) & 1;
    EXPECT_EQ(y[v], db * static_cast<float>(iq::kIq2xxsGrid[(idx[l] + ib) % 256][j]) * (negative ? -1.0f : 1.0f)) << v;
  }
}

// IQ1_M: no d of its own: fp16 d is the top nibbles of the four scale words (lowest nibble in word 0),
// each word four 3-bit scales (one per 16 values), and per 8 values a nibble of three index bits
// and delta's sign: value = d (2 s + 1) (grid[index][j] +- 1/8).
TEST(Dequantize, IQ1_MGathersItsScaleFromFourNibblesAndOffsetsEachGroupByItsDelta) {
  std::vector<uint8_t> b(56);
  const uint16_t d = 0x3400;  // 0.25
  for (int g = 0; g < 32; ++g) b[g] = static_cast<uint8_t>(7 * g + 3);
  for (int i = 0; i < 16; ++i) b[32 + i] = static_cast<uint8_t>((i % 8) | (i % 3 == 0 ? 8 : 0) | ((7 - i % 8) | (i % 2 ? 8 : 0)) << 4);
  for (int k = 0; k < 4; ++k) {
    uint16_t w = static_cast<uint16_t>(((d >> (4 * k)) & 15) << 12);
    for (int s = 0; s < 4; ++s) w = static_cast<uint16_t>(w | ((4 * k + s) % 8) << (3 * s));
    put_u16(b, 48 + 2 * k, w);
  }
  float y[256];
  dequantize_row(DType::IQ1_M, b.data(), y, 256);
  for (int v = 0; v < 256; ++v) {
    const int g = v / 8, scale = (g / 2) % 8;  // group g's scale is scale number g / 2
    const int nib = g % 2 ? b[32 + g / 2] >> 4 : b[32 + g / 2] & 15;
    const int index = b[g] | (nib & 7) << 8;
    const float delta = nib & 8 ? -0.125f : 0.125f;
    EXPECT_EQ(y[v], 0.25f * static_cast<float>(2 * scale + 1) * (static_cast<float>(iq::kIq1sGrid[index][v % 8]) + delta)) << v;
  }
}

TEST(Dequantize, Q8_0ScalesSignedBytes) {
  std::vector<uint8_t> b(34);
  put_u16(b, 0, 0x4000);  // d = 2
  for (int j = 0; j < 31; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j * 8 - 128));  // -128 .. 112
  b[2 + 31] = 127;
  float y[32];
  dequantize_row(DType::Q8_0, b.data(), y, 32);
  EXPECT_EQ(y[0], -256.0f);
  EXPECT_EQ(y[31], 254.0f);
  for (int j = 0; j < 31; ++j) EXPECT_EQ(y[j], 2.0f * (j * 8 - 128)) << j;
}

// Q4_K: y = d * sc[s] * q - dmin * m[s] for sub-block s = i / 32; six-bit scales and mins
// packed as ggml's quantize_row_q4_K does (the inverse of get_scale_min_k4).
// Eight 6-bit scales and mins into a K-quant super-block's 12 bytes, as ggml packs them.
void put_scales_mins_k4(const int sc[8], const int mn[8], uint8_t* scales) {
  for (int j = 0; j < 4; ++j) {
    scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    scales[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
}

TEST(Dequantize, Q4_KUnpacksSixBitScalesAndMinsPerSubBlock) {
  const int sc[8] = {1, 63, 17, 32, 5, 48, 33, 62};
  const int mn[8] = {0, 7, 63, 40, 16, 31, 2, 59};
  int q[256];
  for (int i = 0; i < 256; ++i) q[i] = (i * 11 + i / 32) % 16;
  std::vector<uint8_t> b(144);
  put_u16(b, 0, 0x3800);  // d = 0.5
  put_u16(b, 2, 0x3400);  // dmin = 0.25
  put_scales_mins_k4(sc, mn, &b[4]);
  uint8_t* qs = &b[16];
  for (int c = 0; c < 4; ++c)  // 64 values per 32 bytes: low nibbles first, then high
    for (int l = 0; l < 32; ++l) qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
  float y[256];
  dequantize_row(DType::Q4_K, b.data(), y, 256);
  EXPECT_EQ(y[0], 0.5f * 1 * q[0] - 0.0f);
  EXPECT_EQ(y[32], 0.5f * 63 * q[32] - 0.25f * 7);
  EXPECT_EQ(y[255], 0.5f * 62 * q[255] - 0.25f * 59);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], 0.5f * sc[i / 32] * q[i] - 0.25f * mn[i / 32]) << i;
}

// Q6_K: y = d * scale[i / 16] * (q - 32), q six bits split into ql (low 4) and qh (high 2).
// Q5_K: Q4_K's scales, mins and nibbles, and the fifth bit of value l of sub-block j in bit j of
// qh[l]. Packed by hand as ggml's quantize_row_q5_K lays a block out.
TEST(Dequantize, Q5_KJoinsTheFifthBitsAndUnpacksSixBitScalesAndMinsPerSubBlock) {
  const int sc[8] = {2, 63, 17, 32, 5, 48, 33, 61};
  const int mn[8] = {1, 7, 63, 40, 16, 31, 0, 59};
  int q[256];
  for (int i = 0; i < 256; ++i) q[i] = (i * 13 + i / 32) % 32;
  std::vector<uint8_t> b(176);
  put_u16(b, 0, 0x3800);  // d = 0.5
  put_u16(b, 2, 0x3400);  // dmin = 0.25
  put_scales_mins_k4(sc, mn, &b[4]);
  uint8_t* qh = &b[16];
  uint8_t* qs = &b[48];
  for (int i = 0; i < 256; ++i) qh[i % 32] = static_cast<uint8_t>(qh[i % 32] | (q[i] >> 4) << (i / 32));
  for (int c = 0; c < 4; ++c)  // 64 values per 32 bytes: low nibbles first, then high
    for (int l = 0; l < 32; ++l) qs[32 * c + l] = static_cast<uint8_t>((q[64 * c + l] & 15) | (q[64 * c + 32 + l] & 15) << 4);
  float y[256];
  dequantize_row(DType::Q5_K, b.data(), y, 256);
  EXPECT_EQ(y[0], 0.5f * 2 * q[0] - 0.25f * 1);
  EXPECT_EQ(y[255], 0.5f * 61 * q[255] - 0.25f * 59);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], 0.5f * sc[i / 32] * q[i] - 0.25f * mn[i / 32]) << i;
}

// Q3_K: per 128 values four 2-bit planes of 32 bytes, a third bit per value in hmask (bit v / 32
// of byte v % 32, set meaning no -4), sixteen 6-bit scales minus 32, d last. Packed by hand as
// ggml's quantize_row_q3_K lays a block out.
TEST(Dequantize, Q3_KJoinsTheThirdBitAndAppliesSixBitScalesMinusThirtyTwo) {
  int q[256], s[16];
  for (int v = 0; v < 256; ++v) q[v] = (v * 5 + v / 16) % 8;  // q - 4 is the value's multiple
  for (int j = 0; j < 16; ++j) s[j] = (j * 23 + 1) % 64;    // every scale 0..63 reachable
  std::vector<uint8_t> b(110);
  for (int v = 0; v < 256; ++v) {
    b[32 + 32 * (v / 128) + v % 32] = static_cast<uint8_t>(b[32 + 32 * (v / 128) + v % 32] | (q[v] & 3) << (2 * ((v % 128) / 32)));
    b[v % 32] = static_cast<uint8_t>(b[v % 32] | (q[v] >> 2) << (v / 32));
  }
  for (int j = 0; j < 16; ++j) {
    b[96 + j % 8] = static_cast<uint8_t>(b[96 + j % 8] | (s[j] & 15) << (j < 8 ? 0 : 4));
    b[104 + j % 4] = static_cast<uint8_t>(b[104 + j % 4] | (s[j] >> 4) << (2 * (j / 4)));
  }
  put_u16(b, 108, 0x3800);  // d = 0.5
  float y[256];
  dequantize_row(DType::Q3_K, b.data(), y, 256);
  EXPECT_EQ(y[0], 0.5f * (1 - 32) * (0 - 4));
  for (int v = 0; v < 256; ++v) EXPECT_EQ(y[v], 0.5f * (s[v / 16] - 32) * (q[v] - 4)) << v;
}

TEST(Dequantize, Q6_KJoinsLowAndHighBitsAndAppliesSignedScales) {
  int q[256];
  for (int i = 0; i < 256; ++i) q[i] = (i * 37 + 5) % 64;
  q[0] = 0;
  q[1] = 63;
  int8_t scales[16];
  for (int s = 0; s < 16; ++s) scales[s] = static_cast<int8_t>((s % 2 ? -1 : 1) * (s * 8 + 1));
  std::vector<uint8_t> b(210);
  for (int h = 0; h < 2; ++h) {
    const int* v = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      b[64 * h + l] = static_cast<uint8_t>((v[l] & 15) | ((v[l + 64] & 15) << 4));
      b[64 * h + 32 + l] = static_cast<uint8_t>((v[l + 32] & 15) | ((v[l + 96] & 15) << 4));
      b[128 + 32 * h + l] = static_cast<uint8_t>((v[l] >> 4) | ((v[l + 32] >> 4) << 2) | ((v[l + 64] >> 4) << 4) | ((v[l + 96] >> 4) << 6));
    }
  }
  std::memcpy(&b[192], scales, 16);
  put_u16(b, 208, 0x3400);  // d = 0.25
  float y[256];
  dequantize_row(DType::Q6_K, b.data(), y, 256);
  EXPECT_EQ(y[0], 0.25f * 1 * -32);
  EXPECT_EQ(y[1], 0.25f * 1 * 31);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], 0.25f * scales[i / 16] * (q[i] - 32)) << i;
}

// Loading converts the types no kernel reads (model/tensor.h, kernel_view): Q5_0 and IQ4_NL to
// Q8_0, Q3_K to Q6_K, every value the same float, in a new buffer the caller keeps; a type the
// kernels read is passed through as it is.
TEST(KernelView, EachTypeNoKernelReadsBecomesOneTheyReadWithEveryValueTheSame) {
  struct Case {
    DType from, to;
    size_t d_offset;  // where the block's fp16 scale sits
  };
  for (const Case c : {Case{DType::Q5_0, DType::Q8_0, 0}, Case{DType::IQ4_NL, DType::Q8_0, 0}, Case{DType::Q3_K, DType::Q6_K, 108}}) {
    SCOPED_TRACE(dtype_name(c.from));
    const int64_t rows = 7, cols = 512;
    const size_t from_bytes = static_cast<size_t>(dtype_info(c.from).block_bytes);
    std::vector<std::byte> bytes(dtype_row_bytes(c.from, cols) * rows);
    std::mt19937 rng(5);
    for (auto& x : bytes) x = std::byte(static_cast<uint8_t>(rng()));
    for (size_t o = 0; o < bytes.size(); o += from_bytes) {  // finite scales of either sign, some subnormal
      const uint16_t d = static_cast<uint16_t>(rng() % 0x7bff) | static_cast<uint16_t>(rng() & 0x8000);
      std::memcpy(&bytes[o + c.d_offset], &d, 2);
    }
    const std::vector<std::byte> before = bytes;
    const TensorView stored{"blk.0.attn_q.weight", c.from, {rows, cols}, bytes.data(), bytes.size()};
    std::vector<std::shared_ptr<const void>> storage;
    const TensorView read = kernel_view(stored, storage);
    ASSERT_EQ(read.dtype, c.to);
    EXPECT_EQ(read.name, stored.name);
    EXPECT_EQ(read.shape, stored.shape);
    EXPECT_EQ(read.nbytes, dtype_row_bytes(c.to, cols) * rows);
    EXPECT_EQ(storage.size(), 1u);
    EXPECT_EQ(bytes, before);  // the stored tensor (a mapped file, at load) is not written
    std::vector<float> want(static_cast<size_t>(cols)), got(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(c.from, stored.row(r), want.data(), cols);
      dequantize_row(c.to, read.row(r), got.data(), cols);
      for (int64_t j = 0; j < cols; ++j)
        ASSERT_EQ(std::bit_cast<uint32_t>(got[j]), std::bit_cast<uint32_t>(want[j])) << "row " << r << ", value " << j;
    }
    const TensorView same = kernel_view(read, storage);
    EXPECT_EQ(same.data, read.data);
    EXPECT_EQ(storage.size(), 1u);
  }
}

}  // namespace
}  // namespace specula
