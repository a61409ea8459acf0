// What one request measured, as the sessions fill it in. Times are seconds since the run began
// (steady clock); -1 where an event did not happen.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace specula::load {

// Counts from the server's "done" stats (WebSocket) or the final usage chunk (SSE); -1 = absent.
struct ServerStats {
  long long prompt_tokens = -1;
  long long completion_tokens = -1;
  long long rounds = -1;
  long long drafted = -1;
  long long accepted = -1;
  double acceptance_rate = -1;
  double mean_accepted_length = -1;
  double mean_confidence_threshold = -1;  // 0: the server drafted without the confidence rule
  long long preemptions = -1;             // times the server preempted it (priority scheduling)
  double ttft_ms = -1;
  double elapsed_ms = -1;
};

struct RequestRecord {
  int index = 0;          // 0-based, in the order requests were issued
  int session = 0;        // which session (connection slot) ran it
  std::string prompt_id;
  std::optional<int> priority;  // its prompt's "priority", when the line had one
  double scheduled_s = -1;    // Poisson arrival time (open loop only)
  double start_s = -1;        // request written to the socket
  double first_token_s = -1;  // first event carrying text
  double end_s = -1;          // done, error, or failure
  std::vector<double> event_s;    // arrival of each token event
  std::vector<int> event_tokens;  // tokens in each event (>= 1)
  long long draft_tokens = 0;     // tokens flagged "draft": true (WebSocket only)
  ServerStats server;
  std::string finish_reason;
  std::string error_kind;     // "" = success; connect, protocol, disconnected, timeout, server:<code>, http:<status>, interrupted
  std::string error_message;

  bool ok() const { return error_kind.empty(); }
  long long streamed_tokens() const;
  // The server's completion count when it sent one, else the tokens streamed.
  long long output_tokens() const;
};

}  // namespace specula::load
