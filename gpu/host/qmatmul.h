// The host's fast matmul path: weights repacked once at load into groups of 8 interleaved rows,
// activations quantized to int8 per 32-value block once per call, integer dot products (AMX tiles
// for 13-16 rows, AVX-512 VNNI, AVX-VNNI, AVX2 maddubs or portable C++, chosen at run time),
// one f32 FMA per block and output row.
//
// Row property: y[i, r] depends only on activation row i and weight row r, never on how many rows
// the call has or where row i sits in it. Integer sums are exact, and the float work per output
// is the same sequence of operations in every kernel and tile:
//     acc = 0; for each block b in order:  acc = fma(float(isum_b), fl(dw_b * dx_b), acc)
//                                           [Q4_1: acc = fma(mw_b, sx_b, acc)]
//                                           [Q2_K: acc = fma(float(mins_b), fl(mw_b * dx_b), acc)]
//     then for each of the row's outliers c in order: acc = fma(w_c, x_c, acc)
// so a verify forward of K+1 tokens gives the logits of K+1 decode steps bit for bit, and the
// AVX2 and portable kernels agree bit for bit too.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "gpu/host/matmul_kernels.h"
#include "gpu/host/thread_pool.h"
#include "gpu/host/weight_arena.h"
#include "model/tensor.h"

namespace specula {

// Whether the int8 path has a packed layout for weights of this type (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K;
// Q5_1, Q5_K, IQ4_XS and Q2_K; Q5_0, IQ4_NL and Q3_K in layouts of their own or through their exact
// conversion, model/tensor.h kernel_dtype). Every int8 kernel reads every layout.
bool qmatmul_supports(DType t);
// The packed layouts with a plane of fifth bits (Q5_0, Q5_1, Q5_K).
constexpr bool is_five_bit(DType t) { return t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q5_K; }

// A weight matrix repacked for the int8 path. Layout, per group of 8 rows (the last group padded
// with zero rows), per 32-column block, `block_bytes` bytes:
//   Q4_0: d[8] fp16 | 4 x 32 bytes of nibbles      (144 = 8 x 18, the stored size)
//   Q4_1: d[8] fp16 | m[8] fp16 | 4 x 32 bytes      (160 = 8 x 20)
//   Q8_0: d[8] fp16 | 8 x 32 bytes of int8          (272 = 8 x 34)
//   Q4_K: d[8] f32 | m[8] f32 | 4 x 32 bytes         (192; Q4_1's layout with d = d*sc, m = -dmin*m
//         of each 32-value sub-block, exact in f32; nibbles in Q4_1's order)
//   Q5_0: d[8] fp16 | 4 x 32 bytes of nibbles of u = q + 16 | 8 x 4 bytes of fifth bits (176 =
//         8 x 22). Packed from a Q5_0 matrix (through its Q8_0 blocks: convert_block, quants q in
//         -16..15) (pack_matrix's narrow, as the device packs): Q4_0's nibble order, and fifth-bit word c's bit 4r + i is row
//         r's column 4c + i, the byte it lands on in unpacked vector c. isum = sum u x - 16 sum x
//         is the Q8_0 layout's sum, so the results are its bits too.
//   IQ4_NL: d[8] fp16 | 4 x 32 bytes of nibbles, each the index of a quant among the sixteen
//         IQ4_NL levels (kIq4NlLevels; 144 = 8 x 18), Q4_0's order: an IQ4_NL matrix's blocks packed
//         as Q4_0's (pack_matrix's narrow; else as its Q8_0 conversion); the integer sums are the Q8_0 layout's, so are the results.
//   Q5_1: Q4_1's header | 4 x 32 bytes of nibbles of u | 8 x 4 bytes of fifth bits (192 = 8 x 24),
//         value d * u + m, u = 0..31 (fifth bits as Q5_0's).
//   Q5_K: Q4_K's header (f32 d = d * sc, m = -dmin * m of each sub-block) | nibbles | fifth bits (224).
//   IQ4_XS: d[8] f32 | IQ4_NL's nibbles (160; 1.18x the file's 8 x 136 / 8): each 32-value
//         sub-block's scale d * (ls - 32), exact in f32.
//   Q3_K: Q6_K's header | 4 x 32 bytes of nibbles of the 3-bit q (0..7), Q4_0's order (160,
//         against its Q6_K conversion's 288 and the file's 110). Packed from a Q3_K matrix
//         (pack_matrix's narrow; else as its Q6_K conversion): isum as Q6_K's
//         with 4 for 32 (q6 - 32 = q - 4), so the Q6_K layout's results.
//   Q2_K: d[8] fp16 | -dmin[8] fp16 | lo[8] | hi[8] | 2 x 32 bytes of the 2-bit quants q (112):
//         lo and hi are the byte sc | m << 4 of the block's two 16-value sub-blocks as stored;
//         vector h, row r's byte j, bits 2s hold column 16h + 4s + j (so unpacked vector 4h + s
//         holds columns 4c..4c+3 as Q8_0's c does). Per row: isum = sum (sc q) x (exact), mins =
//         m_lo sum_lo x + m_hi sum_hi x (exact), then acc = fma(float(isum), fl(d * dx), acc),
//         acc = fma(float(mins), fl(-dmin * dx), acc).
//   Q6_K: d[8] fp16 | s_lo[8] i8 | s_hi[8] i8 | 8 x 32 bytes of the 6-bit quants q (0..63),
//         as Q8_0's (288; s_lo scales columns 0..15 of the block, s_hi 16..31). Per row:
//         isum = s_lo * (sum_lo q x - 32 sum_lo x) + s_hi * (sum_hi q x - 32 sum_hi x), exact in
//         int32, then acc = fma(float(isum), fl(d * dx), acc) as for the other types.
// Nibble vector k (k < 4) holds, in lane r (4 bytes), row r's stored quant bytes 4k..4k+3: its
// low nibbles are columns 4k..4k+3 and its high nibbles columns 16+4k..16+4k+3 of the block.
// Q8_0 vector c holds in lane r row r's quants of columns 4c..4c+3. So one 32-byte vector feeds
// eight output rows at once, and a broadcast of 4 activation bytes is its other operand.
// The five-bit layouts' fifth-bit words start this many bytes after the header (after the
// nibbles); word c is 4 bytes at 4c from there.
inline constexpr size_t kNibbleBytes = 128;

struct PackedMatrix {
  DType dtype = DType::F32;   // the packed layout (Q8_0 for a Q5_0 or IQ4_NL matrix unless narrow, Q6_K for Q3_K)
  DType stored = DType::F32;  // the type it was packed from (the file's)
  int64_t rows = 0, cols = 0;
  int64_t groups = 0;     // ceil(rows / 8)
  int64_t blocks = 0;     // cols / 32
  size_t block_bytes = 0; // bytes of one block of one group
  size_t group_bytes() const { return block_bytes * static_cast<size_t>(blocks); }
  const uint8_t* group(int64_t g) const { return data.get() + group_bytes() * static_cast<size_t>(g); }
  size_t bytes() const { return group_bytes() * static_cast<size_t>(groups); }
  std::shared_ptr<uint8_t> data;  // a piece of a WeightArena slab, or its own allocation
};

// Repacks a stored [rows, cols] matrix of a supported type (the pool parallelises the copy).
// Throws std::invalid_argument for other types or a shape that is not whole blocks.
// With an arena, the packed bytes come from it (huge pages); without, from their own allocation.
// A Q5_0, IQ4_NL or Q3_K matrix is read a group-block at a time through its exact conversion
// (convert_block) into Q8_0 or Q6_K blocks, and packed as those (no converted copy is kept).
// narrow: a Q5_0 matrix is packed as Q5_0 (176 bytes a group-block instead of Q8_0's 272), an
// IQ4_NL one as IQ4_NL (144), a Q3_K one as Q3_K (160 instead of Q6_K's 288); the same results.
// The device packs narrow; the conversions' layouts are there for the tests that compare the two.
std::shared_ptr<PackedMatrix> pack_matrix(const TensorView& w, ThreadPool& pool, WeightArena* arena = nullptr,
                                          bool narrow = false);
// The storage of `bytes` packed bytes (64-byte aligned), from the arena where there is one.
std::shared_ptr<uint8_t> packed_storage(size_t bytes, WeightArena* arena);

// Activation rows quantized per 32-value block: d = max|x| / 127, q = round-to-nearest-even(x / d)
// (as x * (1 / d)) clamped to +-127, isum = sum of q, sx = d * isum (Q4_1's min term uses it).
// Each row's kOutliers largest |x| (ties to the lower column) are outliers: their blocks are
// quantized as if they were 0 (so one large value does not coarsen the other 31), and their exact
// values are kept for qmatmul to add back, times the dequantized weights of their columns.
struct QuantizedRows {
  // Three: over the prompt set's 14,412 teacher-forced positions the KL divergence from the f32
  // path is 0.00098 nats with two, 0.00080 with three, 0.00080 with four (docs/kernels.md,
  // "A third value set aside").
  static constexpr int kOutliers = 3;
  int64_t n = 0, cols = 0, blocks = 0;
  // Set by quantize_rows, a different number for every call in the process, so that a kernel can
  // keep what it derives from these rows (the VNNI tiles' outlier plans) for the call's chunks.
  uint64_t generation = 0;
  std::vector<int8_t> q;   // [n, cols]
  std::vector<float> d;    // [n, blocks]
  std::vector<int32_t> isum;
  std::vector<int32_t> isum_lo;  // the sum of the block's first 16 q (Q6_K's lower sub-block)
  std::vector<float> sx;
  std::vector<int32_t> outlier_col;  // [n, kOutliers], largest |x| first
  std::vector<float> outlier_x;      // their values
  // The first kMaxShared distinct outlier columns of the call in order of first appearance, and
  // each outlier's index among them (-1 for a column that found the slots taken), so that a
  // column's weights are dequantized once for every row that has it; the others are dequantized
  // for their own row. A prefill's rows share the hidden state's massive channels and take the
  // first slots; their other outliers are mostly their own.
  static constexpr size_t kMaxShared = 16;
  std::vector<int32_t> outlier_distinct;
  std::vector<int32_t> outlier_slot;  // [n, kOutliers]
  // Set by qmatmul for the AVX2 kernel where the call's rows fit the L1 (host_kernels::
  // wide_rows_pay): the kernel then reads them wide (host_kernels::wide_rows_avx2: per row and
  // block, the eight 4-byte groups of q each repeated to 32 bytes, then d and sx each repeated to
  // 8 floats), so that its vpmaddubsw and float multiplies take them as memory operands instead of
  // a broadcast each (one vector-pipe operation fewer per use on Zen 3). Cleared by quantize_rows.
  bool wide_ready = false;
  static constexpr size_t kWideBlock = 8 * 32 + 2 * 8 * 4;  // 320 bytes per row and block
  static constexpr size_t kWideBytes = 30 * 1024;            // the most a call's wide rows take
  const int8_t* qrow(int64_t i) const { return q.data() + i * cols; }
};
// With a pool, a call of many rows (a prefill's) splits them across its threads; the same values.
// `avx512`: the 512-bit quantizer where the CPU has it (the same values as the others); false on
// the 256-bit and portable paths, so that `SPECULA_SIMD=avx2` runs no AVX-512 instruction.
void quantize_rows(const float* x, int64_t n, int64_t cols, QuantizedRows& out, ThreadPool* pool = nullptr,
                   bool avx512 = true);

// Block b of a row (xb, its 32 values) as the quantizers read it: xb itself, or where some of the
// row's kOutliers set-aside columns (skip_row) fall in it, a copy in `zeroed` with those values 0.
// `static`: every file that calls it, the ISA-specific ones included, compiles its own copy.
static inline const float* block_with_values_set_aside(const float* xb, int64_t b, const int32_t* skip_row, float* zeroed) {
  const float* out = xb;
  for (int k = 0; k < QuantizedRows::kOutliers; ++k)
    if (skip_row[k] / 32 == b) {
      if (out != zeroed) std::memcpy(zeroed, xb, 32 * sizeof(float));
      zeroed[skip_row[k] % 32] = 0.0f;
      out = zeroed;
    }
  return out;
}

namespace host_kernels {

// y[i, g*8 + r] for i in [i0, i0 + tile), r < 8 (only rows < m.rows are written), groups [g0, g1).
using PackedKernel = void (*)(const PackedMatrix& m, const QuantizedRows& x, float* y, int64_t ldy, int64_t g0,
                              int64_t g1);

// The int8 kernels. Their integer sums are exact and their float work per output is the same, so
// all of them give the same bits (tests hold every one the CPU has to the portable kernel).
enum class Int8Kernel {
  kPortable,    // plain C++
  kAvx2,        // 256-bit, vpmaddubsw (qmatmul_avx2.cpp)
  kAvxVnni,     // 256-bit, AVX-VNNI vpdpbusd (qmatmul_avxvnni.cpp)
  kAvx512Vnni,  // 512-bit, two groups per vector, AVX-512 VNNI vpdpbusd (qmatmul_avx512vnni.cpp)
  kAmx,         // AMX tile multiplies for calls of 13..16 rows, AVX-512 VNNI for the others (qmatmul_amx.cpp)
};
const char* int8_kernel_name(Int8Kernel k);  // "portable", "avx2", "avx-vnni", "avx512-vnni", "amx"
// The kernels whose path runs 512-bit instructions (and so the 512-bit activation quantizer).
inline bool is_512_bit(Int8Kernel k) { return k == Int8Kernel::kAvx512Vnni || k == Int8Kernel::kAmx; }
bool cpu_has_int8_kernel(Int8Kernel k);
// The kernel the int8 path runs for a host ISA on this CPU: the portable ISA runs the portable
// kernel; AVX-512 runs AMX where the CPU has it and `amx` allows, else AVX-512 VNNI where the CPU
// has it; otherwise (AVX2, or AVX-512 without VNNI) AVX-VNNI where present, else vpmaddubsw.
Int8Kernel int8_kernel_for(Isa isa, bool amx = true);
// The kernel for a type; throws std::invalid_argument for a kernel this CPU lacks or a type
// without a packed layout.
PackedKernel packed_kernel(Int8Kernel k, DType t);

PackedKernel portable_packed_kernel(DType t);
// The SIMD variants (nullptr for a type without a packed layout); call only where the CPU has them.
PackedKernel avx2_packed_kernel(DType t);
PackedKernel avxvnni_packed_kernel(DType t);
PackedKernel avx512vnni_packed_kernel(DType t);
PackedKernel amx_packed_kernel(DType t);
// Whether the AVX2 kernel's wide activations pay for n rows of `cols` columns: 2 or more rows
// whose wide blocks (320 bytes per row and block) fit in 30 KiB (QuantizedRows::kWideBytes) and,
// beside one group of weights, in a 32 KiB L1, so that they stay there from one group of weight
// rows to the next (past that they came from L2 and measured slower than broadcasts: 576 columns
// up to 5 rows, 1536 columns never; before the fifty-ninth session 2 rows of 1536, exactly 30 KiB,
// were read wide, 2.5% slower). The AVX-VNNI kernel's streaming
// tile reads broadcasts (measured faster at 5 rows of 576 on an Intel Xeon: 0.88-0.90x the time).
bool wide_rows_pay(int64_t n, int64_t cols);
// The outliers' terms: y[i, r] = fma(w[r, c], x_c, y[i, r]) for each of row i's outliers in order,
// for the weight rows of groups [g0, g1), with w[r, c] dequantized from the packed block as
// fma(d, q, m) (Q4_1, Q4_K, Q5_1, Q5_K), d * (q - 8) (Q4_0), d * (q - 16) (Q5_0), d * level[q]
// (IQ4_NL), d * q (Q8_0) or d * (s * (q - 32)) (Q6_K), in
// f32. qmatmul runs it after the kernel on the same groups. The AVX2 variant gives the same bits.
// Bytes of a packed group-block before its quants (scales and mins; see PackedMatrix).
size_t packed_header_bytes(DType t);
// Where column c's quant sits in a group-block of m (the vector passes' view of it): the block's
// offset in a group, the 32-bit lane word's offset in the block, the right shift that brings the
// quant to the word's low bits (Q8_0: the left shift that brings it to the top, for the sign),
// and whether it is in the block's upper 16 columns.
struct ColumnLocation {
  size_t blk_off = 0, word_off = 0;
  int shift = 0;
  bool high = false;
  size_t five_off = 0;  // five-bit layouts: the fifth-bit word's offset in the block; row r's bit is 4r + five_bit
  int five_bit = 0;
};
ColumnLocation column_location(const PackedMatrix& m, int64_t c);
// The 256-bit kernels (AVX2 and AVX-VNNI) add the outliers' terms themselves in their tiles,
// before the store, for calls of up to kFoldRows rows of Q4_0, Q4_1, Q4_K and Q8_0 (each weight
// column dequantized from the group-block just read, as the pass does: the same bits), where they
// hide under the weights' stream (docs/kernels.md, "The outliers' terms in the tiles of up to six
// rows", "The AVX-VNNI tiles fold the outliers and take six rows"; 7 to 16 rows measured the same
// either way on AVX2). Whether `kernel` adds them itself for n rows of type t (those so; the
// AVX-512 VNNI tiles and AMX always), or qmatmul runs the pass after it.
constexpr int64_t kFoldRows = 6;
bool kernel_adds_outliers(Int8Kernel kernel, DType t, int64_t n);
void add_outliers_portable(const PackedMatrix& m, const QuantizedRows& x, float* y, int64_t ldy, int64_t g0, int64_t g1);
void add_outliers_avx2(const PackedMatrix& m, const QuantizedRows& x, float* y, int64_t ldy, int64_t g0, int64_t g1);
// The output head's scans (qmatmul_logits), AVX2, the scalar loops' results: the largest of
// y[0..n) with NaNs skipped (-inf if there is none), and the indices o with y[o] >= floor in
// increasing order, written to idx (room for n), their count returned.
float logits_max_avx2(const float* y, int64_t n);
int64_t logits_at_least_avx2(const float* y, int64_t n, float floor, int64_t* idx);
// stored_row_dot over a Q8_0 row (34-byte blocks; cols a multiple of 32), AVX2, the same bits:
// the output head's refined logits (qmatmul_logits) without dequantizing the row first.
float stored_row_dot_q8_0_avx2(const uint8_t* row, const float* x, int64_t cols);
// This thread's wide copy of x's rows (see QuantizedRows::wide_ready; [n, blocks] blocks of
// kWideBlock bytes, 32-byte aligned), made from x.q, x.d and x.sx the first time the thread asks
// for this call's rows (x.generation): each thread of a call writes and reads its own copy, in its
// own L1, instead of reading lines the calling thread wrote in its cache (docs/kernels.md, "Each
// thread's own wide rows"). x's wide rows take at most kWideBytes (wide_rows_pay). AVX2.
const uint8_t* wide_rows_avx2(const QuantizedRows& x);
// This thread's copy of x's first lane_row_groups(n) * 8 rows eight to a vector (the lane kernel's activations,
// qmatmul_ymm.h): per group of 8 rows and block, kLaneBlock bytes, 32-byte aligned: eight vectors
// whose lane r holds 4 bytes of the group's row r (columns 4c..4c+3 in vector c), then the 8 rows'
// d, sx and isum. Made the first time the thread asks for this call's rows, as wide_rows_avx2.
constexpr size_t kLaneBlock = 8 * 32 + 3 * 8 * 4;  // 352 bytes per 8 rows and block
// The groups of 8 rows the lane kernel takes from a call of n rows: pairs of them, the remaining
// n % 16 rows left to the streaming tile.
constexpr int64_t lane_row_groups(int64_t n) { return n / 16 * 2; }
const uint8_t* lane_rows_avx2(const QuantizedRows& x);
// This thread's scratch for the lane kernel, 32-byte aligned and grown on demand (here, not in
// qmatmul_ymm.h, which calls no standard-library template): a group's unpacked bytes (256 a
// block), its scales and mins as floats ([block][weight row]), and the sums ([row group][weight
// row][8 rows]).
struct LaneScratch {
  uint8_t* bytes;
  float* scales;
  float* mins;
  float* sums;
};
LaneScratch lane_scratch_avx2(int64_t blocks, int64_t row_groups);
// The AVX2 activation quantizer (the same values as quantize_rows' portable one, faster): n rows
// of 32-value blocks; with `skip` ([n, kOutliers] columns, or nullptr), those values of each row
// are quantized as 0. `amax` ([n, cols / 32]) is each block's largest |x| with no value set
// aside, as block_amax gives it; only the blocks that hold set-aside values have theirs computed
// again.
void quantize_rows_avx2(const float* x, int64_t n, int64_t cols, const int32_t* skip, const float* amax, int8_t* q, float* d,
                        int32_t* isum, int32_t* isum_lo, float* sx);
// The same on AVX-512 F/BW/VL (quantize_avx512.cpp); call only where cpu_has_avx512().
void quantize_rows_avx512(const float* x, int64_t n, int64_t cols, const int32_t* skip, const float* amax, int8_t* q, float* d,
                          int32_t* isum, int32_t* isum_lo, float* sx);
// amax[b] = the largest |x| of 32-value block b (NaNs ignored); AVX2.
void block_amax_avx2(const float* x, int64_t blocks, float* amax);

}  // namespace host_kernels

// y_k[n, m_k.rows] = x[n, cols] * W_k^T for every k, with x quantized once and one parallel
// region for all the matrices (q/k/v, gate/up). Every W_k has `cols` columns.
void qmatmul(std::span<const PackedMatrix* const> ws, const float* x, int64_t n, std::span<float* const> ys,
             ThreadPool& pool, host_kernels::Int8Kernel kernel);

// r[n, cols]: what the int8 rounding of `first` (x quantized by quantize_rows) left of x:
// x - d * q per value, 0 at the set-aside columns (they are exact).
void residual_rows(const float* x, const QuantizedRows& first, float* r);

// y[n, w.rows] = x[n, cols] * W^T with each activation row taken as two int8 rows: x's own
// rounding and the rounding of its residual (residual_rows), whose products are added per output:
// y = W q(x) + W q(x - q(x)). The rounding error falls from ~d/4 to ~d/1000 a value for twice the
// integer work; the last layer's down projection takes it (HostOps::matmul_refined,
// docs/kernels.md "The last down projection in two int8 rows"). Row i's result depends on x's
// row i alone, as qmatmul's.
void qmatmul_refined(const PackedMatrix& w, const float* x, int64_t n, float* y, ThreadPool& pool,
                     host_kernels::Int8Kernel kernel);

// The output head (HostOps::matmul_logits): y[n, m.rows] = x * W^T by qmatmul, then in each row
// the outputs within kLogitMargin of the row's largest (at most kLogitCap of them: the largest,
// ties to the lower index) are computed again with f32 activations, stored_row_dot over the
// stored row `stored` (the same matrix as stored in the file). Those are the logits that decide
// the argmax and hold nearly all of the probability; the int8 rounding of x no longer moves them
// (docs/kernels.md, "The output head's top logits in f32"). Row i's result depends on x's row i
// alone, as qmatmul's.
inline constexpr float kLogitMargin = 4.0f;
inline constexpr int64_t kLogitCap = 64;
void qmatmul_logits(const PackedMatrix& m, const TensorView& stored, const float* x, int64_t n, float* y, ThreadPool& pool,
                    host_kernels::Int8Kernel kernel);
// sum_j w[o][j] * x[j] over stored row o dequantized to f32 (into buf, w.cols() floats): 16
// partial sums over j mod 16, added in lane order.
float stored_row_dot(const TensorView& w, int64_t o, const float* x, float* buf);

}  // namespace specula
