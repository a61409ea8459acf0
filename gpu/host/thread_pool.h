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
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace specula
