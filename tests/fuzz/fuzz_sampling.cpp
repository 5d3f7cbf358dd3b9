// libFuzzer target: the sampling settings and the sampler (src/inference/sampling.h), and the
// request parsers that set them (PUT /api and POST /v1/completions, src/inference/server_api.h).
// The first byte chooses: even, the rest is a request body for both parsers (with a NullTokenizer
// of 100 ids: prompts are ids separated by spaces); odd, the rest gives the settings (temperature,
// top_k, top_p, decay, bound as raw floats and an int), a uniform draw and up to 64 logits (raw
// floats: NaN, infinities and denormals included). Checked: a request either parses into
// settings that sampling_params_error accepts or is an ApiError 4xx; settings are refused by
// sampling_params_error or sample_token returns an id in [0, vocab), unless the logits are not
// finite, which is a megatron::Error; nothing else is thrown.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/tokenizer.h"
#include "inference/sampling.h"
#include "inference/server_api.h"

namespace {

using namespace megatron::inference;

template <typename T>
T take(const uint8_t*& p, const uint8_t* end) {
  T v{};
  const size_t n = std::min<size_t>(sizeof v, size_t(end - p));
  std::memcpy(&v, p, n);
  p += n;
  return v;
}

void check_rows(const std::shared_ptr<Job>& job) {
  if (!job) return;
  for (const auto& r : job->rows)
    if (!sampling_params_error(r.sampling, kRequestFieldNames).empty()) std::abort();
}

void requests(const uint8_t* data, size_t size) {
  static const megatron::data::NullTokenizer tokenizer(100);
  ApiContext ctx;
  ctx.tokenizer = &tokenizer;
  ctx.vocab = 100;
  ctx.max_sequence_length = 64;
  ctx.max_tokens_to_generate = 32;
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (int api = 0; api < 2; ++api) {
    try {
      const nlohmann::json j = parse_json_body(body);
      if (api == 0) check_rows(parse_megatron_request(j, ctx, 1).job);
      else check_rows(parse_completion_request(j, ctx, 1, "cmpl").job);
    } catch (const ApiError& e) {
      if (e.status < 400 || e.status >= 500) std::abort();
    }
  }
}

void sampler(const uint8_t* p, const uint8_t* end) {
  SamplingParams s;
  s.temperature = take<float>(p, end);
  s.top_k = int(take<int16_t>(p, end));
  s.top_p = take<float>(p, end);
  s.top_p_decay = take<float>(p, end);
  s.top_p_bound = take<float>(p, end);
  const double u = double(take<uint32_t>(p, end)) / 4294967296.0;
  std::vector<float> logits;
  while (p < end && logits.size() < 64) logits.push_back(take<float>(p, end));
  if (logits.empty()) return;
  const bool finite = std::all_of(logits.begin(), logits.end(), [](float v) {
    return !std::isnan(v) && v != INFINITY;
  });
  const bool all_masked = std::all_of(logits.begin(), logits.end(), [](float v) { return v == -INFINITY; });
  const bool valid = sampling_params_error(s, kRequestFieldNames).empty();
  std::vector<float> probs;
  std::vector<int32_t> order;
  const int64_t vocab = int64_t(logits.size());
  try {
    const int32_t id = sample_token(logits, vocab, s, s.top_p, u, probs, order);
    if (!valid || !finite || all_masked || id < 0 || id >= vocab) std::abort();
    if (logits[size_t(id)] == -INFINITY) std::abort();  // a masked token is never chosen
  } catch (const megatron::Error&) {
    if (valid && finite && !all_masked) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] % 2 == 0) requests(data + 1, size - 1);
  else sampler(data + 1, data + size);
  return 0;
}
