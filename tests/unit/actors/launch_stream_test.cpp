// LaunchStream (streams/launch_stream.h): host code runs in order on a launch thread and queues
// work on a device stream; an event completes only when the device has run what was queued
// before it, and carries the first failure of either side. The device here is a HostStream, the
// role a CudaStream plays on a GPU.
#include "streams/launch_stream.h"

#include <gtest/gtest.h>

#include <atomic>
#include <semaphore>
#include <stdexcept>
#include <thread>
#include <vector>

#include "streams/host_stream.h"

namespace specula::streams {
namespace {

TEST(LaunchStream, RunsHostCodeInOrderOnItsLaunchThreadNotTheCallers) {
  LaunchStream stream("verify", std::make_unique<HostStream>("device"));
  std::vector<int> ran;
  std::vector<std::thread::id> threads;
  for (int i = 0; i < 1000; ++i) stream.enqueue([&, i] {
    ran.push_back(i);
    threads.push_back(std::this_thread::get_id());
  });
  stream.synchronize();
  ASSERT_EQ(ran.size(), 1000u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(ran[i], i);
  EXPECT_NE(threads.front(), std::this_thread::get_id());
  for (const auto& t : threads) EXPECT_EQ(t, threads.front());
}

TEST(LaunchStream, AnEventWaitsForTheDeviceWorkTheLaunchedCodeQueued) {
  LaunchStream stream("verify", std::make_unique<HostStream>("device"));
  std::binary_semaphore gate(0);
  std::atomic<bool> device_ran{false};
  // The launched code queues device work that cannot finish until the gate opens.
  stream.enqueue([&] {
    stream.device().enqueue([&] {
      gate.acquire();
      device_ran = true;
    });
  });
  Event done = stream.record();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(done.ready()) << "the event completed while the device was still working";
  gate.release();
  done.wait();
  EXPECT_TRUE(device_ran.load());
}

TEST(LaunchStream, AnEventCarriesTheFailureOfTheLaunchedCodeOrOfTheDeviceWork) {
  LaunchStream stream("verify", std::make_unique<HostStream>("device"));
  stream.enqueue([] { throw std::runtime_error("launch failed"); });
  Event first = stream.record();
  EXPECT_THROW(first.wait(), std::runtime_error);
  stream.enqueue([&] { stream.device().enqueue([] { throw std::runtime_error("kernel failed"); }); });
  Event second = stream.record();
  try {
    second.wait();
    FAIL() << "the device's failure was not carried";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "kernel failed");
  }
  // A failure is reported once: the next event is clean.
  stream.enqueue([] {});
  EXPECT_NO_THROW(stream.record().wait());
}

}  // namespace
}  // namespace specula::streams
