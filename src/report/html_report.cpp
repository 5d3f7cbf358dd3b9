// The report page (html_report.h).
#include "report/html_report.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "report/svg_plot.h"

namespace megatron::report {

namespace {

std::string table(const std::vector<std::string>& head,
                  const std::vector<std::vector<std::string>>& rows, size_t first_numeric = 1) {
  std::string s = "<table><tr>";
  for (const auto& h : head) s += "<th>" + html_escape(h) + "</th>";
  s += "</tr>";
  for (const auto& r : rows) {
    s += "<tr>";
    for (size_t i = 0; i < r.size(); ++i)
      s += (i >= first_numeric ? "<td class=\"num\">" : "<td>") + html_escape(r[i]) + "</td>";
    s += "</tr>";
  }
  return s + "</table>";
}

nlohmann::json opt(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json();
}

std::string run_data(const ReportModel& m) {
  nlohmann::json plots = nlohmann::json::object();
  for (const Plot& p : m.plots) {
    nlohmann::json series = nlohmann::json::array();
    for (const Series& s : p.series)
      series.push_back({{"name", s.name},
                        {"color", s.color},
                        {"x", s.x},
                        {"y", s.y},
                        {"dashed", s.dashed},
                        {"markers", s.markers}});
    plots[p.id] = {{"title", p.title}, {"x_label", p.x_label},       {"y_label", p.y_label},
                   {"bars", p.bars},   {"categories", p.categories}, {"series", series}};
  }
  nlohmann::json j = {{"plots", plots},
                      {"summary",
                       {{"iterations", m.iterations},
                        {"train_iters", m.train_iters},
                        {"last_loss", opt(m.last_loss)},
                        {"best_validation_loss", opt(m.best_validation_loss)},
                        {"median_tokens_per_second", opt(m.median_tokens_per_second)},
                        {"median_tflops_per_device", opt(m.median_tflops_per_device)},
                        {"mfu", opt(m.mfu)},
                        {"unigram_loss", opt(m.unigram_loss)},
                        {"status", m.status}}}};
  std::string s = j.dump();
  // Inside <script>: no "</" may appear.
  for (size_t at = s.find("</"); at != std::string::npos; at = s.find("</", at + 2))
    s.replace(at, 2, "<\\/");
  return s;
}

}  // namespace

std::string render_report_html(const ReportModel& m) {
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">";
  h += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">";
  if (m.refresh_seconds > 0)
    h += "<meta http-equiv=\"refresh\" content=\"" + std::to_string(m.refresh_seconds) + "\">";
  h += "<title>Training report: " + html_escape(m.title) + "</title><style>" + report_style() +
       "</style></head><body>\n";
  h += "<h1>Training report: " + html_escape(m.title) + "</h1>";
  h += "<div class=\"meta\">status: <span id=\"status\">" + html_escape(m.status) +
       "</span> &middot; generated " + html_escape(m.generated) + " by megatron report</div>\n";
  h += "<div class=\"cards\">";
  for (const auto& [label, value] : m.cards)
    h += "<div class=\"card\"><div class=\"label\">" + html_escape(label) +
         "</div><div class=\"value\">" + html_escape(value) + "</div></div>";
  h += "</div>\n<div class=\"plots\">";
  for (const Plot& p : m.plots) {
    h += "<figure data-plot=\"" + html_escape(p.id) + "\"><figcaption>" + html_escape(p.title) +
         "</figcaption>";
    if (!p.note.empty()) h += "<div class=\"note\">" + html_escape(p.note) + "</div>";
    h += render_svg(p) + "</figure>\n";
  }
  h += "</div>\n<p class=\"meta\">Hover a plot for values; drag across it to zoom into those "
       "iterations, "
       "double-click to zoom out.</p>";
  h += "<h2>Layout</h2><p>" +
       html_escape(m.layout.empty() ? "one rank (no parallel layout line in the log)" : m.layout) +
       "</p>";
  if (!m.memory.empty())
    h += "<h2>Memory per rank (MiB)</h2>" + table({"rank", "after iteration", "allocated",
                                                   "max allocated", "reserved", "max reserved"},
                                                  m.memory);
  if (!m.phases.empty()) h += "<h2>Time per phase (s)</h2>" + table({"phase", "seconds"}, m.phases);
  h += "<h2>Checkpoints</h2>" +
       (m.checkpoints.empty() ? std::string("<p>none found</p>")
                              : table({"iteration", "folder", "MiB", "saved"}, m.checkpoints, 2));
  h += "<h2>Arguments</h2>" +
       (m.arguments.empty()
            ? std::string("<p>no arguments block in the log, and no checkpoint</p>")
            : "<details><summary>" + std::to_string(m.arguments.size()) + " arguments</summary>" +
                  table({"argument", "value"}, m.arguments, 9) + "</details>");
  h += "<h2>Sources</h2><ul>";
  for (const std::string& s : m.sources) h += "<li><code>" + html_escape(s) + "</code></li>";
  h += "</ul>\n<script type=\"application/json\" id=\"run-data\">" + run_data(m) +
       "</script>\n<script>" + report_script() + "</script>\n</body></html>\n";
  return h;
}

void write_report(const ReportModel& m, const std::filesystem::path& path) {
  write_file_atomically(path, render_report_html(m), {.hint = "check --output and its folder"});
}

}  // namespace megatron::report
