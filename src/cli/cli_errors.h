// Messages for command lines CLI11 cannot parse: an unknown command or flag is named, with the
// closest valid name ("did you mean --lr-decay-style?"), instead of CLI11's generic text; the
// caller prints "error: <message>" and exits with status 1.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace megatron::cli {

// The candidate closest to `name` (edit distance after mapping '_' to '-' and ignoring case),
// or "" when none is close enough to be a plausible typo.
std::string closest_name(const std::string& name, const std::vector<std::string>& candidates);

// The message for a parse error of `app` on argv (without the "error: " prefix).
std::string explain_parse_error(const CLI::App& app, int argc, const char* const* argv,
                                const CLI::ParseError& e);

}  // namespace megatron::cli
