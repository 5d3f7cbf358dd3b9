// Overflow-checked shape sizes and allocation failures as input errors; see input_bounds.h.
#include "core/input_bounds.h"

#include <algorithm>

namespace megatron {

bool checked_shape_bytes(const std::vector<int64_t>& shape, size_t elem_size, uint64_t* bytes) {
  // Both the element count and the product of the non-zero sizes (the outermost contiguous
  // stride) must fit: a zero size makes the count 0 but not the strides.
  int64_t numel = 1, span = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(numel, d, &numel) ||
        __builtin_mul_overflow(span, std::max<int64_t>(d, 1), &span))
      return false;
  }
  int64_t b = 0;
  if (__builtin_mul_overflow(numel, int64_t(elem_size), &b)) return false;
  *bytes = uint64_t(b);
  return true;
}

void throw_out_of_memory(const std::string& input, const char* what) {
  throw Error(str(input, ": not enough memory to read it (", what, "): its sizes ask for more "
                  "memory than this machine has; it is corrupted, or too large for this machine"));
}

}  // namespace megatron
