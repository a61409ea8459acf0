#include "tools/specula-load/runner.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <ctime>
#include <exception>
#include <memory>
#include <stdexcept>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "tools/specula-load/connection.h"
#include "tools/specula-load/protocol.h"
#include "tools/specula-load/stats.h"

namespace specula::load {

namespace {

namespace asio = boost::asio;
constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

std::string utc_now() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

class Load {
 public:
  Load(const LoadOptions& o, const std::vector<Prompt>& prompts)
      : o_(o), prompts_(prompts), arrivals_(o.rate > 0 ? o.rate : 1, o.seed), signals_(ioc_, SIGINT, SIGTERM),
        progress_timer_(ioc_), connections_(static_cast<size_t>(o.concurrency)) {}

  RunResult run() {
    preflight();
    RunResult result;
    result.started_at = utc_now();
    clock_.reset();
    // The first signal stops the run and keeps the results; a second one exits at once.
    signals_.async_wait([this](const boost::system::error_code& ec, int) {
      if (ec) return;
      interrupt();
      signals_.async_wait([](const boost::system::error_code& ec2, int) {
        if (!ec2) std::_Exit(130);
      });
    });
    workers_ = o_.concurrency;
    for (int s = 0; s < o_.concurrency; ++s) asio::co_spawn(ioc_, session(s), rethrow);
    if (!o_.quiet && isatty(STDERR_FILENO)) asio::co_spawn(ioc_, progress(), rethrow);
    ioc_.run();
    result.interrupted = interrupted_;
    result.records.assign(std::make_move_iterator(records_.begin()), std::make_move_iterator(records_.end()));
    return result;
  }

 private:
  static void rethrow(std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  }

  // One connection before the load, so a wrong URL is one message and not N failed requests.
  void preflight() {
    std::string error;
    asio::co_spawn(
        ioc_,
        [&]() -> asio::awaitable<void> {
          auto c = make_connection(ioc_.get_executor(), o_.target, clock_);
          try {
            co_await c->open();
            co_await c->close();
          } catch (const std::exception& e) {
            error = e.what();
          }
        },
        rethrow);
    ioc_.run();
    ioc_.restart();
    if (!error.empty()) throw std::runtime_error(error);
  }

  // The next request index for a session, or -1 when the run is over.
  long long claim() {
    if (stopping_) return -1;
    if (o_.requests >= 0 && static_cast<long long>(records_.size()) >= o_.requests) return -1;
    if (o_.duration_s > 0 && clock_.now() >= o_.duration_s) return -1;
    double scheduled = -1;
    if (o_.rate > 0) {
      scheduled = arrivals_.next();
      if (o_.duration_s > 0 && scheduled >= o_.duration_s) return -1;
    }
    RequestRecord& r = records_.emplace_back();
    r.index = static_cast<int>(records_.size() - 1);
    r.scheduled_s = scheduled;
    return r.index;
  }

  // Sleeps until run time t in slices, so an interrupt is noticed within 100 ms.
  asio::awaitable<void> sleep_until(double t) {
    asio::steady_timer timer(ioc_);
    for (double left; !stopping_ && (left = t - clock_.now()) > 0;) {
      timer.expires_after(seconds(std::min(left, 0.1)));
      co_await timer.async_wait(kTuple);
    }
  }

  asio::awaitable<void> session(int s) {
    if (o_.ramp_s > 0) co_await sleep_until(o_.ramp_s * s / o_.concurrency);
    std::shared_ptr<Connection>& conn = connections_[static_cast<size_t>(s)];
    for (long long i; (i = claim()) >= 0;) {
      RequestRecord& r = records_[static_cast<size_t>(i)];
      r.session = s;
      const Prompt& p = prompts_[static_cast<size_t>(i) % prompts_.size()];
      r.prompt_id = p.id;
      r.priority = p.priority;
      if (r.scheduled_s >= 0) co_await sleep_until(r.scheduled_s);
      if (stopping_) {
        r.start_s = r.end_s = clock_.now();
        r.error_kind = "interrupted";
        r.error_message = "the run was interrupted before the request was sent";
        break;
      }
      const nlohmann::json body = o_.target.protocol == Protocol::WebSocket
                                      ? ws_generate_message(p, o_, static_cast<int>(i))
                                      : http_request_body(p, o_, static_cast<int>(i));
      // A kept-open connection the server has closed in the meantime fails before any answer:
      // send the request once more on a new connection, as HTTP clients do.
      const RequestRecord fresh = r;
      for (int attempt = 0; attempt < 2; ++attempt) {
        const bool reused = conn && conn->usable();
        if (!reused && !co_await reconnect(conn, r)) break;
        co_await run_with_deadline(conn, body, r);
        if (!(reused && conn->failed_unanswered())) break;
        r = fresh;
      }
      if (r.error_kind == "connect") co_await sleep_until(clock_.now() + 0.2);  // no busy loop against a dead server
    }
    if (conn && conn->usable()) co_await conn->close();
    conn.reset();
    if (--workers_ == 0) {
      finished_ = true;
      signals_.cancel();
      progress_timer_.cancel();
    }
  }

  // A new connection for `conn`; on failure `r` ends as a "connect" error.
  asio::awaitable<bool> reconnect(std::shared_ptr<Connection>& conn, RequestRecord& r) {
    conn = make_connection(ioc_.get_executor(), o_.target, clock_);
    std::string error;
    try {
      co_await conn->open();
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (error.empty()) co_return true;
    r.start_s = r.end_s = clock_.now();
    r.error_kind = "connect";
    r.error_message = error;
    conn.reset();
    co_return false;
  }

  // The deadline closes the socket; `live` stops a late timer from closing the next request.
  asio::awaitable<void> run_with_deadline(const std::shared_ptr<Connection>& conn, const nlohmann::json& body,
                                          RequestRecord& r) {
    auto live = std::make_shared<bool>(true);
    asio::steady_timer deadline(ioc_, seconds(o_.timeout_s));
    deadline.async_wait([c = conn, live, t = o_.timeout_s](const boost::system::error_code& ec) {
      char why[64];
      std::snprintf(why, sizeof why, "no end of stream within %g s (--timeout)", t);
      if (!ec && *live) c->abort("timeout", why);
    });
    co_await conn->run(body, r);
    *live = false;
    deadline.cancel();
  }

  void interrupt() {
    stopping_ = true;
    interrupted_ = true;
    for (auto& c : connections_)
      if (c) c->abort("interrupted", "the run was interrupted (signal) while the request was in flight");
  }

  // "\r" progress line on stderr, twice a second.
  asio::awaitable<void> progress() {
    size_t width = 0;
    while (!finished_) {
      progress_timer_.expires_after(std::chrono::milliseconds(500));
      co_await progress_timer_.async_wait(kTuple);
      int done = 0, failed = 0, active = 0;
      long long tokens = 0;
      for (const auto& r : records_) {
        for (int n : r.event_tokens) tokens += n;
        if (r.end_s >= 0) ++done, failed += !r.ok();
        else if (r.start_s >= 0) ++active;
      }
      const double t = clock_.now();
      char line[256];
      const std::string total = o_.requests >= 0 ? "/" + std::to_string(o_.requests) : "";
      std::snprintf(line, sizeof line, "[specula-load] %6.1f s  done %d%s  in flight %d  errors %d  %.1f tokens/s",
                    t, done, total.c_str(), active, failed, t > 0 ? static_cast<double>(tokens) / t : 0.0);
      std::string s = line;
      width = std::max(width, s.size());
      s.resize(width, ' ');
      std::fprintf(stderr, "\r%s", s.c_str());
      std::fflush(stderr);
    }
    std::fprintf(stderr, "\r%s\r", std::string(width, ' ').c_str());
    std::fflush(stderr);
  }

  const LoadOptions& o_;
  const std::vector<Prompt>& prompts_;
  asio::io_context ioc_{1};
  RunClock clock_;
  PoissonArrivals arrivals_;
  asio::signal_set signals_;
  asio::steady_timer progress_timer_;
  std::deque<RequestRecord> records_;  // stable references while sessions append
  std::vector<std::shared_ptr<Connection>> connections_;
  int workers_ = 0;
  bool stopping_ = false, interrupted_ = false, finished_ = false;
};

}  // namespace

RunResult run_load(const LoadOptions& options, const std::vector<Prompt>& prompts) {
  return Load(options, prompts).run();
}

}  // namespace specula::load
