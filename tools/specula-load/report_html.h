// The self-contained HTML report: tables of the summary and inline SVG charts (tokens/s over time,
// latency CDFs, ITL histogram, per-request timeline, acceptance). No scripts, no network.
#pragma once
#include <string>

#include "tools/specula-load/options.h"
#include "tools/specula-load/runner.h"
#include "tools/specula-load/stats.h"

namespace specula::load {

std::string html_report(const LoadOptions& o, size_t prompt_count, const RunResult& run, const Summary& s,
                        const TimeSeries& ts);

}  // namespace specula::load
