// The result as JSON: the configuration, the summary (percentiles in milliseconds), per-session
// and per-request rows, and the tokens/s time series. docs/load.md describes every field.
#pragma once
#include <nlohmann/json.hpp>

#include "tools/specula-load/options.h"
#include "tools/specula-load/runner.h"
#include "tools/specula-load/stats.h"

namespace specula::load {

nlohmann::json distribution_json(const Distribution& d);
nlohmann::json result_json(const LoadOptions& o, size_t prompt_count, const RunResult& run, const Summary& s,
                           const TimeSeries& ts);

}  // namespace specula::load
