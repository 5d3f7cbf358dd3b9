// Errors: two tiers, as in the rest of the project.
//  - megatron::Error: a user mistake (bad flag, missing or malformed file, inconsistent sizes).
//    The message says what, where (file, line, flag) and how to fix it. The CLI prints it and
//    exits non-zero. Thrown by MG_REQUIRE / MG_THROW.
//  - megatron::InternalError: a broken invariant (a bug). Thrown by MG_CHECK with the failing
//    expression, function, file and line.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace megatron {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error(what) {}
};

// Concatenate anything streamable into a string: str("bad size ", n, " in ", path).
template <typename... Args>
std::string str(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

[[noreturn]] void throw_internal(const char* expr, const char* func, const char* file, int line,
                                 const std::string& msg);

}  // namespace megatron

#define MG_THROW(...) throw ::megatron::Error(::megatron::str(__VA_ARGS__))

#define MG_REQUIRE(cond, ...)                                  \
  do {                                                         \
    if (!(cond)) throw ::megatron::Error(::megatron::str(__VA_ARGS__)); \
  } while (0)

#define MG_CHECK(cond, ...)                                                              \
  do {                                                                                   \
    if (!(cond))                                                                         \
      ::megatron::throw_internal(#cond, __func__, __FILE__, __LINE__,                    \
                                 ::megatron::str("" __VA_OPT__(, ) __VA_ARGS__));        \
  } while (0)
