// --trace: Chrome trace-event JSON with a lane per stream and actor; with pipelining the draft
// stream works during verification, without it never (the control).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <unistd.h>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/unit/engine/default_model.h"
#include "actors/engine.h"

namespace specula::actors {
namespace {

struct Span {
  double t0, t1;
};

// Runs `requests` concurrent skip-drafted requests and returns the trace the engine wrote when closed.
nlohmann::json traced_run(bool pipeline, int requests = 4) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("specula_engine_trace_" + std::to_string(::getpid()) + (pipeline ? "_on" : "_off") + ".json"))
                               .string();
  {
    EngineConfig cfg;
    cfg.target = default_model_path();
    cfg.drafter = "skip:4-7";
    cfg.device = "host";
    cfg.draft.k = 2;
    cfg.kv_tokens = 1024;
    cfg.pipeline = pipeline;
    cfg.pipeline_on_shared_cores = true;
    cfg.trace_path = path + (requests == 1 ? ".1" : "");
    Engine engine(cfg);
    std::vector<TokenStream> streams;
    for (int i = 0; i < requests; ++i) {
      EngineRequest r;
      r.prompt = "Tell me about the number " + std::to_string(i);
      r.max_tokens = 12;
      r.stop_ids = std::vector<int32_t>{};
      streams.push_back(engine.start(r));
    }
    for (TokenStream& s : streams)
      while (!s.next_blocking().terminal()) {
      }
  }
  const std::string written = path + (requests == 1 ? ".1" : "");
  std::ifstream in(written);
  EXPECT_TRUE(in) << path;
  nlohmann::json j = nlohmann::json::parse(in);
  std::filesystem::remove(written);
  return j;
}

// Seconds of verify-stream time during which the draft stream was also busy.
double overlap_us(const nlohmann::json& trace) {
  std::vector<Span> draft, verify;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const Span s{e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()};
    if (e["tid"] == 2) draft.push_back(s);
    if (e["tid"] == 3) verify.push_back(s);
  }
  double total = 0;
  for (const Span& v : verify)
    for (const Span& d : draft) total += std::max(0.0, std::min(v.t1, d.t1) - std::max(v.t0, d.t0));
  return total;
}

TEST(EngineTrace, TheTraceNamesALanePerStreamAndActorAndHasSpansOnEach) {
  if (!std::filesystem::exists(default_model_path())) GTEST_FAIL() << "no default model at " << default_model_path();
  const nlohmann::json trace = traced_run(true);
  std::map<int, std::string> names;
  std::map<int, int> spans;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") names[e["tid"].get<int>()] = e["args"]["name"];
    if (e["ph"] == "X") ++spans[e["tid"].get<int>()];
  }
  EXPECT_EQ(names[1], "scheduler");
  EXPECT_EQ(names[2], "draft stream");
  EXPECT_EQ(names[3], "verify stream");
  EXPECT_EQ(names[4], "sampler");
  for (int lane = 1; lane <= 4; ++lane) EXPECT_GT(spans[lane], 0) << names[lane];
  EXPECT_GT(overlap_us(trace), 0) << "with pipelining the draft stream should work while the verify stream does";
}

TEST(EngineTrace, WithPipeliningARequestAloneHasItsNextRoundDraftedWhileThisOneIsVerified) {
  if (!std::filesystem::exists(default_model_path())) GTEST_FAIL() << "no default model at " << default_model_path();
  const nlohmann::json trace = traced_run(true, 1);
  int optimistic = 0;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["name"].get<std::string>().rfind("optimistic draft round", 0) == 0) ++optimistic;
  EXPECT_GT(optimistic, 0) << "no optimistic draft round in the trace";
  EXPECT_GT(overlap_us(trace), 0) << "the optimistic draft should run while the verify stream does";
}

TEST(EngineTrace, WithoutPipeliningTheDraftNeverOverlapsVerification) {
  if (!std::filesystem::exists(default_model_path())) GTEST_FAIL() << "no default model at " << default_model_path();
  EXPECT_EQ(overlap_us(traced_run(false)), 0);
}

}  // namespace
}  // namespace specula::actors
