// What `generate` and `bench spec` share about speculative decoding: the draft-length options
// and the statistics as JSON or as one line.
#pragma once
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "spec/speculative_generate.h"
#include "tools/specula/args.h"

namespace specula::cli {

// --spec-k (4), --adaptive, --spec-k-min (1), --spec-k-max (8), --spec-k-max-greedy (0 = the
// same), --draft-entropy (0 = off),
// --draft-confidence (0 = off), --draft-confidence-greedy (0 = the same);
// a UsageError for K outside 1..16. Defined in cmd_generate.cpp.
DraftLengthConfig draft_length_from_args(const Args& a);
// --spec-sampling exact|coupled (default exact); UsageError otherwise. Defined in cmd_generate.cpp.
SpecSampling spec_sampling_from_args(const Args& a);

// The draft-length settings as `bench spec` prints them: K (and its range when adaptive) and the
// rules' thresholds.
inline nlohmann::json draft_length_json(const DraftLengthConfig& d) {
  nlohmann::json j;
  j["k"] = d.k;
  j["adaptive"] = d.adaptive;
  if (d.adaptive) j["k_range"] = {d.k_min, d.k_max};
  if (d.adaptive && d.k_max_greedy > 0) j["k_range_greedy"] = {d.k_min, d.k_max_greedy};
  // The settings are floats: printed as the decimal they were given, not 0.30000001192...
  const auto given = [](float x) { return std::round(static_cast<double>(x) * 1e6) / 1e6; };
  j["draft_entropy"] = given(d.max_entropy);
  if (d.confidence_auto) {
    j["draft_confidence"] = "auto";
    j["draft_confidence_start"] = given(d.min_confidence);
  } else {
    j["draft_confidence"] = given(d.min_confidence);
  }
  if (d.min_confidence_greedy > 0) j["draft_confidence_greedy"] = given(d.min_confidence_greedy);
  return j;
}

// A run's sampling settings as the benchmarks print them (penalties only where set).
inline nlohmann::json sampling_json(const SamplingParams& sp) {
  nlohmann::json j = {{"temperature", sp.temperature}, {"top_k", sp.top_k}, {"top_p", sp.top_p}, {"min_p", sp.min_p},
                      {"seed", sp.seed}};
  if (sp.presence_penalty != 0.0f) j["presence_penalty"] = sp.presence_penalty;
  if (sp.frequency_penalty != 0.0f) j["frequency_penalty"] = sp.frequency_penalty;
  if (sp.repetition_penalty != 1.0f) j["repetition_penalty"] = sp.repetition_penalty;
  if (!sp.logit_bias.empty()) {
    nlohmann::json bias = nlohmann::json::object();
    for (const auto& [id, b] : sp.logit_bias) bias[std::to_string(id)] = b;
    j["logit_bias"] = std::move(bias);
  }
  if (sp.min_tokens > 0) j["min_tokens"] = sp.min_tokens;
  if (!sp.allowed_token_ids.empty()) j["allowed_token_ids"] = sp.allowed_token_ids;
  if (!sp.bad_words.empty()) j["bad_words_token_ids"] = sp.bad_words;
  return j;
}

inline nlohmann::json spec_stats_json(const SpeculativeStats& st) {
  nlohmann::json j;
  j["rounds"] = st.rounds;
  j["drafted"] = st.drafted;
  j["accepted"] = st.accepted;
  j["acceptance_rate"] = st.acceptance_rate();
  j["alpha"] = st.alpha();
  j["mean_accepted_length"] = st.mean_accepted_length();
  j["mean_draft_length"] = st.mean_draft_length();
  j["tokens_per_round"] = st.tokens_per_round();
  if (st.confidence_rounds > 0) j["mean_confidence_threshold"] = st.mean_confidence_threshold();
  j["per_position_acceptance"] = st.per_position_acceptance();
  j["draft_seconds"] = st.draft_seconds;
  j["verify_seconds"] = st.verify_seconds;
  return j;
}

inline std::string spec_stats_line(const SpeculativeStats& st) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%lld rounds, %lld drafted, %lld accepted (%.1f%%, alpha %.2f), %.2f accepted and %.2f tokens per round; "
                "draft %.2fs, verify %.2fs",
                static_cast<long long>(st.rounds), static_cast<long long>(st.drafted), static_cast<long long>(st.accepted),
                100 * st.acceptance_rate(), st.alpha(), st.mean_accepted_length(), st.tokens_per_round(),
                st.draft_seconds, st.verify_seconds);
  std::string s = buf;
  if (st.confidence_rounds > 0) {  // the confidence rule's threshold, its mean where `auto` moved it
    std::snprintf(buf, sizeof buf, "; confidence threshold %.2f", st.mean_confidence_threshold());
    s += buf;
  }
  const auto pos = st.per_position_acceptance();
  if (!pos.empty()) {
    s += "; per position";
    for (double a : pos) {
      std::snprintf(buf, sizeof buf, " %.2f", a);
      s += buf;
    }
  }
  return s;
}

}  // namespace specula::cli
