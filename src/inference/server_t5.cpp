// PUT /api for a T5 model (server_api.h): the prompts' sentinels in, the filled spans out, as
// `megatron generate` writes them for a T5 checkpoint (t5_generation.h).
#include <exception>

#include "core/error.h"
#include "data/tokenizer.h"
#include "inference/server_api.h"
#include "inference/t5_generation.h"

namespace megatron::inference {

std::vector<std::vector<int32_t>> t5_encoder_inputs(const nlohmann::json& prompts,
                                                    const ApiContext& ctx, int64_t to_generate) {
  if (1 + to_generate > ctx.max_sequence_length)
    throw ApiError(400, str("tokens_to_generate=", to_generate, " with the decoder's [BOS] exceeds "
                            "the model's maximum sequence length ", ctx.max_sequence_length,
                            "; lower tokens_to_generate"));
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> ids;
    try {
      ids = encode_t5_prompt(*ctx.tokenizer, prompts[i].get_ref<const std::string&>(), int64_t(i));
    } catch (const std::exception& e) {
      throw ApiError(400, str("prompt ", i, " cannot be tokenized: ", e.what()));
    }
    if (ids.empty()) throw ApiError(400, str("prompt ", i, " has no tokens; send text with "
                                             "<extra_id_N> sentinels for the spans to fill"));
    if (int64_t(ids.size()) > ctx.max_sequence_length)
      throw ApiError(400, str("prompt ", i, " has ", ids.size(), " tokens, more than the encoder "
                              "takes (the model's maximum sequence length ",
                              ctx.max_sequence_length, "); shorten the prompt"));
    out.push_back(std::move(ids));
  }
  return out;
}

namespace {

// One answer's fields: the generated tokens (after [BOS]) read against its encoder input.
void add_answer(nlohmann::json& out, const ApiContext& ctx, std::span<const int32_t> encoder_input,
                std::span<const int32_t> decoded) {
  const data::Tokenizer& tok = *ctx.tokenizer;
  const std::span<const int32_t> generated = decoded.empty() ? decoded : decoded.subspan(1);
  const T5Output answer = read_t5_output(tok, encoder_input, generated);
  nlohmann::json spans = nlohmann::json::object(), segments = nlohmann::json::array();
  for (const auto& [n, ids] : answer.spans) spans["<extra_id_" + std::to_string(n) + ">"] = tok.decode(ids);
  for (int32_t id : generated) segments.push_back(tok.token_text(id));
  out["text"].push_back(answer.filled);
  out["output"].push_back(answer.text);
  out["spans"].push_back(std::move(spans));
  out["segments"].push_back(std::move(segments));
  out["tokens"].push_back(std::vector<int32_t>(generated.begin(), generated.end()));
}

}  // namespace

nlohmann::json t5_megatron_response(const MegatronApiRequest& request, const ApiContext& ctx) {
  const Job& job = *request.job;
  nlohmann::json out;
  for (const char* key : {"text", "output", "spans", "segments", "tokens"})
    out[key] = nlohmann::json::array();
  if (job.kind == Job::Kind::BeamSearch) {
    nlohmann::json scores = nlohmann::json::array();
    for (const auto& h : job.hypotheses) {
      add_answer(out, ctx, job.beam.encoder_input, h.tokens);
      scores.push_back(h.score);
    }
    out["scores"] = std::move(scores);
    return out;
  }
  nlohmann::json logprobs = nlohmann::json::array();
  for (size_t i = 0; i < job.results.size(); ++i) {
    add_answer(out, ctx, job.rows[i].encoder_input, job.results[i].tokens);
    if (request.logprobs) logprobs.push_back(job.results[i].logprobs);
  }
  out["logprobs"] = request.logprobs ? std::move(logprobs) : nlohmann::json(nullptr);
  return out;
}

}  // namespace megatron::inference
