// Megatron's report_memory line on the host (memory_report.h).
#include "training/memory_report.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace megatron::training {

std::string python_float_repr(double v) {
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

std::string format_memory_report(int world_rank, int64_t iteration, const HostMemoryStats& t,
                                 const ResidentMemory& r) {
  const double mb = 1024.0 * 1024.0;
  return "[Rank " + std::to_string(world_rank) + "] (after " + std::to_string(iteration) +
         " iterations) memory (MB) | allocated: " + python_float_repr(double(t.allocated) / mb) +
         " | max allocated: " + python_float_repr(double(t.peak) / mb) +
         " | reserved: " + python_float_repr(double(r.current) / mb) +
         " | max reserved: " + python_float_repr(double(r.peak) / mb);
}

}  // namespace megatron::training
