// Fork-join thread pool for the host kernels. A decode step makes a few hundred parallel_for
// calls of a few microseconds each, so dispatch must cost well under a microsecond while the
// pool is busy, yet idle workers must not hold a core: they spin on the generation counter for
// a short while, then sleep on a futex until the next job.
//
// Chunking is deterministic: [0, n) is cut into the same chunks (multiples of grain) for the
// same (n, grain, threads); which thread runs a chunk is decided at run time by an atomic
// counter, so a late worker (or one the OS preempted on this shared machine) just takes fewer
// chunks. Kernels write disjoint outputs per index, so results do not depend on who ran what.
#include "gpu/host/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SPECULA_CPU_RELAX() _mm_pause()
#else
#define SPECULA_CPU_RELAX() std::this_thread::yield()
#endif

namespace specula {

namespace {

// How long an idle worker keeps spinning before it sleeps; long enough to bridge the gaps
// between the kernels of one decode step, short enough not to steal the core between requests.
constexpr auto kSpinFor = std::chrono::microseconds(200);
// Chunks per thread: more balances better when a thread is slow; fewer costs fewer atomics.
constexpr int64_t kChunksPerThread = 4;

thread_local bool t_inside_pool_job = false;

// Sleep/wake on a 32-bit atomic with the futex system call directly: the kernel re-checks the
// value, so no wake-up can be lost, and nothing depends on libstdc++'s waiter bookkeeping.
template <class T>
void futex_wait(std::atomic<T>& a, T expected) {
  static_assert(sizeof(T) == 4 && std::atomic<T>::is_always_lock_free);
  syscall(SYS_futex, reinterpret_cast<int*>(&a), FUTEX_WAIT_PRIVATE, static_cast<int>(expected), nullptr, nullptr, 0);
}
template <class T>
void futex_wake_all(std::atomic<T>& a) {
  syscall(SYS_futex, reinterpret_cast<int*>(&a), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

// Spin with a pause until pred() holds or the budget is spent; true if pred() held.
template <class Pred>
bool spin_until(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinFor;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (pred()) return true;
      SPECULA_CPU_RELAX();
    }
    if (std::chrono::steady_clock::now() >= deadline) return pred();
  }
}

}  // namespace

struct ThreadPool::Impl {
  int threads = 1;
  std::vector<std::thread> workers;

  // Bumped once per job (and once at shutdown); workers wait for it to change.
  alignas(64) std::atomic<uint32_t> generation{0};
  // Workers that have not yet finished the current job; the caller waits for it to reach 0
  // before returning, since the job lives on the caller's stack.
  alignas(64) std::atomic<int> busy{0};
  // Next chunk index to claim.
  alignas(64) std::atomic<int64_t> next_chunk{0};

  // The current job, written by the caller before the generation bump (release) and read by
  // workers after they observe it (acquire).
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0, grain = 1, units = 0, chunks = 0;
  bool stop = false;

  std::mutex error_mutex;
  std::exception_ptr error;

  // Chunk c covers grain-units [c*units/chunks, (c+1)*units/chunks): contiguous, balanced to
  // within one unit, and a pure function of (n, grain, chunks).
  void run_chunks() {
    for (;;) {
      const int64_t c = next_chunk.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks) return;
      const int64_t begin = std::min(n, c * units / chunks * grain);
      const int64_t end = std::min(n, (c + 1) * units / chunks * grain);
      try {
        (*fn)(begin, end);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  }

  void worker_loop() {
    t_inside_pool_job = true;  // a parallel_for from inside a job runs inline
    // Not generation.load(): a job posted before this thread first ran must still be seen.
    uint32_t seen = 0;
    for (;;) {
      if (!spin_until([&] { return generation.load(std::memory_order_acquire) != seen; })) {
        futex_wait(generation, seen);
        continue;  // re-check: wait may return spuriously
      }
      seen = generation.load(std::memory_order_acquire);
      if (stop) return;
      run_chunks();
      if (busy.fetch_sub(1, std::memory_order_acq_rel) == 1) futex_wake_all(busy);
    }
  }
};

ThreadPool::ThreadPool(int threads) : impl_(new Impl) {
  impl_->threads = std::max(1, threads);
  impl_->workers.reserve(static_cast<size_t>(impl_->threads - 1));
  for (int i = 1; i < impl_->threads; ++i) impl_->workers.emplace_back([this] { impl_->worker_loop(); });
}

ThreadPool::~ThreadPool() {
  impl_->stop = true;
  impl_->generation.fetch_add(1, std::memory_order_release);
  futex_wake_all(impl_->generation);
  for (auto& w : impl_->workers) w.join();
  delete impl_;
}

int ThreadPool::threads() const { return impl_->threads; }

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  Impl& p = *impl_;
  const int64_t units = (n + grain - 1) / grain;
  const int64_t chunks = std::min(units, p.threads * kChunksPerThread);
  if (p.threads == 1 || chunks == 1 || t_inside_pool_job) {
    // Same chunk boundaries as the parallel path, so a reduction keyed by chunk agrees.
    for (int64_t c = 0; c < chunks; ++c) fn(std::min(n, c * units / chunks * grain), std::min(n, (c + 1) * units / chunks * grain));
    return;
  }

  p.fn = &fn;
  p.n = n;
  p.grain = grain;
  p.units = units;
  p.chunks = chunks;
  p.next_chunk.store(0, std::memory_order_relaxed);
  p.busy.store(static_cast<int>(p.workers.size()), std::memory_order_relaxed);
  p.generation.fetch_add(1, std::memory_order_release);
  futex_wake_all(p.generation);

  t_inside_pool_job = true;
  p.run_chunks();
  t_inside_pool_job = false;

  // Workers are usually finishing their last chunk: spin, then sleep if one was preempted.
  auto all_done = [&] { return p.busy.load(std::memory_order_acquire) == 0; };
  if (!spin_until(all_done)) {
    for (int b = p.busy.load(std::memory_order_acquire); b != 0; b = p.busy.load(std::memory_order_acquire)) futex_wait(p.busy, b);
  }
  p.fn = nullptr;
  if (p.error) {
    std::exception_ptr e;
    std::swap(e, p.error);
    std::rethrow_exception(e);
  }
}

}  // namespace specula
