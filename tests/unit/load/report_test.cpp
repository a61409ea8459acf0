// The report files: the JSON's shape and the HTML's charts, built from hand-made records.
#include <gtest/gtest.h>

#include "tools/specula-load/report_html.h"
#include "tools/specula-load/result_json.h"
#include "tools/specula-load/svg.h"

namespace specula::load {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

RunResult two_requests() {
  RunResult run;
  RequestRecord ok;
  ok.index = 0;
  ok.prompt_id = "<c00>";
  ok.start_s = 0.0;
  ok.first_token_s = 0.1;
  ok.event_s = {0.1, 0.2};
  ok.event_tokens = {1, 2};
  ok.end_s = 0.25;
  ok.server.drafted = 4;
  ok.server.accepted = 2;
  ok.server.rounds = 2;
  ok.server.acceptance_rate = 0.5;
  RequestRecord bad;
  bad.index = 1;
  bad.session = 1;
  bad.start_s = 0.0;
  bad.end_s = 0.05;
  bad.error_kind = "server:overloaded";
  bad.error_message = "queue <full> & more";
  run.records = {ok, bad};
  run.started_at = "2026-01-01T00:00:00Z";
  return run;
}

TEST(ResultJson, HasTheSummaryErrorsByKindAndOneRowPerRequest) {
  LoadOptions o;
  o.target = parse_url("ws://127.0.0.1:8080/v1/ws");
  const RunResult run = two_requests();
  const Summary s = summarize(run.records);
  const auto j = result_json(o, 48, run, s, time_series(run.records, 0.25));
  EXPECT_EQ(j["config"]["protocol"], "websocket");
  EXPECT_EQ(j["summary"]["succeeded"], 1);
  EXPECT_EQ(j["summary"]["errors_by_kind"]["server:overloaded"]["count"], 1);
  EXPECT_EQ(j["summary"]["acceptance"]["acceptance_rate"], 0.5);
  EXPECT_EQ(j["summary"]["ttft_ms"]["n"], 1);
  ASSERT_EQ(j["requests"].size(), 2u);
  EXPECT_EQ(j["requests"][1]["error"]["kind"], "server:overloaded");
  EXPECT_TRUE(j["requests"][1]["ttft_ms"].is_null());
  EXPECT_EQ(j["summary"]["itl_ms"]["n"], 2);
}

TEST(HtmlReport, IsOneDocumentWithSvgChartsAndEscapedText) {
  LoadOptions o;
  o.target = parse_url("ws://127.0.0.1:8080/v1/ws");
  o.concurrency = 2;
  const RunResult run = two_requests();
  const Summary s = summarize(run.records);
  const std::string html = html_report(o, 48, run, s, time_series(run.records, 0.25));
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_GE(count(html, "<svg"), 7u);  // throughput, in flight, 2 CDFs, 2 histograms, acceptance, timeline
  EXPECT_EQ(count(html, "<svg"), count(html, "</svg>"));
  EXPECT_EQ(count(html, "<script"), 0u);
  EXPECT_NE(html.find("queue &lt;full&gt; &amp; more"), std::string::npos);
  EXPECT_EQ(html.find("queue <full>"), std::string::npos);
  EXPECT_NE(html.find("&lt;c00&gt;"), std::string::npos);  // the prompt id in a tooltip
}

TEST(Svg, TicksAreRoundNumbersCoveringTheRange) {
  EXPECT_EQ(svg::ticks(0, 10), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(svg::ticks(0, 1, 4), (std::vector<double>{0, 0.5, 1}));
  const auto t = svg::ticks(13, 987);
  EXPECT_EQ(t.front(), 200);
  EXPECT_EQ(t.back(), 800);
}

TEST(Svg, ChartsWithoutDataSaySoInsteadOfDrawingNothing) {
  const std::string empty = svg::cdf_chart({"TTFT", "ms", "fraction"}, {{"TTFT", "#000", {}}});
  EXPECT_NE(empty.find("no data"), std::string::npos);
  EXPECT_NE(svg::histogram({"ITL", "ms", "tokens"}, {"ITL", "#000", {}}, 10).find("no data"), std::string::npos);
}

}  // namespace
}  // namespace specula::load
