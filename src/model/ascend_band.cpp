// The Ascend band of keys as a sliding window (ascend_band.h).
#include "model/ascend_band.h"

#include <algorithm>

#include "core/error.h"

namespace megatron::model {

void apply_ascend_band(TransformerConfig& c, int64_t pre, int64_t next) {
  MG_REQUIRE(pre >= 0 && next >= 0, "--pre-tockens and --next-tockens must be >= 0 (got ", pre,
             " and ", next, ")");
  const int64_t longest = std::max<int64_t>(c.seq_length, c.max_position_embeddings);
  MG_REQUIRE(longest > 0, "--pre-tockens / --next-tockens need --seq-length (or "
             "--max-position-embeddings) to know how long a sequence can be");
  c.window_left = pre >= longest - 1 ? -1 : pre;
  if (c.causal())
    c.window_right = c.window_left >= 0 ? 0 : -1;  // keys after the query are masked anyway
  else
    c.window_right = next >= longest - 1 ? -1 : next;
}

}  // namespace megatron::model
