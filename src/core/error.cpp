#include "core/error.h"

namespace megatron {

void throw_internal(const char* expr, const char* func, const char* file, int line,
                    const std::string& msg) {
  throw InternalError(str("internal error: check `", expr, "` failed in ", func, " at ", file, ":",
                          line, msg.empty() ? "" : ": ", msg));
}

}  // namespace megatron
