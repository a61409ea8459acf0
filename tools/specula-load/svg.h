// Inline SVG charts for the HTML report: line charts, CDFs, histograms and a request timeline.
// Each returns one <svg> element as text; no scripts, no external resources.
#pragma once
#include <string>
#include <vector>

namespace specula::load::svg {

// &, <, >, " escaped for text and attribute values.
std::string escape(const std::string& s);

struct Series {
  std::string name;
  std::string color;  // CSS color
  std::vector<double> x, y;
};

struct Axes {
  std::string title, x_label, y_label;
  int width = 640, height = 260;
  bool y_from_zero = true;
};

std::string line_chart(const Axes& axes, const std::vector<Series>& series);

// Empirical CDFs: x = value, y = fraction of samples <= x.
struct Sample {
  std::string name, color;
  std::vector<double> values;
};
std::string cdf_chart(Axes axes, const std::vector<Sample>& samples);

// Counts in `bins` equal bins between the smallest and largest value.
std::string histogram(const Axes& axes, const Sample& sample, int bins);

// One row per session; a bar per request from send to end, light up to the first token and
// solid after it; failed requests red. Times in seconds.
struct Span {
  int row = 0;
  double start = 0, first = -1, end = 0;
  bool ok = true;
  std::string tip;  // <title> tooltip
};
std::string timeline(const Axes& axes, const std::vector<Span>& spans, int rows);

// Round tick positions covering [lo, hi], about `target` of them.
std::vector<double> ticks(double lo, double hi, int target = 5);

}  // namespace specula::load::svg
