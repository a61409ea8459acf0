// How the SIMD attention kernels split a round's queries into passes and pick a pass's template
// (attention_avx2.cpp, attention_avx512.cpp, attention_avx512bf16.cpp, each built with its own
// instruction set): everything here has internal linkage, so each file keeps its own copy, as
// with qmatmul_zmm.h.
#pragma once
#include <cstdint>

namespace specula::host_kernels {

namespace {

// No standard-library function templates here (see matmul_blocks.h).

// Sizes of `count` items split into as few pieces of at most `most` as possible, as even as
// possible (7 -> 4 + 3 with most 6); calls f(first, size) per piece.
template <class F>
inline void pieces(int64_t count, int64_t most, F&& f) {
  const int64_t parts = (count + most - 1) / most;
  for (int64_t p = 0, first = 0; p < parts; ++p) {
    const int64_t size = count / parts + (p < count % parts ? 1 : 0);
    f(first, size);
    first += size;
  }
}

// f.template operator()<S>() with S = size for sizes kFirst .. kLast - 1, S = kLast for any other
// (a switch over the sizes a kernel is instantiated for, its default the largest).
template <int kFirst, int kLast, class F>
inline void with_size(int64_t size, F&& f) {
  if constexpr (kFirst < kLast) {
    if (size == kFirst) {
      f.template operator()<kFirst>();
      return;
    }
    with_size<kFirst + 1, kLast>(size, f);
  } else {
    f.template operator()<kLast>();
  }
}

}  // namespace

}  // namespace specula::host_kernels
