// CUDA streams: the host stream tests again on cudaStream_t/cudaEvent_t. Each test skips, with
// the reason, where the CUDA parts were not built or no CUDA GPU is present; none passes there.
#include <gtest/gtest.h>

#ifdef SPECULA_HAVE_CUDA

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <semaphore>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "streams/cuda_stream.h"
#include "streams/host_stream.h"

namespace specula::streams {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

class CudaStreamTest : public testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      GTEST_SKIP() << "no CUDA GPU: cudaGetDeviceCount failed: " << cudaGetErrorString(status);
    }
    if (count == 0) GTEST_SKIP() << "no CUDA GPU: cudaGetDeviceCount reports 0 devices";
  }
};

TEST_F(CudaStreamTest, RunsHostWorkInTheOrderItWasEnqueued) {
  CudaStream stream(0, "order");
  std::vector<int> ran;
  for (int i = 0; i < 1000; ++i) stream.enqueue([&ran, i] { ran.push_back(i); });
  stream.synchronize();
  ASSERT_EQ(ran.size(), 1000u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(ran[i], i);
}

TEST_F(CudaStreamTest, AnEventAwaitedFromACoroutineResumesItOnTheCoroutinesExecutor) {
  asio::io_context io;
  auto strand = asio::make_strand(io);
  CudaStream stream;
  std::binary_semaphore gate(0);
  std::thread::id callback_thread, io_thread, resumed_on;
  bool on_strand = false;
  stream.enqueue([&] {
    callback_thread = std::this_thread::get_id();
    gate.acquire();
  });
  Event event = stream.record();
  asio::co_spawn(strand, [&]() -> asio::awaitable<void> {
    co_await event.async_wait(asio::use_awaitable);
    resumed_on = std::this_thread::get_id();
    on_strand = strand.running_in_this_thread();
  }, asio::detached);
  std::thread runner([&] {
    io_thread = std::this_thread::get_id();
    io.run();
  });
  std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(event.ready());
  gate.release();
  runner.join();
  EXPECT_EQ(resumed_on, io_thread);
  EXPECT_NE(resumed_on, callback_thread);
  EXPECT_TRUE(on_strand);
}

TEST_F(CudaStreamTest, WaitingOnAnotherStreamsEventDoesNotRunAhead) {
  CudaStream a(0, "a"), b(0, "b");
  std::binary_semaphore gate(0);
  std::atomic<bool> a_done{false}, b_ran{false};
  bool b_saw_a_done = false;
  a.enqueue([&] {
    gate.acquire();
    a_done = true;
  });
  b.wait(a.record());  // on the GPU: cudaStreamWaitEvent
  b.enqueue([&] {
    b_saw_a_done = a_done.load();
    b_ran = true;
  });
  Event b_done = b.record();
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(b_ran.load()) << "b ran ahead of the event it waits for";
  gate.release();
  b_done.wait();
  EXPECT_TRUE(b_saw_a_done);
}

TEST_F(CudaStreamTest, AFailedHostWorkItemIsCarriedByTheNextEventAndTheStreamGoesOn) {
  CudaStream stream;
  stream.enqueue([] { throw std::runtime_error("host work failed"); });
  Event failed = stream.record();
  bool later_ran = false;
  stream.enqueue([&] { later_ran = true; });
  Event fine = stream.record();
  EXPECT_THROW(failed.wait(), std::runtime_error);
  EXPECT_NO_THROW(fine.wait());
  EXPECT_TRUE(later_ran);
}

// Host work runs on CUDA's callback thread, where CUDA may not be called; a wait on the stream
// itself there would never return. Such work is refused with a message instead of hanging.
TEST_F(CudaStreamTest, HostWorkThatCallsCudaOnItsOwnStreamIsRefusedInsteadOfDeadlocking) {
  CudaStream stream(0, "callback");
  stream.enqueue([&] { stream.record(); });  // record() calls cudaEventRecord on this very stream
  Event refused = stream.record();
  try {
    refused.wait();
    ADD_FAILURE() << "CUDA called from a host callback was not refused";
  } catch (const std::exception& e) {
    EXPECT_NE(dynamic_cast<const std::logic_error*>(&e), nullptr) << "not the guard's refusal: " << e.what();
    EXPECT_NE(std::string(e.what()).find("host callback"), std::string::npos) << e.what();
  }
  bool later_ran = false;
  stream.enqueue([&] { later_ran = true; });
  EXPECT_NO_THROW(stream.record().wait());  // the stream goes on
  EXPECT_TRUE(later_ran);
}

TEST_F(CudaStreamTest, RefusesToWaitOnAnUnfinishedHostEvent) {
  CudaStream cuda;
  HostStream host;
  std::binary_semaphore gate(0);
  host.enqueue([&] { gate.acquire(); });
  Event unfinished = host.record();
  EXPECT_THROW(cuda.wait(unfinished), std::invalid_argument);
  gate.release();
  unfinished.wait();
  EXPECT_NO_THROW(cuda.wait(unfinished));  // a finished one needs no waiting
}

}  // namespace
}  // namespace specula::streams

#else  // built without CUDA

TEST(CudaStream, NeedsTheCudaBuild) {
  GTEST_SKIP() << "no CUDA GPU: the CUDA parts were not built (nvcc was not found at configure time)";
}

#endif
