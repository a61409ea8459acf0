// The engine's draft and verifier actors drive their devices through streams those devices
// make (gpu/ops.h, Ops::make_stream; issue 14, item 4). No GPU is lent to this project, so the
// wiring is held here with a device double: a host device whose make_stream returns a stream
// that records which device made it, what the actor enqueued and which events it recorded (and
// so co_awaited), and on which thread the work ran. On a CUDA device the same calls give a
// launch thread over that device's CUDA stream (streams::LaunchStream over streams::CudaStream).
// A second double judges rounds "on the device" (Ops::judges_on_device, as the CUDA device does
// with gpu/cuda/device_verify.cu): the verifier must then hand the sampler only its verdicts,
// and the text must not change; a planted wrong judge shows the verdicts are what is used.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "tests/unit/engine/default_model.h"
#include "actors/engine.h"
#include "gpu/host/host_device.h"
#include "spec/speculative_sampling.h"
#include "streams/host_stream.h"

namespace specula::actors {
namespace {

// What the streams saw, per stream: the device that made it, its enqueues and records, and the
// threads its work ran on.
struct StreamRecord {
  int device = -1;
  int enqueued = 0, recorded = 0, events_completed = 0;
  std::set<std::thread::id> threads;
};
struct Log {
  std::mutex mu;
  int devices = 0;
  std::map<std::string, StreamRecord> streams;  // by stream name
};

class RecordingStream final : public streams::Stream {
 public:
  RecordingStream(std::string name, int device, std::shared_ptr<Log> log)
      : name_(std::move(name)), inner_(name_), log_(std::move(log)) {
    std::lock_guard lock(log_->mu);
    log_->streams[name_].device = device;
  }
  const std::string& name() const override { return name_; }
  void enqueue(std::function<void()> work) override {
    {
      std::lock_guard lock(log_->mu);
      ++log_->streams[name_].enqueued;
    }
    inner_.enqueue([this, work = std::move(work)] {
      {
        std::lock_guard lock(log_->mu);
        log_->streams[name_].threads.insert(std::this_thread::get_id());
      }
      work();
    });
  }
  streams::Event record() override {
    {
      std::lock_guard lock(log_->mu);
      ++log_->streams[name_].recorded;
    }
    streams::Event e = inner_.record();
    e.state()->on_complete([log = log_, name = name_](std::exception_ptr) {
      std::lock_guard lock(log->mu);
      ++log->streams[name].events_completed;
    });
    return e;
  }
  void wait(const streams::Event& event) override { inner_.wait(event); }

 private:
  std::string name_;
  streams::HostStream inner_;
  std::shared_ptr<Log> log_;
};

class RecordingDevice final : public HostOps {
 public:
  RecordingDevice(int threads, std::shared_ptr<Log> log) : HostOps(threads), log_(std::move(log)) {
    std::lock_guard lock(log_->mu);
    index_ = log_->devices++;
  }
  std::unique_ptr<streams::Stream> make_stream(const std::string& name) override {
    return std::make_unique<RecordingStream>(name, index_, log_);
  }

 private:
  std::shared_ptr<Log> log_;
  int index_ = 0;
};

// Judges on the "device" (here host memory) with spec/'s rule, counting its calls; `planted`
// accepts every draft instead (a wrong judge).
class JudgingDevice final : public HostOps {
 public:
  JudgingDevice(int threads, std::shared_ptr<std::atomic<int>> calls, bool planted)
      : HostOps(threads), calls_(std::move(calls)), planted_(planted) {}
  bool judges_on_device() const override { return true; }
  DeviceVerdict judge(const float* target_logits, const float* q, std::span<const int32_t> draft, int64_t vocab,
                      const DeviceSampling& ds, int64_t position) override {
    ++*calls_;
    const auto k = static_cast<int64_t>(draft.size());
    DraftProposal d;
    d.tokens.assign(draft.begin(), draft.end());
    if (q) d.q.assign(q, q + k * vocab);
    if (planted_ && k > 0) return DeviceVerdict{static_cast<int>(k), std::vector<int32_t>(d.tokens.begin(), d.tokens.end()), false};
    const SamplingParams sp{ds.temperature, ds.top_k, ds.top_p, ds.seed};
    const RoundOutcome o = verify_draft(d, {target_logits, static_cast<size_t>((k + 1) * vocab)}, sp, position,
                                        ds.coupled ? SpecSampling::Coupled : SpecSampling::Exact);
    return DeviceVerdict{o.accepted, o.tokens, o.bonus};
  }

 private:
  std::shared_ptr<std::atomic<int>> calls_;
  bool planted_;
};

// An ngram engine at batch 1 on the host, pipelined (where the cores are shared too) or not.
EngineConfig ngram_host_config(bool pipeline) {
  EngineConfig cfg;
  cfg.target = default_model_path();
  cfg.drafter = "ngram";
  cfg.device = "host";
  cfg.max_batch = 1;
  cfg.kv_tokens = 1024;
  cfg.pipeline = pipeline;
  cfg.pipeline_on_shared_cores = true;
  return cfg;
}

// One request through ngram_host_config(pipeline), its devices made by `devices` (make_device
// when empty).
GenerateResult generate_once(bool pipeline, std::function<std::unique_ptr<Ops>(const DeviceOptions&)> devices,
                             EngineRequest req) {
  EngineConfig cfg = ngram_host_config(pipeline);
  cfg.device_factory = std::move(devices);
  Engine engine(cfg);
  return engine.generate_blocking(std::move(req));
}

GenerateResult run(bool pipeline, const std::shared_ptr<Log>& log) {
  EngineRequest req;
  req.messages = {{"user", "Repeat after me: the quick brown fox jumps over the lazy dog."}};
  req.max_tokens = 32;
  if (!log) return generate_once(pipeline, {}, std::move(req));
  return generate_once(pipeline, [log](const DeviceOptions& o) { return std::make_unique<RecordingDevice>(o.threads, log); },
                       std::move(req));
}

class DeviceStreams : public ::testing::TestWithParam<bool> {};

TEST_P(DeviceStreams, TheDraftAndVerifierActorsRunOnStreamsTheirOwnDevicesMadeAndAwaitTheirEvents) {
  if (!std::filesystem::exists(default_model_path())) GTEST_SKIP() << "no default model at " << default_model_path();
  const bool pipeline = GetParam();
  auto log = std::make_shared<Log>();
  const GenerateResult got = run(pipeline, log);
  ASSERT_TRUE(got.error.empty()) << got.error;
  // The same text as the engine on plain host devices: the double changes only who made the streams.
  EXPECT_EQ(got.tokens, run(pipeline, nullptr).tokens);
  EXPECT_GT(got.stats.accepted, 0);

  std::lock_guard lock(log->mu);
  // Pipelining gives the draft its own device (and so its own stream on it); otherwise both
  // actors' streams come from the target's device.
  EXPECT_EQ(log->devices, pipeline ? 2 : 1);
  ASSERT_EQ(log->streams.count("verify"), 1u);
  ASSERT_EQ(log->streams.count("draft"), 1u);
  const StreamRecord& verify = log->streams.at("verify");
  const StreamRecord& draft = log->streams.at("draft");
  EXPECT_EQ(verify.device, 0);
  EXPECT_EQ(draft.device, pipeline ? 1 : 0);
  for (const StreamRecord* s : {&verify, &draft}) {
    // Every piece of work is followed by an event the actor co_awaits, and each completed.
    EXPECT_GT(s->enqueued, 2);
    EXPECT_EQ(s->recorded, s->enqueued);
    EXPECT_EQ(s->events_completed, s->recorded);
    EXPECT_EQ(s->threads.size(), 1u) << "a stream's work runs in order on its one worker";
  }
  EXPECT_NE(*verify.threads.begin(), *draft.threads.begin()) << "the draft and verify streams are distinct";
  EXPECT_EQ(log->streams.size(), 2u);
}

TEST(Pipelining, RunsOnlyWhereTheDraftStreamHasComputeOfItsOwn) {
  // Two host pools that together exceed the CPUs share them: no pipelining. A GPU's streams, or
  // host pools that fit, have their own.
  EXPECT_FALSE(draft_stream_has_own_compute(DeviceKind::Host, 2, 2, 2));
  EXPECT_FALSE(draft_stream_has_own_compute(DeviceKind::Host, 2, 1, 2));
  EXPECT_TRUE(draft_stream_has_own_compute(DeviceKind::Host, 1, 1, 2));
  EXPECT_TRUE(draft_stream_has_own_compute(DeviceKind::Host, 2, 2, 4));
  EXPECT_TRUE(draft_stream_has_own_compute(DeviceKind::Cuda, 2, 2, 2));
  EXPECT_GE(usable_cpus(), 1);
}

TEST(Pipelining, CountsAContainersCpuQuotaAsItsCpus) {
  EXPECT_EQ(cpus_of_quota("200000", "100000"), 2);
  EXPECT_EQ(cpus_of_quota("150000", "100000"), 2);  // rounded up
  EXPECT_EQ(cpus_of_quota("50000", "100000"), 1);
  EXPECT_EQ(cpus_of_quota("max", "100000"), 0);
  EXPECT_EQ(cpus_of_quota("-1", "100000"), 0);
  EXPECT_EQ(cpus_of_quota("", ""), 0);
  EXPECT_EQ(cpus_of_quota("100000", "0"), 0);
}

TEST(Pipelining, AskedForOnCoresTheStreamsWouldShareTheEngineRunsUnpipelinedOnOneDeviceWithTheSameText) {
  if (!std::filesystem::exists(default_model_path())) GTEST_SKIP() << "no default model at " << default_model_path();
  auto log = std::make_shared<Log>();
  EngineConfig cfg = ngram_host_config(true);
  cfg.pipeline_on_shared_cores = false;
  cfg.threads = usable_cpus();  // with the draft's as many again, more than the CPUs
  cfg.device_factory = [log](const DeviceOptions& o) { return std::make_unique<RecordingDevice>(o.threads, log); };
  EngineRequest req;
  req.messages = {{"user", "Repeat after me: the quick brown fox jumps over the lazy dog."}};
  req.max_tokens = 32;
  GenerateResult got;
  {
    Engine engine(cfg);
    EXPECT_FALSE(engine.pipelined());
    got = engine.generate_blocking(req);
  }
  ASSERT_TRUE(got.error.empty()) << got.error;
  EXPECT_EQ(got.tokens, run(false, nullptr).tokens);
  std::lock_guard lock(log->mu);
  EXPECT_EQ(log->devices, 1) << "no draft device is made";
  ASSERT_EQ(log->streams.count("draft"), 1u);
  EXPECT_EQ(log->streams.at("draft").device, 0);

  // The control: the same request with pipelining forced makes the draft device.
  cfg.pipeline_on_shared_cores = true;
  auto forced_log = std::make_shared<Log>();
  cfg.device_factory = [forced_log](const DeviceOptions& o) { return std::make_unique<RecordingDevice>(o.threads, forced_log); };
  {
    Engine forced(cfg);
    EXPECT_TRUE(forced.pipelined());
    EXPECT_EQ(forced.generate_blocking(req).tokens, got.tokens);
  }
  std::lock_guard forced_lock(forced_log->mu);
  EXPECT_EQ(forced_log->devices, 2);
}

GenerateResult judged(const SamplingParams& sp, SpecSampling mode, std::shared_ptr<std::atomic<int>> calls, bool planted) {
  EngineRequest req;
  req.messages = {{"user", "Repeat after me: the quick brown fox jumps over the lazy dog, twice."}};
  req.max_tokens = 40;
  req.sampling = sp;
  req.mode = mode;
  if (!calls) return generate_once(false, {}, std::move(req));
  return generate_once(
      false, [calls, planted](const DeviceOptions& o) { return std::make_unique<JudgingDevice>(o.threads, calls, planted); },
      std::move(req));
}

TEST(DeviceJudge, WhereTheDeviceJudgesTheSamplerGetsOnlyVerdictsAndTheTextIsUnchanged) {
  if (!std::filesystem::exists(default_model_path())) GTEST_SKIP() << "no default model at " << default_model_path();
  const struct {
    SamplingParams sp;
    SpecSampling mode;
  } cases[] = {{{0.0f, 0, 1.0f, 0}, SpecSampling::Exact}, {{0.8f, 40, 0.95f, 7}, SpecSampling::Exact},
               {{0.8f, 40, 0.95f, 7}, SpecSampling::Coupled}};
  for (const auto& c : cases) {
    auto calls = std::make_shared<std::atomic<int>>(0);
    const GenerateResult on_device = judged(c.sp, c.mode, calls, false);
    const GenerateResult on_host = judged(c.sp, c.mode, nullptr, false);
    ASSERT_TRUE(on_device.error.empty()) << on_device.error;
    EXPECT_EQ(on_device.tokens, on_host.tokens) << "temperature " << c.sp.temperature;
    EXPECT_EQ(calls->load(), on_device.stats.rounds) << "every round was judged on the device";
    if (c.sp.greedy()) {
      EXPECT_GT(on_device.stats.accepted, 0);
    }
  }
}

TEST(DeviceJudge, APlantedWrongDeviceJudgeChangesTheTextSoTheVerdictsAreWhatIsUsed) {
  if (!std::filesystem::exists(default_model_path())) GTEST_SKIP() << "no default model at " << default_model_path();
  const SamplingParams greedy{0.0f, 0, 1.0f, 0};
  auto calls = std::make_shared<std::atomic<int>>(0);
  const GenerateResult wrong = judged(greedy, SpecSampling::Exact, calls, true);
  EXPECT_GT(calls->load(), 0);
  EXPECT_NE(wrong.tokens, judged(greedy, SpecSampling::Exact, nullptr, false).tokens);
}

INSTANTIATE_TEST_SUITE_P(PipelineOffAndOn, DeviceStreams, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "Pipelined" : "Sequential"; });

}  // namespace
}  // namespace specula::actors
