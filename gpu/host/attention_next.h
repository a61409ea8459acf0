// The lines of the chunk a thread computes next (AttentionChunk::next), which the attention
// kernels over a transposed K (attention_avx2.cpp, attention_avx512.cpp,
// attention_avx512bf16.cpp) ask for into L2 a few at a time while they compute the current
// chunk: the next chunk's reads overlap this one's arithmetic instead of following it
// (docs/kernels.md, "The next chunk's lines"). Internal linkage, so each file built with its own
// instruction set keeps its own copy, as with attention_pieces.h.
#pragma once
#include <xmmintrin.h>

#include <cstdint>

#include "gpu/host/attention.h"

namespace specula::host_kernels {

namespace {

// No standard-library function templates here (see matmul_blocks.h).

// Walks the chunk's K runs of 16 positions (hd dimensions, fp16, or hd / 2 dimension pairs with
// bf16 pairs), then its V rows (one position each, or a pair of positions with bf16 pairs), a
// line at a time, holding only its place. Nothing for a chunk without a transposed K, without
// positions, or with blocks that do not hold whole runs. `steps`: how many times the current
// chunk's passes will call step(), over which the lines are spread evenly.
class NextLines {
 public:
  NextLines() = default;
  explicit NextLines(const AttentionChunk* c, int64_t steps = 1) {
    if (c == nullptr || !c->k_transposed || c->p1 <= c->p0 || c->block_tokens % 16 != 0) return;
    const int64_t bt = c->block_tokens, hd = c->head_dim, n = c->p1 - c->p0;
    blocks_ = c->blocks;
    bt_ = bt;
    p0_ = c->p0;
    bf16_ = c->bf16;
    row_bytes_ = c->row_stride * 2;
    k_ = static_cast<const char*>(c->k);
    v_ = static_cast<const char*>(c->v);
    // A run's pieces: a dimension's 16 positions (32 bytes, bt * 2 apart) or a pair's (64 bytes,
    // bt * 4 apart); contiguous when the block holds exactly one run.
    const int64_t piece = bf16_ ? 64 : 32, stride = bf16_ ? bt * 4 : bt * 2, count = bf16_ ? hd / 2 : hd;
    k_step_ = stride == piece ? 64 : stride;
    k_lines_ = stride == piece ? (count * piece + 63) / 64 : count;
    v_lines_ = ((bf16_ ? hd * 4 : hd * 2) + 63) / 64;
    runs_ = (n + 15) / 16;
    lines_ = runs_ * k_lines_ + (bf16_ ? (n + 1) / 2 : n) * v_lines_;
    per_step_ = (lines_ + steps - 1) / steps;
  }

  // Lines in all (some may repeat: two runs of a 32-position block share their lines).
  int64_t lines() const { return lines_; }

  // Asks for the next lines into L2: a step's share of them, or all that are left.
  void step() { issue(per_step_); }
  void finish() { issue(lines_); }

  // f(an address in the line) for the next `count` lines, in order.
  template <class F>
  void walk(int64_t count, F&& f) {
    for (; count > 0 && done_ < lines_; --count, ++done_) {
      if (at_ == nullptr) at_ = start();
      f(at_);
      at_ += stride_;
      if (++i_ == unit_lines_) at_ = nullptr, i_ = 0, ++unit_;
    }
  }

 private:
  // Asks for the next `count` lines into L2 (nothing once every line has been asked for).
  void issue(int64_t count) {
    walk(count, [](const char* line) { _mm_prefetch(line, _MM_HINT_T1); });
  }

  // The first line of unit_: K's run unit_, then V's row (or pair) unit_ - runs_.
  const char* start() {
    if (unit_ < runs_) {
      const int64_t p = p0_ + 16 * unit_, in_block = bf16_ ? 2 * (p % bt_) : p % bt_;
      stride_ = k_step_, unit_lines_ = k_lines_;
      return k_ + (static_cast<int64_t>(blocks_[p / bt_]) * bt_ * (row_bytes_ / 2) + in_block) * 2;
    }
    const int64_t p = p0_ + (bf16_ ? 2 : 1) * (unit_ - runs_);
    stride_ = 64, unit_lines_ = v_lines_;
    return v_ + (static_cast<int64_t>(blocks_[p / bt_]) * bt_ + p % bt_) * row_bytes_;
  }

  const int32_t* blocks_ = nullptr;
  const char *k_ = nullptr, *v_ = nullptr, *at_ = nullptr;
  bool bf16_ = false;
  int64_t bt_ = 16, p0_ = 0, row_bytes_ = 0, k_step_ = 64, k_lines_ = 0, v_lines_ = 0, runs_ = 0, lines_ = 0, per_step_ = 0;
  int64_t done_ = 0, unit_ = 0, i_ = 0, stride_ = 64, unit_lines_ = 0;  // the walk's place
};

}  // namespace

}  // namespace specula::host_kernels
