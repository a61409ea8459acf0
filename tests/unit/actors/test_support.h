// Shared by the actor runtime tests: message counts (scaled down under ThreadSanitizer) and a
// deadline for tests whose failure mode is a hang (a lost wake-up).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <thread>

namespace specula::test {

#ifdef SPECULA_TSAN
inline constexpr int kScale = 10;  // TSan runs ~10x slower
#else
inline constexpr int kScale = 1;
#endif

// Runs `body` on its own thread; `body` bumps the counter as it makes progress. If `quiet` passes
// with no bump, the threads it started are stuck (a lost wake-up) and cannot be joined: say so and
// end the process, failing the test. For long tests on a machine that may be loaded, where a hang
// is the failure and slowness is not: threads starved of the CPU by other work only slow progress
// (the ping-pong tests ran 4 s alone, 12-17 s beside the rest of the suite, and over a minute
// beside two more busy processes on two cores).
inline void run_while_progressing(std::chrono::seconds quiet, const char* what,
                                  std::function<void(std::atomic<std::int64_t>&)> body) {
  std::atomic<std::int64_t> progress{0};
  std::packaged_task<void()> task([&] { body(progress); });
  std::future<void> done = task.get_future();
  std::thread runner(std::move(task));
  std::int64_t seen = 0;
  auto last = std::chrono::steady_clock::now();
  while (done.wait_for(std::chrono::milliseconds(200)) != std::future_status::ready) {
    if (const std::int64_t now_seen = progress.load(); now_seen != seen) {
      seen = now_seen;
      last = std::chrono::steady_clock::now();
    } else if (std::chrono::steady_clock::now() - last > quiet) {
      std::fprintf(stderr, "FATAL: %s made no progress for %lld s (at step %lld): a wake-up was lost\n", what,
                   static_cast<long long>(quiet.count()), static_cast<long long>(seen));
      std::fflush(nullptr);
      std::abort();
    }
  }
  runner.join();
  done.get();  // rethrows what the body threw
}

// The same for a body that reports no progress: it must return within `limit`.
inline void run_with_deadline(std::chrono::seconds limit, const char* what, std::function<void()> body) {
  run_while_progressing(limit, what, [&](std::atomic<std::int64_t>&) { body(); });
}

}  // namespace specula::test
