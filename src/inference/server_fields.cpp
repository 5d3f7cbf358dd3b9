// JSON field validation for the server's request bodies.
#include "inference/server_fields.h"

#include <cmath>

#include "inference/server_api.h"

namespace megatron::inference {

std::string describe(const nlohmann::json& value) {
  std::string s = dump_json(value);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

Fields::Fields(const nlohmann::json& body, std::initializer_list<const char*> known) : body_(body) {
  if (!body.is_object())
    throw ApiError(400, "the request body must be a JSON object, got " + describe(body));
  for (const auto& [key, value] : body.items()) {
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    if (!ok) {
      std::string list;
      for (const char* k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      std::string shown = key.size() > 40 ? key.substr(0, 40) + "..." : key;
      throw ApiError(400, "unknown field \"" + shown + "\"; accepted fields: " + list);
    }
  }
}

bool Fields::has(const char* key) const {
  auto it = body_.find(key);
  return it != body_.end() && !it->is_null();
}

void Fields::fail(const char* key, const std::string& message) const {
  std::string got = body_.contains(key) ? describe(body_.at(key)) : "nothing";
  throw ApiError(400, std::string(key) + " " + message + ", got " + got);
}

int64_t Fields::integer(const char* key, int64_t fallback, int64_t lo, int64_t hi) const {
  if (!has(key)) return fallback;
  const auto& v = body_.at(key);
  const std::string range = "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::max<int64_t>(hi, 0))) fail(key, range);
    const int64_t i = int64_t(u);
    if (i < lo) fail(key, range);
    return i;
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < lo || i > hi) fail(key, range);
    return i;
  }
  fail(key, range);
}

double Fields::number(const char* key, double fallback, double lo, double hi) const {
  if (!has(key)) return fallback;
  const auto& v = body_.at(key);
  auto range = [&] {
    std::ostringstream os;
    os << "must be a number in [" << lo << ", " << hi << "]";
    return os.str();
  };
  if (!v.is_number()) fail(key, range());
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) fail(key, range());
  return d;
}

bool Fields::boolean(const char* key, bool fallback) const {
  if (!has(key)) return fallback;
  const auto& v = body_.at(key);
  if (!v.is_boolean()) fail(key, "must be true or false");
  return v.get<bool>();
}

}  // namespace megatron::inference
