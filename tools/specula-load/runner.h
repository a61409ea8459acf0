// Drives the load: `concurrency` sessions on one io_context, each a connection that runs one
// request at a time, closed loop (next request when the last ends) or open loop (Poisson arrivals,
// queued FIFO for the next free session). Stops issuing at --requests or --duration; SIGINT/SIGTERM
// stop early and fail the requests in flight as "interrupted".
#pragma once
#include <deque>
#include <string>
#include <vector>

#include "tools/specula-load/options.h"
#include "tools/specula-load/prompts.h"
#include "tools/specula-load/record.h"

namespace specula::load {

struct RunResult {
  std::vector<RequestRecord> records;  // in issue order
  bool interrupted = false;
  std::string started_at;              // UTC, ISO 8601
};

// Throws std::runtime_error when the first connection (made before the load starts) fails, so an
// unreachable server or a wrong path is one clear message rather than N errors.
RunResult run_load(const LoadOptions& options, const std::vector<Prompt>& prompts);

}  // namespace specula::load
