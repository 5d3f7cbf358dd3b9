// The typed reader of a Hugging Face config.json and the float formatting of its writer
// (hf_config.h).
#include "model/hf_config.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace megatron::model {

using json = nlohmann::json;

const json* HfConfigFile::find(const char* key) const {
  return j.contains(key) && !j[key].is_null() ? &j[key] : nullptr;
}

int64_t HfConfigFile::integer(const char* key, std::optional<int64_t> fallback, int64_t max) const {
  const json* v = find(key);
  if (!v) {
    MG_REQUIRE(fallback.has_value(), label, ": missing \"", key, "\"");
    return *fallback;
  }
  // (nlohmann reads a non-negative integer as unsigned, a negative one as signed.)
  const bool in_range = v->is_number_unsigned() && v->get<uint64_t>() >= 1 &&
                        v->get<uint64_t>() <= uint64_t(max);
  MG_REQUIRE(in_range, label, ": \"", key, "\" must be an integer in [1, ", max, "], got ", v->dump());
  return v->get<int64_t>();
}

double HfConfigFile::number(const char* key, double fallback, bool positive) const {
  const json* v = find(key);
  if (!v) return fallback;
  MG_REQUIRE(v->is_number() && std::isfinite(v->get<double>()) && (!positive || v->get<double>() > 0),
             label, ": \"", key, "\" must be a ", positive ? "positive " : "", "finite number, got ",
             v->dump());
  return v->get<double>();
}

double HfConfigFile::fraction(const char* key, double fallback) const {
  const double p = number(key, fallback);
  MG_REQUIRE(p >= 0 && p < 1, label, ": \"", key, "\" must be in [0, 1), got ", find(key)->dump());
  return p;
}

float HfConfigFile::positive_float(const char* key, double fallback) const {
  const double v = number(key, fallback, /*positive=*/true);
  MG_REQUIRE(float(v) > 0 && std::isfinite(float(v)), label, ": \"", key, "\" = ", v,
             " is not representable as a positive single-precision number");
  return float(v);
}

bool HfConfigFile::boolean(const char* key, bool fallback) const {
  const json* v = find(key);
  if (!v) return fallback;
  MG_REQUIRE(v->is_boolean(), label, ": \"", key, "\" must be true or false, got ", v->dump());
  return v->get<bool>();
}

std::string HfConfigFile::string(const char* key, const std::string& fallback) const {
  const json* v = find(key);
  if (!v) return fallback;
  MG_REQUIRE(v->is_string(), label, ": \"", key, "\" must be a string, got ", v->dump());
  return v->get<std::string>();
}

void HfConfigFile::unsupported(const char* key, const std::string& why) const {
  MG_THROW(label, ": \"", key, "\" = ", j.contains(key) ? j[key].dump() : "(absent)", " is not "
           "supported: ", why);
}

double short_float(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", double(v));
  for (int prec = 1; prec <= 9; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, double(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  return std::strtod(buf, nullptr);
}

}  // namespace megatron::model
