// Helpers shared by the CPU attention files: a row-major sgemm on raw pointers (cpu_matmul.h:
// oneDNN's, single-threaded inside the callers' OpenMP tasks), the check of AttentionShape's mask
// fields, and the per-local-head ALiBi slopes.
#pragma once

#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_matmul.h"

namespace megatron::ops::cpu {

// True when the shape asks for anything beyond causal attention.
inline bool has_extra_mask(const AttentionShape& sh) {
  return !sh.causal || sh.window_left != -1 || sh.window_right != -1 || sh.alibi;
}

// The mask fields are consistent: windows -1 (no limit) or >= 0, window_right only without
// causal (0 is what causal means and is accepted).
inline void check_mask_fields(const char* op, const AttentionShape& sh) {
  MG_CHECK(sh.window_left >= -1, op, ": window_left ", sh.window_left, " must be -1 or >= 0");
  MG_CHECK(sh.window_right >= -1, op, ": window_right ", sh.window_right, " must be -1 or >= 0");
  MG_CHECK(!sh.causal || sh.window_right <= 0, op, ": window_right ", sh.window_right,
           " needs bidirectional attention (causal = false)");
}

// The context-parallel ops implement the causal mask only.
inline void require_causal_only(const char* op, const AttentionShape& sh) {
  MG_REQUIRE(!has_extra_mask(sh), op, ": context parallelism supports causal attention only "
             "(bidirectional, sliding-window and ALiBi masks are not implemented for it); run "
             "this model with --context-parallel-size 1");
}

// ALiBi slopes of the shape's local heads (global heads head_offset..), or empty without ALiBi.
inline std::vector<float> local_alibi_slopes(const AttentionShape& sh) {
  if (!sh.alibi) return {};
  const int total = sh.total_heads > 0 ? sh.total_heads : sh.heads;
  const std::vector<float> all = alibi_slopes(total);
  return std::vector<float>(all.begin() + sh.head_offset, all.begin() + sh.head_offset + sh.heads);
}

}  // namespace megatron::ops::cpu
