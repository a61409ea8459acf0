// Fork-join thread pool for the host kernels. A decode step makes a few hundred parallel_for
// calls of a few microseconds each, so dispatch must cost well under a microsecond while the
// pool is busy, yet idle workers must not hold a core: they spin on the generation counter for
// a short while, then sleep in std::atomic::wait until the next job.
//
// Chunking is deterministic: [0, n) is cut into the same chunks (multiples of grain) for the
// same (n, grain, threads, tail pieces). Which thread runs a chunk is decided at run time: chunks
// are claimed from one atomic word that also names the job, so a worker that wakes late (or that
// the OS preempted on this shared 2-core machine) takes no chunk of a finished job, and the
// caller, who claims chunks too, never waits for a worker that has not started. Kernels write
// disjoint outputs per index, so results do not depend on who ran what.
#include "gpu/host/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SPECULA_CPU_RELAX() _mm_pause()
#else
#define SPECULA_CPU_RELAX() std::this_thread::yield()
#endif

namespace specula {

namespace {

// How long an idle worker spins before it sleeps: long enough to bridge the gaps between the
// kernels of one decode step, short enough not to steal the core between requests.
constexpr auto kWorkerSpin = std::chrono::microseconds(100);
// How long the caller spins for the last chunks before it sleeps (a running worker finishes a
// chunk in microseconds; a preempted one may take a scheduler tick).
constexpr auto kCallerSpin = std::chrono::microseconds(50);
// Chunks per thread. More would balance better when a thread is slow, but one each measured
// fastest on the default model (Zen 4, 2 threads; docs/kernels.md, "One chunk a thread"): a
// forward of 1-16 tokens 3-6% shorter than with 4, 2% with 2, 4-10% longer with 8 or 16. Each
// thread then streams one contiguous range of a matrix's weights instead of jumping between
// chunks, and claims once. The caller still takes every chunk a late worker has not claimed.
// A job may ask for tail pieces besides (parallel_for's `tail_pieces`): its last tenth (or a unit
// a piece, if that is more) cut small and claimed by whichever thread is free first, which the
// qmatmul kernels do from 16 rows.
constexpr int64_t kChunksPerThread = 1;
// At most 1,024 threads and 1,024 tail pieces: the claim word's 16-bit chunk count holds them.
constexpr int kMaxThreads = 1024, kMaxTailPieces = 1024;
static_assert(kMaxThreads * kChunksPerThread + kMaxTailPieces <= 0xffff, "the claim word counts chunks in 16 bits");

thread_local bool t_inside_pool_job = false;

// Spin with a pause until pred() holds or `budget` is spent; true if pred() held.
template <class Pred>
bool spin_until(Pred pred, std::chrono::microseconds budget) {
  const auto deadline = std::chrono::steady_clock::now() + budget;
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      if (pred()) return true;
      SPECULA_CPU_RELAX();
    }
    if (std::chrono::steady_clock::now() >= deadline) return pred();
  }
}

// The claim word: job id (32 bits) | chunk count (16) | next unclaimed chunk (16).
constexpr uint64_t claim_word(uint32_t job, uint32_t chunks, uint32_t next) { return (uint64_t{job} << 32) | (uint64_t{chunks} << 16) | next; }
constexpr uint32_t claim_chunks(uint64_t c) { return static_cast<uint32_t>(c >> 16) & 0xffffu; }
constexpr uint32_t claim_next(uint64_t c) { return static_cast<uint32_t>(c) & 0xffffu; }

// How a job's `units` grain-units are cut: `main` chunks share the first `main_units` (one a
// thread), then `pieces` chunks share the rest. A pure function of (units, threads, tail_pieces).
struct Layout {
  int64_t units = 0, main = 1, main_units = 0, pieces = 0;
  int64_t chunks() const { return main + pieces; }
};

// The tail is a tenth of the units (at least a unit a piece); without enough units for a piece
// a thread besides, no tail.
Layout layout_of(int64_t units, int threads, int tail_pieces) {
  Layout l;
  l.units = units;
  l.main = std::min<int64_t>(units, int64_t{threads} * kChunksPerThread);
  l.main_units = units;
  if (threads > 1 && tail_pieces > 0) {
    const int64_t tail = std::max<int64_t>(tail_pieces, units / 10);
    if (units - tail >= l.main) {
      l.pieces = tail_pieces;
      l.main_units = units - tail;
    }
  }
  return l;
}

// Chunk c covers grain-units [c*m/main, (c+1)*m/main) of the first m = main_units, then the
// pieces split the rest the same way: contiguous, balanced to within one unit.
std::pair<int64_t, int64_t> chunk_range(int64_t c, const Layout& l, int64_t grain, int64_t n) {
  int64_t u0 = 0, u1 = 0;
  if (c < l.main) {
    u0 = c * l.main_units / l.main;
    u1 = (c + 1) * l.main_units / l.main;
  } else {
    const int64_t t = c - l.main, rest = l.units - l.main_units;
    u0 = l.main_units + t * rest / l.pieces;
    u1 = l.main_units + (t + 1) * rest / l.pieces;
  }
  return {std::min(n, u0 * grain), std::min(n, u1 * grain)};
}

}  // namespace

struct ThreadPool::Impl {
  int threads = 1;
  std::vector<std::thread> workers;

  // Bumped once per job (and once at shutdown); idle workers wait for it to change.
  alignas(64) std::atomic<uint32_t> generation{0};
  // claim_word(job, chunks, next). A chunk is taken by a CAS on the whole word, so a claim
  // succeeds only against the current job, and while any of its chunks is claimed but not
  // done the caller has not returned: the job's fields below are safe to read.
  alignas(64) std::atomic<uint64_t> claim{0};
  // Chunks of the current job finished; the caller returns when it reaches the chunk count.
  alignas(64) std::atomic<uint32_t> done{0};

  // The current job: written by the caller before the release store of `claim`.
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0, grain = 1;
  Layout layout;
  uint32_t job = 0;
  // Set by the destructor before its generation bump; atomic because a worker that woke for an
  // earlier job may still be reading it.
  std::atomic<bool> stop{false};

  std::mutex error_mutex;
  std::exception_ptr error;

  // Claims and runs chunks until the current job has none left unclaimed.
  void run_chunks() {
    uint64_t c = claim.load(std::memory_order_acquire);
    for (;;) {
      const uint32_t chunks = claim_chunks(c), next = claim_next(c);
      if (next >= chunks) return;
      if (!claim.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      const auto [begin, end] = chunk_range(next, layout, grain, n);
      try {
        (*fn)(begin, end);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) done.notify_one();
      c = claim.load(std::memory_order_acquire);
    }
  }

  void worker_loop() {
    t_inside_pool_job = true;  // a parallel_for from inside a job runs inline
    // 0, the value before any job, not a fresh load: a worker that starts late must still see
    // the first job's bump as new.
    uint32_t seen = 0;
    for (;;) {
      if (!spin_until([&] { return generation.load(std::memory_order_acquire) != seen; }, kWorkerSpin)) {
        generation.wait(seen, std::memory_order_acquire);
        continue;  // re-check: wait may return spuriously
      }
      seen = generation.load(std::memory_order_acquire);
      if (stop.load(std::memory_order_acquire)) return;
      run_chunks();
    }
  }
};

ThreadPool::ThreadPool(int threads) : impl_(new Impl) {
  impl_->threads = std::clamp(threads, 1, kMaxThreads);
  impl_->workers.reserve(static_cast<size_t>(impl_->threads - 1));
  for (int i = 1; i < impl_->threads; ++i) impl_->workers.emplace_back([this] { impl_->worker_loop(); });
}

ThreadPool::~ThreadPool() {
  impl_->stop.store(true, std::memory_order_release);
  impl_->generation.fetch_add(1, std::memory_order_release);
  impl_->generation.notify_all();
  for (auto& w : impl_->workers) w.join();
  delete impl_;
}

int ThreadPool::threads() const { return impl_->threads; }

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn,
                              int tail_pieces) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  Impl& p = *impl_;
  const Layout layout = layout_of((n + grain - 1) / grain, p.threads, std::clamp(tail_pieces, 0, kMaxTailPieces));
  const int64_t chunks = layout.chunks();
  if (p.threads == 1 || chunks == 1 || t_inside_pool_job) {
    // The same chunk boundaries as the parallel path, run in order on this thread.
    for (int64_t c = 0; c < chunks; ++c) {
      const auto [b, e] = chunk_range(c, layout, grain, n);
      fn(b, e);
    }
    return;
  }

  p.fn = &fn;
  p.n = n;
  p.grain = grain;
  p.layout = layout;
  p.done.store(0, std::memory_order_relaxed);
  p.claim.store(claim_word(++p.job, static_cast<uint32_t>(chunks), 0), std::memory_order_release);
  p.generation.fetch_add(1, std::memory_order_release);
  p.generation.notify_all();  // libstdc++ skips the syscall when no worker sleeps

  t_inside_pool_job = true;
  p.run_chunks();
  t_inside_pool_job = false;

  // Every chunk is claimed; wait for the ones other threads are still running.
  const auto total = static_cast<uint32_t>(chunks);
  if (!spin_until([&] { return p.done.load(std::memory_order_acquire) == total; }, kCallerSpin)) {
    for (uint32_t d = p.done.load(std::memory_order_acquire); d != total; d = p.done.load(std::memory_order_acquire))
      p.done.wait(d, std::memory_order_acquire);
  }
  p.fn = nullptr;
  if (p.error) {
    std::exception_ptr e;
    std::swap(e, p.error);
    std::rethrow_exception(e);
  }
}

}  // namespace specula
