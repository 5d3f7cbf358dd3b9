// Megatron's arguments block and report_memory line (run_log_lines.h).
#include "training/run_log_lines.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>

#include "training/checkpoint.h"

namespace megatron::training {

namespace {

template <class T>
std::string shortest_repr(T v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // The shortest round-trip digits, as d.ddde[+-]X, then laid out the way repr does.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  const int exponent = std::atoi(sci.c_str() + e + 1);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out = "0." + std::string(size_t(-exponent - 1), '0') + digits;
    } else if (size_t(exponent) + 1 >= digits.size()) {
      out = digits + std::string(size_t(exponent) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, size_t(exponent) + 1) + "." + digits.substr(size_t(exponent) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += ebuf;
  }
  return negative ? "-" + out : out;
}

}  // namespace

std::string python_float_repr(double v) { return shortest_repr(v); }
std::string python_float_repr(float v) { return shortest_repr(v); }

std::string format_memory_report(int world_rank, int64_t iteration, const HostMemoryStats& t,
                                 const ResidentMemory& r) {
  const double mb = 1024.0 * 1024.0;
  return "[Rank " + std::to_string(world_rank) + "] (after " + std::to_string(iteration) +
         " iterations) memory (MB) | allocated: " + python_float_repr(double(t.allocated) / mb) +
         " | max allocated: " + python_float_repr(double(t.peak) / mb) +
         " | reserved: " + python_float_repr(double(r.current) / mb) +
         " | max reserved: " + python_float_repr(double(r.peak) / mb);
}

namespace {

// Leaf settings of the arguments' JSON (training/checkpoint.h), by name and parent path.
void flatten(const nlohmann::json& j, const std::string& parent,
             std::vector<std::pair<std::string, std::pair<std::string, std::string>>>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.value().is_object()) {
      flatten(it.value(), parent.empty() ? it.key() : parent + "." + it.key(), out);
      continue;
    }
    std::string v;
    if (it.value().is_number_float()) {
      // Settings held as float32 print as the float they are (0.1, not 0.10000000149011612).
      const double d = it.value().get<double>();
      const float f = float(d);
      v = double(f) == d ? python_float_repr(f) : python_float_repr(d);
    } else if (it.value().is_string())
      v = it.value().get<std::string>();
    else if (it.value().is_boolean())
      v = it.value().get<bool>() ? "True" : "False";
    else if (it.value().is_null())
      v = "None";
    else
      v = it.value().dump();
    // TensorBoard's settings by Megatron's names (tensorboard_dir, tensorboard_queue_size, ...).
    const bool tb = parent == "tensorboard" &&
                    (it.key() == "dir" || it.key() == "log_interval" || it.key() == "queue_size");
    out.push_back({tb ? "tensorboard_" + it.key() : it.key(), {parent, v}});
  }
}

}  // namespace

std::vector<std::string> format_arguments_block(const TrainingArgs& args) {
  std::vector<std::pair<std::string, std::pair<std::string, std::string>>> leaves;
  flatten(training_args_to_json(args), "", leaves);
  std::map<std::string, int> uses;
  for (const auto& l : leaves) ++uses[l.first];
  std::vector<std::string> lines;
  for (const auto& [name, where] : leaves) {
    const std::string arg =
        uses[name] > 1 && !where.first.empty() ? where.first + "." + name : name;
    lines.push_back("  " + arg + " " + std::string(arg.size() < 48 ? 48 - arg.size() : 1, '.') +
                    " " + where.second);
  }
  std::sort(lines.begin(), lines.end(), [](const std::string& a, const std::string& b) {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
      return std::tolower(static_cast<unsigned char>(x)) <
             std::tolower(static_cast<unsigned char>(y));
    });
  });
  lines.insert(lines.begin(), "------------------------ arguments ------------------------");
  lines.push_back("-------------------- end of arguments ---------------------");
  return lines;
}

}  // namespace megatron::training
