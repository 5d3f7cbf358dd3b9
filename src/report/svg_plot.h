// Plots as inline SVG: a line plot (series over iterations, a logarithmic y axis when the values
// span more than two decades, markers for sparse series such as validation loss, dashed lines for
// baselines) and a grouped bar chart (per-rank memory). The geometry (a 640 x 280 view box with
// fixed margins) and the tick rules are the ones the page's script uses to redraw a zoomed plot
// (report_assets.cpp), so both draw the same picture.
#pragma once

#include <string>

#include "report/report_model.h"

namespace megatron::report {

// The <svg> element of `plot` over its whole x range.
std::string render_svg(const Plot& plot);

// Text for HTML element content and attribute values.
std::string html_escape(const std::string& s);

}  // namespace megatron::report
