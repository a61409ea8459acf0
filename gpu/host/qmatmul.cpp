// The int8 path's packing, activation quantizer, portable kernels and dispatch; the AVX2
// kernels are in qmatmul_avx2.cpp (the only file of the path built with AVX2).
#include "gpu/host/qmatmul.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/host/quant.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace specula {

namespace {

constexpr int64_t kGroupRows = 8;
constexpr int64_t kBlock = 32;

// The packed layout of one group-block (8 rows x 32 columns).
struct PackShape {
  size_t header = 0;   // d[8] (+ m[8]) bytes before the quants (16 / 32 / 16)
  size_t packed = 0;   // header + 8 rows of quants: 8 stored blocks' bytes
};

PackShape pack_shape(DType t) {
  switch (t) {
    case DType::Q4_0: return {16, 144};
    case DType::Q4_1: return {32, 160};
    case DType::Q8_0: return {16, 272};
    case DType::Q5_0: return {16, 176};  // d[8] fp16 | 4 x 32 bytes of nibbles | 8 x 4 bytes of fifth bits
    case DType::IQ4_NL: return {16, 144};  // d[8] fp16 | 4 x 32 bytes of nibbles: indices of the levels
    case DType::IQ4_XS: return {32, 160};  // d[8] f32 | IQ4_NL's nibbles
    case DType::Q3_K: return {32, 160};    // Q6_K's header | 4 x 32 bytes of nibbles of the 3-bit q
    case DType::Q2_K: return {48, 112};    // d[8] | -dmin[8] fp16 | sc | m << 4 [8] x 2 | 2 x 32 bytes of 2-bit q
    case DType::Q5_1: return {32, 192};  // d[8] fp16 | m[8] fp16 | 4 x 32 bytes of nibbles | 8 x 4 bytes of fifth bits
    case DType::Q4_K: return {64, 192};  // d[8] f32 | m[8] f32 | 4 x 32 bytes: Q4_1's layout with exact scales
    case DType::Q5_K: return {64, 224};  // Q4_K's layout | 8 x 4 bytes of fifth bits
    case DType::Q6_K: return {32, 288};  // d[8] fp16 | s_lo[8] | s_hi[8] | 8 x 32 bytes of q
    default: throw std::invalid_argument(std::string("int8 path: no packed layout for ") + dtype_name(t));
  }
}

// One group-block: the 8 rows' stored blocks at src[r] (nullptr for a padding row) into dst. An
// IQ4_NL block is Q4_0's (fp16 d, 16 bytes of nibbles in the same order), its nibbles indices of
// levels instead of q + 8, so it packs as Q4_0 does.
void pack_block(DType t, const uint8_t* const src[kGroupRows], uint8_t* dst) {
  const PackShape s = pack_shape(t);
  std::memset(dst, 0, s.packed);
  for (int64_t r = 0; r < kGroupRows; ++r) {
    const uint8_t* b = src[r];
    if (b == nullptr) continue;
    std::memcpy(dst + 2 * r, b, 2);                             // d
    if (t == DType::Q4_1) std::memcpy(dst + 16 + 2 * r, b + 2, 2);  // m
    const uint8_t* qs = b + (t == DType::Q4_1 ? 4 : 2);
    const int64_t vectors = t == DType::Q8_0 ? 8 : 4;
    for (int64_t k = 0; k < vectors; ++k) std::memcpy(dst + s.header + 32 * k + 4 * r, qs + 4 * k, 4);
  }
}

// Row r's 32 five-bit quants u (0..31) of a group-block whose quants start at `quants`: the low 4
// bits as Q4_0's nibbles (byte k holds columns k and k + 16), the fifth bit as bit 4r + i of word c
// for column 4c + i (the words are stored after the nibbles by the caller).
void put_five_bit_row(const uint8_t u[32], int64_t r, uint8_t* quants, uint32_t words[8]) {
  for (int64_t k = 0; k < 4; ++k)
    for (int64_t i = 0; i < 4; ++i)
      quants[32 * k + 4 * r + i] = static_cast<uint8_t>((u[4 * k + i] & 15) | (u[16 + 4 * k + i] & 15) << 4);
  for (int c = 0; c < 8; ++c)
    for (int i = 0; i < 4; ++i) words[c] |= static_cast<uint32_t>(u[4 * c + i] >> 4) << (4 * r + i);
}

// One group-block of a five-bit layout (Q5_0, Q5_1, Q5_K) from the 8 rows' blocks at src[r]
// (nullptr: padding): Q5_0 from Q8_0 blocks whose quants q all lie in -16..15 (a Q5_0 matrix's,
// converted: convert_block; u = q + 16); Q5_1 from its own blocks (fp16 d and m, u = nibble | bit
// j of qh << 4); Q5_K from sub-block j of the super-blocks, with f32 scales as Q4_K has them
// (d' = d * sc, m' = -dmin * m).
void pack_block_five_bit(DType t, const uint8_t* const src[kGroupRows], int j, uint8_t* dst) {
  const PackShape s = pack_shape(t);
  std::memset(dst, 0, s.packed);
  uint32_t words[8] = {};
  for (int64_t r = 0; r < kGroupRows; ++r) {
    const uint8_t* b = src[r];
    if (b == nullptr) continue;
    uint8_t u[32];
    if (t == DType::Q5_K) {
      float d, m;
      q5_k_subblock(b, j, &d, &m, u);
      m = -m;
      std::memcpy(dst + 4 * r, &d, 4);
      std::memcpy(dst + 32 + 4 * r, &m, 4);
    } else if (t == DType::Q5_1) {
      float d, m;
      q5_1_block(b, &d, &m, u);
      std::memcpy(dst + 2 * r, b, 2);  // d and m as stored (fp16)
      std::memcpy(dst + 16 + 2 * r, b + 2, 2);
    } else {
      std::memcpy(dst + 2 * r, b, 2);
      for (int v = 0; v < 32; ++v) u[v] = static_cast<uint8_t>(static_cast<int8_t>(b[2 + v]) + 16);
    }
    put_five_bit_row(u, r, dst + s.header, words);
  }
  std::memcpy(dst + s.header + kNibbleBytes, words, sizeof words);
}

// One IQ4_XS group-block: sub-block j of the super-blocks at src[r] (nullptr: padding), as IQ4_NL's
// layout with f32 scales d * (ls - 32) (exact): the sub-block's 16 stored bytes are already IQ4_NL's
// (byte k holds indices k and k + 16).
void pack_block_iq4_xs(const uint8_t* const src[kGroupRows], int j, uint8_t* dst) {
  std::memset(dst, 0, 160);
  for (int64_t r = 0; r < kGroupRows; ++r) {
    const uint8_t* b = src[r];
    if (b == nullptr) continue;
    const float d = iq4_xs_subblock_scale(b, j);
    std::memcpy(dst + 4 * r, &d, 4);
    for (int64_t k = 0; k < 4; ++k) std::memcpy(dst + 32 + 32 * k + 4 * r, b + 8 + 16 * j + 4 * k, 4);
  }
}

// One Q4_K group-block: sub-block j of the super-blocks at src[r] (nullptr: padding), as Q4_1
// with f32 scales: d' = d * sc, m' = -dmin * m (value = d' * q + m'), nibble byte k holding
// values k and k + 16, as Q4_1 stores them.
void pack_block_q4_k(const uint8_t* const src[kGroupRows], int j, uint8_t* dst) {
  std::memset(dst, 0, 192);
  for (int64_t r = 0; r < kGroupRows; ++r) {
    if (src[r] == nullptr) continue;
    float d, m;
    uint8_t q[32], b[16];
    q4_k_subblock(src[r], j, &d, &m, q);
    m = -m;
    std::memcpy(dst + 4 * r, &d, 4);
    std::memcpy(dst + 32 + 4 * r, &m, 4);
    for (int k = 0; k < 16; ++k) b[k] = static_cast<uint8_t>(q[k] | (q[k + 16] << 4));
    for (int64_t k = 0; k < 4; ++k) std::memcpy(dst + 64 + 32 * k + 4 * r, b + 4 * k, 4);
  }
}

// One Q6_K group-block: block jb (0..7) of the super-blocks at src[r] (nullptr: padding).
void pack_block_q6_k(const uint8_t* const src[kGroupRows], int jb, uint8_t* dst) {
  std::memset(dst, 0, 288);
  for (int64_t r = 0; r < kGroupRows; ++r) {
    if (src[r] == nullptr) continue;
    uint8_t q[256];
    int8_t sc[16];
    float d;
    q6_k_superblock(src[r], q, sc, &d);
    const uint16_t h = f32_to_fp16(d);  // d came from fp16: exact
    std::memcpy(dst + 2 * r, &h, 2);
    dst[16 + r] = static_cast<uint8_t>(sc[2 * jb]);
    dst[24 + r] = static_cast<uint8_t>(sc[2 * jb + 1]);
    for (int64_t c = 0; c < 8; ++c) std::memcpy(dst + 32 + 32 * c + 4 * r, q + 32 * jb + 4 * c, 4);
  }
}

// One Q3_K group-block from the 8 rows' Q6_K blocks at src[r] (a Q3_K matrix's, converted:
// convert_block, q6 = q + 28): Q6_K's header (d, s_lo, s_hi) and the 3-bit q = q6 - 28 as nibbles in
// Q4_0's order (byte k of row r in vector k holds columns 4k + i and 16 + 4k + i).
void pack_block_q3_k(const uint8_t* const src[kGroupRows], int jb, uint8_t* dst) {
  uint8_t q6[288];
  pack_block_q6_k(src, jb, q6);
  std::memcpy(dst, q6, 32);
  for (int64_t k = 0; k < 4; ++k)
    for (int64_t i = 0; i < 32; ++i) {  // lane byte i: row i / 4, column 4k + i % 4 (and 16 more)
      const uint8_t lo = q6[32 + 32 * k + i], hi = q6[32 + 32 * (k + 4) + i];
      dst[32 + 32 * k + i] = static_cast<uint8_t>((lo == 0 ? 0 : lo - 28) | (hi == 0 ? 0 : hi - 28) << 4);  // padding: 0
    }
}

// One Q2_K group-block: block jb (0..7) of the super-blocks at src[r] (nullptr: padding), i.e. their
// sub-blocks 2 jb (columns 0..15) and 2 jb + 1 (16..31). The header is the file's d, its dmin with
// the sign flipped (exact), and the two sub-blocks' scale | min << 4 bytes as stored; the 2-bit q of
// column j (value 32 jb + j of the super-block) goes to bits 2 ((j % 16) / 4) of row r's byte j % 4
// in vector j / 16, so that unpacked vector c = 4 (j / 16) + (j % 16) / 4 holds columns 4c..4c+3
// as every layout's vector c does.
void pack_block_q2_k(const uint8_t* const src[kGroupRows], int jb, uint8_t* dst) {
  std::memset(dst, 0, 112);
  for (int64_t r = 0; r < kGroupRows; ++r) {
    const uint8_t* b = src[r];
    if (b == nullptr) continue;
    std::memcpy(dst + 2 * r, b + 80, 2);
    uint16_t nd;
    std::memcpy(&nd, b + 82, 2);
    nd ^= 0x8000u;
    std::memcpy(dst + 16 + 2 * r, &nd, 2);
    dst[32 + r] = b[2 * jb];
    dst[40 + r] = b[2 * jb + 1];
    for (int j = 0; j < 32; ++j) {
      const int q = two_bit_quant(b + 16, 32 * jb + j);
      dst[48 + 32 * (j / 16) + 4 * r + j % 4] |= static_cast<uint8_t>(q << (2 * ((j % 16) / 4)));
    }
  }
}

float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_f32(h);
}

float f32_at(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

// The portable kernels: the same arithmetic as the AVX2 ones, one output at a time.
template <DType T>
void portable_packed(const PackedMatrix& m, const QuantizedRows& x, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  const PackShape s = pack_shape(T);
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* gp = m.group(g);
    for (int64_t r = 0; r < kGroupRows && g * kGroupRows + r < m.rows; ++r) {
      for (int64_t i = 0; i < x.n; ++i) {
        const int8_t* xq = x.qrow(i);
        float acc = 0.0f;
        for (int64_t b = 0; b < m.blocks; ++b) {
          const uint8_t* blk = gp + static_cast<size_t>(b) * m.block_bytes;
          const uint8_t* qs = blk + s.header;
          const int8_t* xb = xq + b * kBlock;
          int32_t sum = 0;
          if constexpr (T == DType::Q6_K) {
            int32_t lo = 0, hi = 0;
            for (int64_t c = 0; c < 8; ++c)
              for (int64_t j = 0; j < 4; ++j) (c < 4 ? lo : hi) += qs[32 * c + 4 * r + j] * static_cast<int32_t>(xb[4 * c + j]);
            const size_t xi = static_cast<size_t>(i * x.blocks + b);
            const int32_t xlo = x.isum_lo[xi], xhi = x.isum[xi] - xlo;
            sum = static_cast<int8_t>(blk[16 + r]) * (lo - 32 * xlo) + static_cast<int8_t>(blk[24 + r]) * (hi - 32 * xhi);
          } else if constexpr (T == DType::Q3_K) {  // Q6_K's sums with q - 4 for q6 - 32
            int32_t lo = 0, hi = 0;
            for (int64_t k = 0; k < 4; ++k)
              for (int64_t j = 0; j < 4; ++j) {
                const uint8_t v = qs[32 * k + 4 * r + j];
                lo += (v & 0x0F) * static_cast<int32_t>(xb[4 * k + j]);
                hi += (v >> 4) * static_cast<int32_t>(xb[16 + 4 * k + j]);
              }
            const size_t xi = static_cast<size_t>(i * x.blocks + b);
            const int32_t xlo = x.isum_lo[xi], xhi = x.isum[xi] - xlo;
            sum = static_cast<int8_t>(blk[16 + r]) * (lo - 4 * xlo) + static_cast<int8_t>(blk[24 + r]) * (hi - 4 * xhi);
          } else if constexpr (T == DType::Q2_K) {  // sum (sc q) x over both sub-blocks; the mins below
            for (int64_t c = 0; c < 8; ++c)
              for (int64_t j = 0; j < 4; ++j) {
                const int32_t q = (qs[32 * (c / 4) + 4 * r + j] >> (2 * (c % 4))) & 3;
                sum += (blk[(c < 4 ? 32 : 40) + r] & 15) * q * static_cast<int32_t>(xb[4 * c + j]);
              }
          } else if constexpr (T == DType::Q8_0) {
            for (int64_t c = 0; c < 8; ++c)
              for (int64_t j = 0; j < 4; ++j)
                sum += static_cast<int8_t>(qs[32 * c + 4 * r + j]) * static_cast<int32_t>(xb[4 * c + j]);
          } else if constexpr (T == DType::IQ4_NL || T == DType::IQ4_XS) {
            for (int64_t k = 0; k < 4; ++k)
              for (int64_t j = 0; j < 4; ++j) {
                const uint8_t v = qs[32 * k + 4 * r + j];
                sum += kIq4NlLevels[v & 0x0F] * static_cast<int32_t>(xb[4 * k + j]) + kIq4NlLevels[v >> 4] * static_cast<int32_t>(xb[16 + 4 * k + j]);
              }
          } else {
            uint32_t five[8] = {};
            if constexpr (is_five_bit(T)) std::memcpy(five, blk + s.header + kNibbleBytes, sizeof five);
            for (int64_t k = 0; k < 4; ++k)
              for (int64_t j = 0; j < 4; ++j) {
                const uint8_t v = qs[32 * k + 4 * r + j];
                const int32_t lo = (v & 0x0F) | static_cast<int32_t>((five[k] >> (4 * r + j)) & 1u) << 4;
                const int32_t hi = (v >> 4) | static_cast<int32_t>((five[k + 4] >> (4 * r + j)) & 1u) << 4;
                sum += lo * static_cast<int32_t>(xb[4 * k + j]) + hi * static_cast<int32_t>(xb[16 + 4 * k + j]);
              }
          }
          const size_t xi = static_cast<size_t>(i * x.blocks + b);
          if constexpr (T == DType::Q4_0) sum -= 8 * x.isum[xi];
          if constexpr (T == DType::Q5_0) sum -= 16 * x.isum[xi];
          if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
            acc = std::fma(static_cast<float>(sum), f32_at(blk + 4 * r) * x.d[xi], acc);
            acc = std::fma(f32_at(blk + 32 + 4 * r), x.sx[xi], acc);
          } else if constexpr (T == DType::IQ4_XS) {
            acc = std::fma(static_cast<float>(sum), f32_at(blk + 4 * r) * x.d[xi], acc);
          } else if constexpr (T == DType::Q2_K) {  // -dmin (m_lo sum_lo x + m_hi sum_hi x), exact in int32
            const int32_t xlo = x.isum_lo[xi], mins = (blk[32 + r] >> 4) * xlo + (blk[40 + r] >> 4) * (x.isum[xi] - xlo);
            acc = std::fma(static_cast<float>(sum), half(blk + 2 * r) * x.d[xi], acc);
            acc = std::fma(static_cast<float>(mins), half(blk + 16 + 2 * r) * x.d[xi], acc);
          } else {
            const float scale = half(blk + 2 * r) * x.d[xi];
            acc = std::fma(static_cast<float>(sum), scale, acc);
            if constexpr (T == DType::Q4_1 || T == DType::Q5_1) acc = std::fma(half(blk + 16 + 2 * r), x.sx[xi], acc);
          }
        }
        y[i * ldy + g * kGroupRows + r] = acc;
      }
    }
  }
}

}  // namespace

bool qmatmul_supports(DType t) {
  switch (kernel_dtype(t)) {
    case DType::Q4_0: case DType::Q4_1: case DType::Q8_0: case DType::Q4_K: case DType::Q6_K: case DType::Q5_1: case DType::Q5_K:
    case DType::IQ4_XS: case DType::Q2_K:
      return true;
    default: return false;
  }
}

std::shared_ptr<uint8_t> packed_storage(size_t bytes, WeightArena* arena) {
  if (arena != nullptr) return arena->allocate(bytes);
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, std::max<size_t>((bytes + 63) / 64 * 64, 64)));
  if (p == nullptr) throw std::bad_alloc();
  return std::shared_ptr<uint8_t>(p, &std::free);  // the packers write every byte
}

std::shared_ptr<PackedMatrix> pack_matrix(const TensorView& w, ThreadPool& pool, WeightArena* arena, bool narrow) {
  if (!qmatmul_supports(w.dtype)) throw std::invalid_argument(std::string("int8 path: no packed layout for ") + dtype_name(w.dtype));
  if (w.shape.size() != 2 || w.cols() % kBlock != 0)
    throw std::invalid_argument("int8 path: weight '" + w.name + "' is not a matrix of whole 32-value blocks");
  // A type no packer reads as stored (Q5_0, IQ4_NL, Q3_K) is read through its exact conversion,
  // the 8 rows' blocks at a time (convert_block), so no converted copy of the matrix is made; but
  // IQ4_NL in its own layout packs straight from its blocks.
  const DType read_as = kernel_dtype(w.dtype);
  const bool k_quant = read_as == DType::Q4_K || read_as == DType::Q5_K || read_as == DType::Q6_K || read_as == DType::IQ4_XS ||
                       read_as == DType::Q2_K;
  if (k_quant && w.cols() % 256 != 0)
    throw std::invalid_argument("int8 path: " + std::string(dtype_name(w.dtype)) + " weight '" + w.name +
                                "' is not a matrix of whole 256-value blocks");
  const size_t row_bytes = dtype_row_bytes(w.dtype, w.cols());
  if (w.data == nullptr || w.nbytes < row_bytes * static_cast<size_t>(w.rows()))
    throw std::invalid_argument("int8 path: weight '" + w.name + "' holds too few bytes");
  auto m = std::make_shared<PackedMatrix>();
  const DType layout = narrow && (w.dtype == DType::Q5_0 || w.dtype == DType::IQ4_NL || w.dtype == DType::Q3_K) ? w.dtype : read_as;
  const bool converted = read_as != w.dtype && layout != DType::IQ4_NL;
  const PackShape s = pack_shape(layout);
  const size_t stored = static_cast<size_t>(dtype_info(w.dtype).block_bytes);
  const size_t read_bytes = static_cast<size_t>(dtype_info(read_as).block_bytes);
  m->dtype = layout;
  m->stored = w.dtype;
  m->rows = w.rows();
  m->cols = w.cols();
  m->groups = (m->rows + kGroupRows - 1) / kGroupRows;
  m->blocks = m->cols / kBlock;
  m->block_bytes = s.packed;
  m->data = packed_storage(m->bytes(), arena);
  const auto* base = reinterpret_cast<const uint8_t*>(w.data);
  pool.parallel_for(m->groups, 16, [&](int64_t g0, int64_t g1) {
    std::vector<uint8_t> conv(converted ? kGroupRows * read_bytes : 0);
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t b = 0; b < m->blocks; ++b) {
        const uint8_t* src[kGroupRows];
        // K-quants: block b is the (b % 8)-th 32 values of stored super-block b / 8.
        const int64_t stored_block = k_quant ? b / 8 : b;
        for (int64_t r = 0; r < kGroupRows; ++r) {
          const int64_t row = g * kGroupRows + r;
          src[r] = row < m->rows ? base + static_cast<size_t>(row) * row_bytes + static_cast<size_t>(stored_block) * stored : nullptr;
          if (converted && src[r] != nullptr) {
            uint8_t* c = conv.data() + static_cast<size_t>(r) * read_bytes;
            if (!k_quant || b % 8 == 0)  // a super-block is converted once, at its first sub-block
              convert_block(w.dtype, reinterpret_cast<const std::byte*>(src[r]), reinterpret_cast<std::byte*>(c));
            src[r] = c;
          }
        }
        uint8_t* dst = m->data.get() + m->group_bytes() * static_cast<size_t>(g) + s.packed * static_cast<size_t>(b);
        if (read_as == DType::Q4_K) pack_block_q4_k(src, static_cast<int>(b % 8), dst);
        else if (layout == DType::Q3_K) pack_block_q3_k(src, static_cast<int>(b % 8), dst);
        else if (read_as == DType::Q6_K) pack_block_q6_k(src, static_cast<int>(b % 8), dst);
        else if (read_as == DType::IQ4_XS) pack_block_iq4_xs(src, static_cast<int>(b % 8), dst);
        else if (read_as == DType::Q2_K) pack_block_q2_k(src, static_cast<int>(b % 8), dst);
        else if (is_five_bit(layout)) pack_block_five_bit(layout, src, static_cast<int>(b % 8), dst);
        else pack_block(layout, src, dst);
      }
  });
  return m;
}

namespace {

// One 32-value block as QuantizedRows defines it.
void quantize_block(const float* xb, int8_t* q, float& d_out, int32_t& isum, int32_t& isum_lo, float& sx) {
  float amax = 0.0f;
  for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  int32_t sum = 0;
  for (int64_t j = 0; j < kBlock; ++j) {
    const float v = std::clamp(std::nearbyint(xb[j] * id), -127.0f, 127.0f);
    q[j] = static_cast<int8_t>(v);
    sum += static_cast<int32_t>(v);
    if (j == kBlock / 2 - 1) isum_lo = sum;
  }
  d_out = d;
  isum = sum;
  sx = d * static_cast<float>(sum);
}

// The vector quantizers' shape (quantize_rows_avx2, quantize_rows_avx512): they take the block maxima.
using QuantizeFn = void (*)(const float* x, int64_t n, int64_t cols, const int32_t* skip, const float* amax, int8_t* q, float* d,
                           int32_t* isum, int32_t* isum_lo, float* sx);
using AmaxFn = void (*)(const float* x, int64_t blocks, float* amax);

void quantize_rows_portable(const float* x, int64_t n, int64_t cols, const int32_t* skip, int8_t* q, float* d, int32_t* isum,
                            int32_t* isum_lo, float* sx) {
  constexpr int kOut = QuantizedRows::kOutliers;
  const int64_t nb = cols / kBlock;
  for (int64_t bi = 0; bi < n * nb; ++bi) {
    float zeroed[kBlock];
    const float* xb = x + bi * kBlock;
    if (skip != nullptr) xb = block_with_values_set_aside(xb, bi % nb, skip + (bi / nb) * kOut, zeroed);
    quantize_block(xb, q + bi * kBlock, d[bi], isum[bi], isum_lo[bi], sx[bi]);
  }
}

void block_amax_portable(const float* x, int64_t blocks, float* amax) {
  for (int64_t b = 0; b < blocks; ++b) {
    float m = 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) m = std::max(m, std::fabs(x[b * kBlock + j]));  // NaN ignored
    amax[b] = m;
  }
}

// Rows [i0, i1): each row's kOutliers largest |x| (ties to the lower column). Every one of them
// lies in a block whose largest |x| is at least the kOutliers-th largest block maximum (those
// maxima are values of the row), so only those blocks are searched, and in them only the values
// above the third largest so far at the block's start and at least that block maximum (a
// superset of the values the in-order insertion takes, so the same result).
// amax_rows: the rows' block maxima ([i1 - i0, blocks], block_amax's).
void find_outliers(const float* x, QuantizedRows& out, const float* amax_rows, int64_t i0, int64_t i1) {
  constexpr int kOut = QuantizedRows::kOutliers;
  const int64_t cols = out.cols, nb = out.blocks;
  for (int64_t i = i0; i < i1; ++i) {
    const float* xr = x + i * cols;
    const float* amax = amax_rows + (i - i0) * nb;
    float top[kOut];  // the kOut largest block maxima, largest first (min/max, no branches)
    for (float& t : top) t = -1.0f;
    for (int64_t b = 0; b < nb; ++b) {
      float v = amax[b];
      for (int k = 0; k < kOut; ++k) {
        const float hi = std::max(top[k], v);
        v = std::min(top[k], v);
        top[k] = hi;
      }
    }
    // At least kOut values of the row (the top block maxima, in distinct blocks) reach `bar`,
    // so a value below it is never among the kOut largest.
    const float bar = top[kOut - 1];
    int64_t col[kOut];
    float mag[kOut];
    for (int k = 0; k < kOut; ++k) col[k] = -1, mag[k] = -1.0f;
    for (int64_t b = 0; b < nb; ++b) {
      if (!(amax[b] >= bar)) continue;
      const float* xb = xr + b * kBlock;
      // The values that may enter: above the kOut-th largest so far and at least `bar` (whichever
      // is higher decides: floor >= bar makes the first imply the second, floor < bar the reverse).
      const float floor = mag[kOut - 1];
      const bool strict = floor >= bar;
      const float cut = strict ? floor : bar;
      uint32_t above = 0;
#if defined(__SSE2__)
      const __m128 cut4 = _mm_set1_ps(cut), sign = _mm_set1_ps(-0.0f);
      for (int j = 0; j < kBlock; j += 4) {  // NaN compares false, as below
        const __m128 a = _mm_andnot_ps(sign, _mm_loadu_ps(xb + j));
        above |= static_cast<uint32_t>(_mm_movemask_ps(strict ? _mm_cmpgt_ps(a, cut4) : _mm_cmpge_ps(a, cut4))) << j;
      }
#else
      for (int j = 0; j < kBlock; ++j) above |= static_cast<uint32_t>(strict ? std::fabs(xb[j]) > cut : std::fabs(xb[j]) >= cut) << j;
#endif
      for (; above != 0; above &= above - 1) {
        const int64_t c = b * kBlock + std::countr_zero(above);
        const float a = std::fabs(xr[c]);
        if (!(a > mag[kOut - 1])) continue;
        int k = kOut - 1;  // strictly larger moves ahead: ties keep the lower column first
        for (; k > 0 && a > mag[k - 1]; --k) mag[k] = mag[k - 1], col[k] = col[k - 1];
        mag[k] = a;
        col[k] = c;
      }
    }
    for (int k = 0; k < kOut; ++k) {
      if (col[k] < 0)  // only where NaNs left fewer candidates: the lowest column not taken
        for (col[k] = 0; std::find(col, col + k, col[k]) != col + k;) ++col[k];
      const size_t o = static_cast<size_t>(i * kOut + k);
      out.outlier_col[o] = static_cast<int32_t>(col[k]);
      out.outlier_x[o] = xr[col[k]];
    }
  }
}

// Calls of at least this many rows quantize on every thread of the pool.
constexpr int64_t kParallelQuantizeRows = 16;

// The shared columns' slots (QuantizedRows::outlier_distinct), in order of first appearance.
void assign_slots(QuantizedRows& out) {
  out.outlier_distinct.clear();
  for (size_t o = 0; o < out.outlier_col.size(); ++o) {
    const int32_t c = out.outlier_col[o];
    const auto it = std::find(out.outlier_distinct.begin(), out.outlier_distinct.end(), c);
    if (it != out.outlier_distinct.end()) {
      out.outlier_slot[o] = static_cast<int32_t>(it - out.outlier_distinct.begin());
    } else if (out.outlier_distinct.size() < QuantizedRows::kMaxShared) {
      out.outlier_slot[o] = static_cast<int32_t>(out.outlier_distinct.size());
      out.outlier_distinct.push_back(c);
    } else {
      out.outlier_slot[o] = -1;  // the slots are taken: the pass dequantizes this one for its row alone
    }
  }
}

}  // namespace

void quantize_rows(const float* x, int64_t n, int64_t cols, QuantizedRows& out, ThreadPool* pool, bool avx512) {
  out.n = n;
  out.cols = cols;
  out.blocks = cols / kBlock;
  out.q.resize(static_cast<size_t>(n * cols));
  out.d.resize(static_cast<size_t>(n * out.blocks));
  out.isum.resize(out.d.size());
  out.isum_lo.resize(out.d.size());
  out.sx.resize(out.d.size());
  out.outlier_col.resize(static_cast<size_t>(n * QuantizedRows::kOutliers));
  out.outlier_x.resize(out.outlier_col.size());
  out.outlier_slot.resize(out.outlier_col.size());
  out.wide_ready = false;
  static std::atomic<uint64_t> generations{0};
  out.generation = generations.fetch_add(1, std::memory_order_relaxed) + 1;
  const bool avx2 = host_kernels::cpu_has_avx2_fma();
  const QuantizeFn quantize = avx512 && host_kernels::cpu_has_avx512() ? &host_kernels::quantize_rows_avx512
                              : avx2                          ? &host_kernels::quantize_rows_avx2
                                                              : nullptr;
  const AmaxFn block_amax = avx2 ? &host_kernels::block_amax_avx2 : &block_amax_portable;
  const int64_t nb = out.blocks;
  auto rows = [&](int64_t i0, int64_t i1) {
    thread_local std::vector<float> amax;
    if (amax.size() < static_cast<size_t>((i1 - i0) * nb)) amax.resize(static_cast<size_t>((i1 - i0) * nb));
    block_amax(x + i0 * cols, (i1 - i0) * nb, amax.data());
    find_outliers(x, out, amax.data(), i0, i1);
    const size_t b0 = static_cast<size_t>(i0 * nb);
    const int32_t* skip = out.outlier_col.data() + i0 * QuantizedRows::kOutliers;
    if (quantize != nullptr)  // the block maxima again, but where values were set aside
      quantize(x + i0 * cols, i1 - i0, cols, skip, amax.data(), out.q.data() + i0 * cols, out.d.data() + b0, out.isum.data() + b0,
               out.isum_lo.data() + b0, out.sx.data() + b0);
    else
      quantize_rows_portable(x + i0 * cols, i1 - i0, cols, skip, out.q.data() + i0 * cols, out.d.data() + b0, out.isum.data() + b0,
                             out.isum_lo.data() + b0, out.sx.data() + b0);
  };
  // Rows are independent: a prefill's many rows are split across the pool (about a microsecond
  // of fork and join, against ~0.17 us a row of 576 values).
  if (pool != nullptr && pool->threads() > 1 && n >= kParallelQuantizeRows) pool->parallel_for(n, 4, rows);
  else rows(0, n);
  assign_slots(out);
}

namespace host_kernels {

bool wide_rows_pay(int64_t n, int64_t cols) {
  // The call's wide rows and one group of the widest nibble weights they serve (8 rows of 24
  // bytes a block) within the 32 KiB L1: at the default model's 576 columns 2-5 rows, at its 1,536
  // none (2 rows there, 30 KiB of wide rows, measured 2.5% slower for a 2-token forward than
  // broadcasts: docs/kernels.md, "Each thread's own wide rows").
  const size_t blocks = static_cast<size_t>(cols / kBlock), wide = static_cast<size_t>(n) * blocks * QuantizedRows::kWideBlock;
  return n >= 2 && wide <= QuantizedRows::kWideBytes && wide + blocks * 8 * 24 <= 32 * 1024;
}

bool kernel_adds_outliers(Int8Kernel kernel, DType t, int64_t n) {
  if (kernel == Int8Kernel::kAvx512Vnni || kernel == Int8Kernel::kAmx) return true;  // VNNI in its tiles, AMX after its own
  return (kernel == Int8Kernel::kAvx2 || kernel == Int8Kernel::kAvxVnni) && n <= kFoldRows && (t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q4_K || t == DType::Q8_0);
}

size_t packed_header_bytes(DType t) { return pack_shape(t).header; }

ColumnLocation column_location(const PackedMatrix& m, int64_t c) {
  const bool bytes = m.dtype == DType::Q8_0 || m.dtype == DType::Q6_K;  // else nibbles (or Q2_K's pairs)
  const int64_t j = c % kBlock;
  ColumnLocation at;
  at.blk_off = static_cast<size_t>(c / kBlock) * m.block_bytes;
  if (m.dtype == DType::Q2_K) {
    at.word_off = packed_header_bytes(m.dtype) + 32 * static_cast<size_t>(j / 16);
    at.shift = static_cast<int>(8 * (j % 4) + 2 * ((j % 16) / 4));
    at.high = j >= 16;
    return at;
  }
  at.word_off = packed_header_bytes(m.dtype) + 32 * static_cast<size_t>(bytes ? j / 4 : (j % 16) / 4);
  const int bit = static_cast<int>(8 * (j % 4)) + (!bytes && j >= 16 ? 4 : 0);
  at.shift = m.dtype == DType::Q8_0 ? 24 - bit : bit;
  at.high = j >= 16;
  at.five_off = packed_header_bytes(m.dtype) + kNibbleBytes + 4 * static_cast<size_t>(j / 4);
  at.five_bit = static_cast<int>(j % 4);
  return at;
}

void add_outliers_portable(const PackedMatrix& m, const QuantizedRows& x, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  constexpr int kOut = QuantizedRows::kOutliers;
  const PackShape s = pack_shape(m.dtype);
  for (int64_t g = g0; g < g1; ++g)
    for (int64_t i = 0; i < x.n; ++i)
      for (int k = 0; k < kOut; ++k) {
        const int64_t c = x.outlier_col[static_cast<size_t>(i * kOut + k)], j = c % kBlock;
        const float xc = x.outlier_x[static_cast<size_t>(i * kOut + k)];
        const uint8_t* blk = m.group(g) + static_cast<size_t>(c / kBlock) * m.block_bytes;
        for (int64_t r = 0; r < kGroupRows && g * kGroupRows + r < m.rows; ++r) {
          float w = 0.0f;
          if (m.dtype == DType::Q2_K) {  // d * (sc q) - dmin * m, rounded once
            const int32_t q = (blk[s.header + 32 * (j / 16) + 4 * r + j % 4] >> (2 * ((j % 16) / 4))) & 3;
            const uint8_t sm = blk[(j < 16 ? 32 : 40) + r];
            w = std::fma(half(blk + 2 * r), static_cast<float>((sm & 15) * q), half(blk + 16 + 2 * r) * static_cast<float>(sm >> 4));
          } else if (m.dtype == DType::Q8_0 || m.dtype == DType::Q6_K) {
            const uint8_t v = blk[s.header + 32 * (j / 4) + 4 * r + j % 4];
            if (m.dtype == DType::Q8_0) w = half(blk + 2 * r) * static_cast<float>(static_cast<int8_t>(v));
            else w = half(blk + 2 * r) * static_cast<float>(static_cast<int8_t>(blk[(j < 16 ? 16 : 24) + r]) * (v - 32));
          } else {
            const uint8_t v = blk[s.header + 32 * ((j % 16) / 4) + 4 * r + j % 4];
            int32_t q = j < 16 ? (v & 0x0F) : (v >> 4);
            if (is_five_bit(m.dtype)) {
              uint32_t word;
              std::memcpy(&word, blk + s.header + kNibbleBytes + 4 * (j / 4), 4);
              q |= static_cast<int32_t>((word >> (4 * r + j % 4)) & 1u) << 4;
            }
            if (m.dtype == DType::Q5_0) w = half(blk + 2 * r) * static_cast<float>(q - 16);  // the Q8_0 layout's d * q
            else if (m.dtype == DType::IQ4_NL) w = half(blk + 2 * r) * static_cast<float>(kIq4NlLevels[q]);  // the same
            else if (m.dtype == DType::IQ4_XS) w = f32_at(blk + 4 * r) * static_cast<float>(kIq4NlLevels[q]);
            else if (m.dtype == DType::Q3_K)  // the Q6_K layout's d * (s * (q6 - 32))
              w = half(blk + 2 * r) * static_cast<float>(static_cast<int8_t>(blk[(j < 16 ? 16 : 24) + r]) * (q - 4));
            else if (m.dtype == DType::Q4_0) w = half(blk + 2 * r) * static_cast<float>(q - 8);
            else if (m.dtype == DType::Q4_1 || m.dtype == DType::Q5_1)
              w = std::fma(half(blk + 2 * r), static_cast<float>(q), half(blk + 16 + 2 * r));
            else w = std::fma(f32_at(blk + 4 * r), static_cast<float>(q), f32_at(blk + 32 + 4 * r));
          }
          float& out = y[i * ldy + g * kGroupRows + r];
          out = std::fma(w, xc, out);
        }
      }
}

PackedKernel portable_packed_kernel(DType t) {
  switch (t) {
    case DType::Q4_0: return &portable_packed<DType::Q4_0>;
    case DType::Q4_1: return &portable_packed<DType::Q4_1>;
    case DType::Q8_0: return &portable_packed<DType::Q8_0>;
    case DType::Q5_0: return &portable_packed<DType::Q5_0>;
    case DType::IQ4_NL: return &portable_packed<DType::IQ4_NL>;
    case DType::IQ4_XS: return &portable_packed<DType::IQ4_XS>;
    case DType::Q3_K: return &portable_packed<DType::Q3_K>;
    case DType::Q2_K: return &portable_packed<DType::Q2_K>;
    case DType::Q5_1: return &portable_packed<DType::Q5_1>;
    case DType::Q5_K: return &portable_packed<DType::Q5_K>;
    case DType::Q4_K: return &portable_packed<DType::Q4_K>;
    case DType::Q6_K: return &portable_packed<DType::Q6_K>;
    default: return nullptr;
  }
}

const char* int8_kernel_name(Int8Kernel k) {
  switch (k) {
    case Int8Kernel::kAvx2: return "avx2";
    case Int8Kernel::kAvxVnni: return "avx-vnni";
    case Int8Kernel::kAvx512Vnni: return "avx512-vnni";
    case Int8Kernel::kAmx: return "amx";
    default: return "portable";
  }
}

bool cpu_has_int8_kernel(Int8Kernel k) {
  switch (k) {
    case Int8Kernel::kAvx2: return cpu_has_avx2_fma();
    case Int8Kernel::kAvxVnni: return cpu_has_avx_vnni();
    case Int8Kernel::kAvx512Vnni: return cpu_has_avx512_vnni();
    case Int8Kernel::kAmx: return cpu_has_amx_int8();
    default: return true;
  }
}

Int8Kernel int8_kernel_for(Isa isa, bool amx) {
  if (isa == Isa::kPortable) return Int8Kernel::kPortable;
  if (isa == Isa::kAvx512 && amx && cpu_has_amx_int8()) return Int8Kernel::kAmx;
  if (isa == Isa::kAvx512 && cpu_has_avx512_vnni()) return Int8Kernel::kAvx512Vnni;
  if (cpu_has_avx_vnni()) return Int8Kernel::kAvxVnni;
  return cpu_has_avx2_fma() ? Int8Kernel::kAvx2 : Int8Kernel::kPortable;
}

PackedKernel packed_kernel(Int8Kernel k, DType t) {
  if (!cpu_has_int8_kernel(k))
    throw std::invalid_argument(std::string("int8 path: this CPU cannot run the ") + int8_kernel_name(k) + " kernels");
  PackedKernel f = nullptr;
  switch (k) {
    case Int8Kernel::kAvx2: f = avx2_packed_kernel(t); break;
    case Int8Kernel::kAvxVnni: f = avxvnni_packed_kernel(t); break;
    case Int8Kernel::kAvx512Vnni: f = avx512vnni_packed_kernel(t); break;
    case Int8Kernel::kAmx: f = amx_packed_kernel(t); break;
    default: f = portable_packed_kernel(t); break;
  }
  if (f == nullptr) throw std::invalid_argument(std::string("int8 path: no kernel for ") + dtype_name(t));
  return f;
}

}  // namespace host_kernels

namespace {

// Calls of this many activation rows or more are compute-bound, and the two threads' halves of one
// finish up to a tenth apart (the host's other tenants, which lines the L3 still holds): their
// last tenth (or a unit a piece, if that is more) goes in pieces to whichever thread is free
// first (ThreadPool::parallel_for's tail pieces; docs/kernels.md, "Tail pieces for calls of 16
// rows and more"). Below it, where the weight stream sets the pace, the pieces' claims cost what
// they balance.
constexpr int64_t kTailRows = 16;
constexpr int kTailPieces = 4;
int tail_pieces_for(int64_t rows) { return rows >= kTailRows ? kTailPieces : 0; }

// Weights a kernel call covers before the outliers' pass over the same groups (for the kernels
// that leave the outliers to a pass after them): a quarter of Zen 3's 512 KiB L2, so that the
// pass finds the piece's scales and outlier columns there. Pieces of 4 KiB cost more in the
// pass's set-up per call than they save; 16-32 KiB were no faster than one pass over the whole
// chunk at 3-5 rows; 64-256 KiB 3-6% faster (docs/kernels.md, "The outliers' pass a piece at a
// time").
constexpr size_t kPostBytes = 128 * 1024;

// The kernels over every group of every matrix in ws, in one parallel region (a grain of ~4 KiB
// of weights, at least a group pair on the 512-bit kernels), writing ys[k] ([xq.n, ws[k]->rows]).
// Where `fold` rows are asked for (one matrix, qmatmul_refined), each chunk's outputs are then
// folded while in cache: out[i] = ys[0][i] + ys[0][fold + i] for i < fold.
void run_kernels(std::span<const PackedMatrix* const> ws, const QuantizedRows& xq, std::span<float* const> ys,
                 ThreadPool& pool, host_kernels::Int8Kernel kernel, int64_t fold = 0, float* out = nullptr) {
  using host_kernels::Int8Kernel;
  using PostPass = void (*)(const PackedMatrix&, const QuantizedRows&, float*, int64_t, int64_t, int64_t);
  // The outliers' terms: the kernels that add them themselves (host_kernels::kernel_adds_outliers),
  // else a pass after the kernel (every kernel but the portable one implies AVX2). All give the
  // same bits.
  const PostPass pass = kernel == Int8Kernel::kPortable ? &host_kernels::add_outliers_portable : &host_kernels::add_outliers_avx2;
  struct Part { const PackedMatrix* w; float* y; host_kernels::PackedKernel k; int64_t first; PostPass post; };
  Part parts[8];
  if (ws.size() > 8) throw std::invalid_argument("qmatmul: at most 8 fused weights");
  int64_t total = 0;
  size_t group_bytes = 0;
  for (size_t k = 0; k < ws.size(); ++k) {
    const PostPass post = host_kernels::kernel_adds_outliers(kernel, ws[k]->dtype, xq.n) ? nullptr : pass;
    parts[k] = {ws[k], ys[k], host_kernels::packed_kernel(kernel, ws[k]->dtype), total, post};
    total += ws[k]->groups;
    group_bytes = std::max(group_bytes, ws[k]->group_bytes());
  }
  int64_t grain = std::max<int64_t>(1, static_cast<int64_t>(4096 / std::max<size_t>(group_bytes, 1)));
  // The 512-bit kernels take groups in pairs from a range's start: even boundaries leave no lone
  // group inside a matrix that starts on an even group (any pairing gives the same bits).
  if (host_kernels::is_512_bit(kernel)) grain += grain % 2;
  const size_t nparts = ws.size();
  pool.parallel_for(total, grain, [&](int64_t g0, int64_t g1) {
    for (size_t k = 0; k < nparts && g0 < g1; ++k) {
      const Part& p = parts[k];
      const int64_t end = p.first + p.w->groups;
      if (g0 >= end) continue;
      const int64_t e = std::min(g1, end);
      // With a pass after the kernel: the kernel and then the pass over a piece of kPostBytes of
      // weights at a time, while the piece is in cache (over a thread's whole chunk, half the
      // output head's 30 MB, the pass read its columns from memory again).
      const int64_t piece = p.post == nullptr ? e - g0 : std::max<int64_t>(1, static_cast<int64_t>(kPostBytes / std::max<size_t>(p.w->group_bytes(), 1)));
      for (int64_t a = g0; a < e; a += piece) {
        const int64_t b = std::min(e, a + piece);
        p.k(*p.w, xq, p.y, p.w->rows, a - p.first, b - p.first);
        if (p.post != nullptr) p.post(*p.w, xq, p.y, p.w->rows, a - p.first, b - p.first);
      }
      if (fold > 0) {
        const int64_t R = p.w->rows, o0 = 8 * (g0 - p.first), o1 = std::min(R, 8 * (e - p.first));
        for (int64_t i = 0; i < fold; ++i)
          for (int64_t o = o0; o < o1; ++o) out[i * R + o] = p.y[i * R + o] + p.y[(fold + i) * R + o];
      }
      g0 = e;
    }
  }, tail_pieces_for(xq.n));
}

}  // namespace

void qmatmul(std::span<const PackedMatrix* const> ws, const float* x, int64_t n, std::span<float* const> ys,
             ThreadPool& pool, host_kernels::Int8Kernel kernel) {
  if (ws.empty() || n <= 0) return;
  if (ws.size() != ys.size()) throw std::invalid_argument("qmatmul: as many outputs as weights");
  const int64_t cols = ws[0]->cols;
  for (const PackedMatrix* w : ws)
    if (w->cols != cols) throw std::invalid_argument("qmatmul: fused weights differ in width");
  // Reused across calls: a decode step quantizes about a hundred activation rows.
  // (Workers see the caller's through `xq`: a lambda names a thread_local of its own thread.)
  thread_local QuantizedRows qx;
  quantize_rows(x, n, cols, qx, &pool, host_kernels::is_512_bit(kernel));
  qx.wide_ready = kernel == host_kernels::Int8Kernel::kAvx2 && host_kernels::wide_rows_pay(n, cols);
  run_kernels(ws, qx, ys, pool, kernel);
}

void residual_rows(const float* x, const QuantizedRows& first, float* r) {
  constexpr int kOut = QuantizedRows::kOutliers;
  const int64_t n = first.n, cols = first.cols, nb = first.blocks;
  for (int64_t i = 0; i < n; ++i) {
    const float* xr = x + i * cols;
    const int8_t* qr = first.qrow(i);
    float* rr = r + i * cols;
    for (int64_t b = 0; b < nb; ++b) {
      const float d = first.d[static_cast<size_t>(i * nb + b)];
      for (int64_t j = b * kBlock; j < (b + 1) * kBlock; ++j) rr[j] = xr[j] - d * static_cast<float>(qr[j]);
    }
    for (int k = 0; k < kOut; ++k) rr[first.outlier_col[static_cast<size_t>(i * kOut + k)]] = 0.0f;
  }
}

void qmatmul_refined(const PackedMatrix& w, const float* x, int64_t n, float* y, ThreadPool& pool,
                     host_kernels::Int8Kernel kernel) {
  if (n <= 0) return;
  const int64_t cols = w.cols;
  thread_local QuantizedRows first, both;
  thread_local std::vector<float> rows, sums;
  const bool avx512 = host_kernels::is_512_bit(kernel);
  quantize_rows(x, n, cols, first, nullptr, avx512);
  rows.resize(static_cast<size_t>(2 * n * cols));
  std::copy(x, x + n * cols, rows.begin());
  residual_rows(x, first, rows.data() + n * cols);
  // Rows [0, n) quantize as `first` did (the quantizer works per row); rows [n, 2n) are the
  // residuals. One call for both, so each weight block is unpacked once for all 2n rows.
  quantize_rows(rows.data(), 2 * n, cols, both, &pool, avx512);
  both.wide_ready = kernel == host_kernels::Int8Kernel::kAvx2 && host_kernels::wide_rows_pay(2 * n, cols);
  sums.resize(static_cast<size_t>(2 * n * w.rows));
  const PackedMatrix* m = &w;
  float* s = sums.data();
  run_kernels({&m, 1}, both, {&s, 1}, pool, kernel, n, y);
}

float stored_row_dot(const TensorView& w, int64_t o, const float* x, float* buf) {
  const int64_t cols = w.cols();
  dequantize_row(w.dtype, w.row(o), buf, cols);
  float acc[16] = {};
  for (int64_t j = 0; j < cols; ++j) acc[j % 16] += buf[j] * x[j];
  float s = 0.0f;
  for (float a : acc) s += a;
  return s;
}

namespace {

// The scans' scalar reference (the portable path), with logits_avx2.cpp's signatures: the largest
// of y[0..n) with NaNs skipped, in 16 lanes so that the compiler can vectorize it; the indices
// o with y[o] >= floor, in order.
float logits_max(const float* y, int64_t n) {
  float top[16];
  for (float& t : top) t = -std::numeric_limits<float>::infinity();
  int64_t o = 0;
  for (; o + 16 <= n; o += 16)
    for (int l = 0; l < 16; ++l) top[l] = y[o + l] > top[l] ? y[o + l] : top[l];
  for (; o < n; ++o) top[0] = y[o] > top[0] ? y[o] : top[0];
  float largest = top[0];
  for (float t : top) largest = t > largest ? t : largest;
  return largest;
}

int64_t logits_at_least(const float* y, int64_t n, float floor, int64_t* idx) {
  int64_t count = 0;
  for (int64_t o = 0; o < n; ++o)
    if (y[o] >= floor) idx[count++] = o;
  return count;
}

// The two scans of a row: the scalar ones or logits_avx2.cpp's, the same results.
struct LogitScans {
  float (*max)(const float*, int64_t);
  int64_t (*at_least)(const float*, int64_t, float, int64_t*);
  // stored_row_dot for a Q8_0 head in AVX2 (the same bits), or nullptr.
  float (*dot_q8_0)(const uint8_t*, const float*, int64_t);
};

// One row of logits y[R] from activations x: the outputs within kLogitMargin of the largest
// (NaNs are never the largest nor within it), at most kLogitCap of them, computed again in f32.
void refine_top_logits(const TensorView& w, const float* x, float* y, int64_t R, const LogitScans& scans) {
  thread_local std::vector<int64_t> near;
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(near.size()) < R) near.resize(static_cast<size_t>(R));
  int64_t count = scans.at_least(y, R, scans.max(y, R) - kLogitMargin, near.data());
  if (count > kLogitCap) {
    std::nth_element(near.begin(), near.begin() + kLogitCap, near.begin() + count,
                     [&](int64_t a, int64_t b) { return y[a] > y[b] || (y[a] == y[b] && a < b); });
    count = kLogitCap;
  }
  const bool q8_0 = scans.dot_q8_0 != nullptr && w.dtype == DType::Q8_0;  // the row read in place
  if (!q8_0) buf.resize(static_cast<size_t>(w.cols()));
  for (int64_t k = 0; k < count; ++k) {
    const int64_t o = near[static_cast<size_t>(k)];
    y[o] = q8_0 ? scans.dot_q8_0(reinterpret_cast<const uint8_t*>(w.row(o)), x, w.cols()) : stored_row_dot(w, o, x, buf.data());
  }
}

}  // namespace

void qmatmul_logits(const PackedMatrix& m, const TensorView& stored, const float* x, int64_t n, float* y, ThreadPool& pool,
                    host_kernels::Int8Kernel kernel) {
  if (stored.rows() != m.rows || stored.cols() != m.cols || stored.dtype != m.stored)
    throw std::invalid_argument("qmatmul_logits: the stored matrix is not the packed one");
  const PackedMatrix* w = &m;
  qmatmul({&w, 1}, x, n, {&y, 1}, pool, kernel);
  const int64_t R = m.rows, C = m.cols;
  // The scans' vector loops give the scalar ones' results; the portable kernel keeps to scalar code.
  const LogitScans scans = kernel != host_kernels::Int8Kernel::kPortable && host_kernels::cpu_has_avx2_fma()
                               ? LogitScans{&host_kernels::logits_max_avx2, &host_kernels::logits_at_least_avx2,
                                            &host_kernels::stored_row_dot_q8_0_avx2}
                               : LogitScans{&logits_max, &logits_at_least, nullptr};
  auto rows = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) refine_top_logits(stored, x + i * C, y + i * R, R, scans);
  };
  if (n > 1 && pool.threads() > 1) pool.parallel_for(n, 1, rows, tail_pieces_for(n));
  else rows(0, n);
}

}  // namespace specula
