// Static SVG plots (svg_plot.h).
#include "report/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace megatron::report {

namespace {

constexpr double kW = 640, kH = 280, kL = 70, kR = 16, kT = 16, kB = 40;

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// A tick label: up to 4 significant digits, scientific for very large or small magnitudes.
std::string tick_label(double v) {
  char buf[32];
  if (v == 0) return "0";
  if (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3)
    std::snprintf(buf, sizeof buf, "%.2e", v);
  else
    std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// "Nice" ticks (steps of 1, 2 or 5 x 10^k) covering [lo, hi], about n of them.
std::vector<double> nice_ticks(double lo, double hi, int n) {
  std::vector<double> t;
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag, step = (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  double map(double v, double a, double b) const {  // value -> pixel between a (lo) and b (hi)
    const double l = log ? std::log10(lo) : lo, h = log ? std::log10(hi) : hi;
    const double x = log ? std::log10(std::max(v, lo)) : v;
    return a + (h > l ? (x - l) / (h - l) : 0.5) * (b - a);
  }
};

std::string legend(const Plot& p) {
  std::string s = "<g class=\"legend\">";
  double x = kL + 8;
  for (const Series& se : p.series) {
    s += "<rect x=\"" + num(x) + "\" y=\"" + num(kT + 4) + "\" width=\"12\" height=\"4\" fill=\"" +
         se.color + "\"/>";
    s += "<text x=\"" + num(x + 16) + "\" y=\"" + num(kT + 10) + "\">" + html_escape(se.name) +
         "</text>";
    x += 24 + 6.2 * double(se.name.size());
  }
  return s + "</g>";
}

std::string frame(const Plot& p) {
  return "<rect class=\"frame\" x=\"" + num(kL) + "\" y=\"" + num(kT) + "\" width=\"" +
         num(kW - kL - kR) + "\" height=\"" + num(kH - kT - kB) + "\"/>" +
         "<text class=\"xlabel\" x=\"" + num((kL + kW - kR) / 2) + "\" y=\"" + num(kH - 6) + "\">" +
         html_escape(p.x_label) + "</text>" + "<text class=\"ylabel\" transform=\"translate(14," +
         num((kT + kH - kB) / 2) + ") rotate(-90)\">" + html_escape(p.y_label) + "</text>";
}

std::string y_ticks(const Axis& y) {
  std::string s;
  std::vector<double> ticks;
  if (y.log) {
    for (double e = std::floor(std::log10(y.lo)); e <= std::ceil(std::log10(y.hi)); ++e)
      if (std::pow(10.0, e) >= y.lo * (1 - 1e-9) && std::pow(10.0, e) <= y.hi * (1 + 1e-9))
        ticks.push_back(std::pow(10.0, e));
  } else {
    ticks = nice_ticks(y.lo, y.hi, 5);
  }
  for (double t : ticks) {
    const double py = y.map(t, kH - kB, kT);
    s += "<line class=\"grid\" x1=\"" + num(kL) + "\" x2=\"" + num(kW - kR) + "\" y1=\"" + num(py) +
         "\" y2=\"" + num(py) + "\"/><text class=\"ytick\" x=\"" + num(kL - 6) + "\" y=\"" +
         num(py + 4) + "\">" + tick_label(t) + "</text>";
  }
  return s;
}

std::string line_svg(const Plot& p) {
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const Series& s : p.series)
    for (size_t i = 0; i < s.x.size(); ++i) {
      x0 = std::min(x0, s.x[i]);
      x1 = std::max(x1, s.x[i]);
      if (std::isfinite(s.y[i])) {
        y0 = std::min(y0, s.y[i]);
        y1 = std::max(y1, s.y[i]);
      }
    }
  std::string s = frame(p);
  if (!std::isfinite(x0) || !std::isfinite(y0))
    return s + "<text class=\"empty\" x=\"320\" y=\"140\">no data yet</text>";
  if (x1 == x0) {
    x0 -= 1;
    x1 += 1;
  }
  Axis x{x0, x1}, y{y0, y1};
  y.log = y0 > 0 && y1 / y0 > 100;
  if (!y.log) {
    const double pad = y1 > y0 ? 0.05 * (y1 - y0) : std::max(1e-12, std::fabs(y0) * 0.05 + 1e-12);
    y.lo = y0 - pad;
    y.hi = y1 + pad;
  }
  s += y_ticks(y);
  for (double t : nice_ticks(x0, x1, 6)) {
    const double px = x.map(t, kL, kW - kR);
    s += "<text class=\"xtick\" x=\"" + num(px) + "\" y=\"" + num(kH - kB + 16) + "\">" +
         tick_label(t) + "</text>";
  }
  s += "<g class=\"data\">";
  for (const Series& se : p.series) {
    std::string d;
    for (size_t i = 0; i < se.x.size(); ++i)
      if (std::isfinite(se.y[i]))
        d += (d.empty() ? "M" : "L") + num(x.map(se.x[i], kL, kW - kR)) + "," +
             num(y.map(se.y[i], kH - kB, kT));
    if (!se.markers)
      s += "<path d=\"" + d + "\" stroke=\"" + se.color + "\"" +
           (se.dashed ? " stroke-dasharray=\"6 4\"" : "") + "/>";
    if (se.markers || se.x.size() == 1)
      for (size_t i = 0; i < se.x.size(); ++i)
        if (std::isfinite(se.y[i]))
          s += "<circle cx=\"" + num(x.map(se.x[i], kL, kW - kR)) + "\" cy=\"" +
               num(y.map(se.y[i], kH - kB, kT)) + "\" r=\"3\" fill=\"" + se.color + "\"/>";
  }
  return s + "</g>" + legend(p);
}

std::string bar_svg(const Plot& p) {
  double top = 0;
  for (const Series& se : p.series)
    for (double v : se.y) top = std::max(top, v);
  std::string s = frame(p);
  if (p.categories.empty()) return s;
  Axis y{0, top > 0 ? top * 1.1 : 1};
  s += y_ticks(y);
  const double slot = (kW - kL - kR) / double(p.categories.size());
  const double bar = slot * 0.8 / double(std::max<size_t>(1, p.series.size()));
  s += "<g class=\"data\">";
  for (size_t c = 0; c < p.categories.size(); ++c) {
    s += "<text class=\"xtick\" x=\"" + num(kL + slot * (double(c) + 0.5)) + "\" y=\"" +
         num(kH - kB + 16) + "\">" + html_escape(p.categories[c]) + "</text>";
    for (size_t k = 0; k < p.series.size(); ++k) {
      const double v = c < p.series[k].y.size() ? p.series[k].y[c] : 0, py = y.map(v, kH - kB, kT);
      s += "<rect x=\"" + num(kL + slot * double(c) + slot * 0.1 + bar * double(k)) + "\" y=\"" +
           num(py) + "\" width=\"" + num(bar) + "\" height=\"" + num(kH - kB - py) + "\" fill=\"" +
           p.series[k].color + "\"><title>" + html_escape(p.series[k].name) + ": " + tick_label(v) +
           "</title></rect>";
    }
  }
  return s + "</g>" + legend(p);
}

}  // namespace

std::string html_escape(const std::string& in) {
  std::string s;
  for (char c : in) {
    if (c == '<')
      s += "&lt;";
    else if (c == '>')
      s += "&gt;";
    else if (c == '&')
      s += "&amp;";
    else if (c == '"')
      s += "&quot;";
    else
      s += c;
  }
  return s;
}

std::string render_svg(const Plot& p) {
  return "<svg class=\"chart\" viewBox=\"0 0 640 280\" role=\"img\" aria-label=\"" +
         html_escape(p.title) + "\">" + (p.bars ? bar_svg(p) : line_svg(p)) + "</svg>";
}

}  // namespace megatron::report
