// A small fork-join pool for the host device: parallel_for over a range, low dispatch latency.
#pragma once
#include <cstdint>
#include <functional>

namespace specula {

class ThreadPool {
 public:
  // threads includes the calling thread: ThreadPool(2) starts one worker.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const;
  // Splits [0, n) into contiguous chunks (multiples of `grain`) and runs fn(begin, end) on every
  // thread, the caller included; returns when all are done. Not reentrant; one caller at a time.
  // With `tail_pieces` > 0 (and enough units), one chunk a thread covers the range but its last
  // tenth (or one unit a piece, if that is more), which is cut into that many pieces claimed by
  // whichever thread is free first: for long compute-bound jobs whose halves finish at different
  // times (docs/kernels.md, "Tail pieces for calls of 16 rows and more"). The chunks are a pure
  // function of (n, grain, threads, tail_pieces) either way.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn, int tail_pieces = 0);

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace specula
