// The training report as one self-contained HTML file: no network access, no external file, no
// Python. Summary cards, the plots as inline SVG (svg_plot.h) made interactive by an embedded
// script (report_assets.cpp), the layout, per-rank memory, time per phase, checkpoints and
// arguments as tables, and the plots' data as a JSON block (id "run-data") that scripts and tests
// can read. A running job's report is refreshed by running the command again (and, with
// --refresh N, the page reloads itself every N seconds).
#pragma once

#include <filesystem>
#include <string>

#include "report/report_model.h"

namespace megatron::report {

std::string render_report_html(const ReportModel& model);
// Written to a temporary file beside `path` and renamed, so a browser never reads half a page.
void write_report(const ReportModel& model, const std::filesystem::path& path);

const char* report_style();
const char* report_script();

}  // namespace megatron::report
