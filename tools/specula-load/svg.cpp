#include "tools/specula-load/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace specula::load::svg {

namespace {

constexpr int kLeft = 64, kRight = 16, kTop = 42, kBottom = 44;

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

std::string label(double v) {
  char b[32];
  const double a = std::fabs(v);
  if (a >= 1e6) std::snprintf(b, sizeof b, "%.3gM", v / 1e6);
  else if (a >= 1e4) std::snprintf(b, sizeof b, "%.3gk", v / 1e3);
  else std::snprintf(b, sizeof b, "%g", std::round(v * 1000) / 1000);
  return b;
}

// Maps data to pixels inside the margins and draws the frame, grid, ticks and labels.
struct Frame {
  const Axes& a;
  double x0, x1, y0, y1;
  double px(double x) const { return kLeft + (x - x0) / (x1 - x0) * (a.width - kLeft - kRight); }
  double py(double y) const { return a.height - kBottom - (y - y0) / (y1 - y0) * (a.height - kTop - kBottom); }

  Frame(const Axes& axes, double xa, double xb, double ya, double yb) : a(axes), x0(xa), x1(xb), y0(ya), y1(yb) {
    if (!(x1 > x0)) x1 = x0 + 1;
    if (!(y1 > y0)) y1 = y0 + 1;
  }

  std::string open() const {
    std::ostringstream s;
    s << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"" << a.width << "\" height=\"" << a.height
      << "\" viewBox=\"0 0 " << a.width << " " << a.height << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
      << "<text x=\"" << a.width / 2 << "\" y=\"16\" text-anchor=\"middle\" font-size=\"13\" font-weight=\"bold\">"
      << escape(a.title) << "</text>\n";
    for (double t : ticks(x0, x1)) {
      s << "<line x1=\"" << num(px(t)) << "\" x2=\"" << num(px(t)) << "\" y1=\"" << kTop << "\" y2=\""
        << a.height - kBottom << "\" stroke=\"#eee\"/>"
        << "<text x=\"" << num(px(t)) << "\" y=\"" << a.height - kBottom + 14 << "\" text-anchor=\"middle\">"
        << label(t) << "</text>\n";
    }
    for (double t : ticks(y0, y1)) {
      s << "<line x1=\"" << kLeft << "\" x2=\"" << a.width - kRight << "\" y1=\"" << num(py(t)) << "\" y2=\""
        << num(py(t)) << "\" stroke=\"#eee\"/>"
        << "<text x=\"" << kLeft - 6 << "\" y=\"" << num(py(t) + 4) << "\" text-anchor=\"end\">" << label(t)
        << "</text>\n";
    }
    s << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << a.width - kLeft - kRight << "\" height=\""
      << a.height - kTop - kBottom << "\" fill=\"none\" stroke=\"#888\"/>\n"
      << "<text x=\"" << (kLeft + a.width - kRight) / 2 << "\" y=\"" << a.height - 8
      << "\" text-anchor=\"middle\">" << escape(a.x_label) << "</text>\n"
      << "<text transform=\"translate(14," << (kTop + a.height - kBottom) / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << escape(a.y_label) << "</text>\n";
    return s.str();
  }

  std::string legend(const std::vector<std::pair<std::string, std::string>>& items) const {
    std::ostringstream s;
    double x = kLeft + 8;
    for (const auto& [name, color] : items) {
      // In the band between the title and the plot, so it never covers data.
      s << "<rect x=\"" << num(x) << "\" y=\"" << kTop - 17 << "\" width=\"10\" height=\"10\" fill=\"" << color
        << "\"/><text x=\"" << num(x + 14) << "\" y=\"" << kTop - 8 << "\">" << escape(name) << "</text>\n";
      x += 24 + 7 * static_cast<double>(name.size());
    }
    return s.str();
  }

  std::string empty_note() const {
    return "<text x=\"" + std::to_string(a.width / 2) + "\" y=\"" + std::to_string(a.height / 2) +
           "\" text-anchor=\"middle\" fill=\"#888\">no data</text>\n";
  }
};

}  // namespace

std::string escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::vector<double> ticks(double lo, double hi, int target) {
  std::vector<double> out;
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return {lo};
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) { step = m * mag; break; }
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push_back(std::fabs(t) < step * 1e-9 ? 0 : t);
  return out;
}

std::string line_chart(const Axes& axes, const std::vector<Series>& series) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = axes.y_from_zero ? 0 : INFINITY, y1 = -INFINITY;
  for (const auto& s : series)
    for (size_t i = 0; i < s.x.size(); ++i) {
      x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
    }
  const bool empty = !std::isfinite(x0);
  if (empty) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  const Frame f(axes, x0, x1, y0, y1 + (y1 - y0) * 0.05);
  std::string out = f.open();
  std::vector<std::pair<std::string, std::string>> items;
  for (const auto& s : series) {
    items.emplace_back(s.name, s.color);
    out += "<polyline fill=\"none\" stroke=\"" + s.color + "\" stroke-width=\"1.5\" points=\"";
    for (size_t i = 0; i < s.x.size(); ++i) out += num(f.px(s.x[i])) + "," + num(f.py(s.y[i])) + " ";
    out += "\"/>\n";
  }
  if (empty) out += f.empty_note();
  if (series.size() > 1 || (!series.empty() && !series[0].name.empty())) out += f.legend(items);
  return out + "</svg>\n";
}

std::string cdf_chart(Axes axes, const std::vector<Sample>& samples) {
  axes.y_from_zero = true;
  std::vector<Series> series;
  for (const auto& s : samples) {
    std::vector<double> v = s.values;
    std::sort(v.begin(), v.end());
    Series line{s.name, s.color, {}, {}};
    // At most ~400 points: a step per sample is more than a 640-pixel chart can show.
    const size_t stride = std::max<size_t>(1, v.size() / 400);
    for (size_t i = 0; i < v.size(); i += stride) {
      line.x.push_back(v[i]);
      line.y.push_back(static_cast<double>(i + 1) / static_cast<double>(v.size()));
    }
    if (!v.empty()) line.x.push_back(v.back()), line.y.push_back(1.0);
    series.push_back(std::move(line));
  }
  return line_chart(axes, series);
}

std::string histogram(const Axes& axes, const Sample& sample, int bins) {
  const auto& v = sample.values;
  if (v.empty()) return line_chart(axes, {});
  const auto [mn, mx] = std::minmax_element(v.begin(), v.end());
  const double lo = *mn, hi = *mx > *mn ? *mx : *mn + 1;
  std::vector<int> counts(static_cast<size_t>(bins), 0);
  for (double x : v) ++counts[std::min<size_t>(bins - 1, static_cast<size_t>((x - lo) / (hi - lo) * bins))];
  const Frame f(axes, lo, hi, 0, *std::max_element(counts.begin(), counts.end()) * 1.05);
  std::string out = f.open();
  const double w = (hi - lo) / bins;
  for (int b = 0; b < bins; ++b) {
    const double a = lo + b * w, c = counts[static_cast<size_t>(b)];
    out += "<rect x=\"" + num(f.px(a)) + "\" y=\"" + num(f.py(c)) + "\" width=\"" +
           num(std::max(0.5, f.px(a + w) - f.px(a) - 1)) + "\" height=\"" + num(f.py(0) - f.py(c)) + "\" fill=\"" +
           sample.color + "\"><title>" + label(a) + " to " + label(a + w) + ": " + std::to_string(static_cast<int>(c)) +
           "</title></rect>\n";
  }
  return out + "</svg>\n";
}

std::string timeline(const Axes& axes, const std::vector<Span>& spans, int rows) {
  double t1 = 0;
  for (const auto& s : spans) t1 = std::max(t1, s.end);
  const Frame f(axes, 0, std::max(t1, 1e-3), 0, std::max(rows, 1));
  std::string out = f.open();
  const double h = std::max(1.0, (f.py(0) - f.py(1)) * 0.7);
  for (const auto& s : spans) {
    const double y = f.py(s.row + 0.85);
    const double first = s.first >= 0 ? s.first : s.end;
    auto bar = [&](double a, double b, const char* color) {
      out += "<rect x=\"" + num(f.px(a)) + "\" y=\"" + num(y) + "\" width=\"" + num(std::max(0.5, f.px(b) - f.px(a))) +
             "\" height=\"" + num(h) + "\" fill=\"" + color + "\"><title>" + escape(s.tip) + "</title></rect>";
    };
    if (!s.ok) {
      bar(s.start, s.end, "#d62728");
    } else {
      bar(s.start, first, "#aec7e8");
      bar(first, s.end, "#1f77b4");
    }
    out += "\n";
  }
  out += f.legend({{"waiting for the first token", "#aec7e8"}, {"streaming", "#1f77b4"}, {"failed", "#d62728"}});
  return out + "</svg>\n";
}

}  // namespace specula::load::svg
