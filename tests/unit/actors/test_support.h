// Shared by the actor runtime tests: message counts (scaled down under ThreadSanitizer) and a
// deadline for tests whose failure mode is a hang (a lost wake-up).
#pragma once

#include <chrono>
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

// Runs `body` on its own thread. If it has not returned within `limit`, the threads it started
// are stuck (a lost wake-up) and cannot be joined: say so and end the process, failing the test.
inline void run_with_deadline(std::chrono::seconds limit, const char* what,
                              std::function<void()> body) {
  std::packaged_task<void()> task(std::move(body));
  std::future<void> done = task.get_future();
  std::thread runner(std::move(task));
  if (done.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "FATAL: %s did not finish within %lld s: a wake-up was lost\n", what,
                 static_cast<long long>(limit.count()));
    std::fflush(nullptr);
    std::abort();
  }
  runner.join();
  done.get();  // rethrows what the body threw
}

}  // namespace specula::test
