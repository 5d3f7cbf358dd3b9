// Typed access to the fields of a JSON request body, for the server's task layer. Every failure
// is an ApiError(400) naming the field, what it must be and what was sent; unknown field names
// are rejected with the list of accepted ones.
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace megatron::inference {

class Fields {
 public:
  Fields(const nlohmann::json& body, std::initializer_list<const char*> known);
  // Present and not null.
  bool has(const char* key) const;
  const nlohmann::json& at(const char* key) const { return body_.at(key); }
  int64_t integer(const char* key, int64_t fallback, int64_t lo, int64_t hi) const;
  double number(const char* key, double fallback, double lo, double hi) const;
  bool boolean(const char* key, bool fallback) const;
  // Throws ApiError(400) "<key> <message>, got <value>".
  [[noreturn]] void fail(const char* key, const std::string& message) const;

 private:
  const nlohmann::json& body_;
};

// A short printable rendering of a value for error messages.
std::string describe(const nlohmann::json& value);

}  // namespace megatron::inference
