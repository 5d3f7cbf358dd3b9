// Task layer, shared parts and Megatron's PUT /api: validation rules and response shape follow
// megatron/inference/text_generation_server.py (classic), except that every client mistake is
// a 4xx with {"error": ...} (Megatron answers some with HTTP 200 and a bare string).
#include "inference/server_api.h"

#include <cmath>

#include "core/error.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "inference/server_fields.h"

namespace megatron::inference {

nlohmann::json parse_json_body(const std::string& body) {
  // Bound the nesting before parsing so no input can exhaust the stack.
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > 32) throw ApiError(400, "invalid JSON: nested deeper than 32 levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  if (body.empty()) throw ApiError(400, "the request body is empty; send a JSON object");
  try {
    return nlohmann::json::parse(body);
  } catch (const nlohmann::json::exception& e) {
    throw ApiError(400, std::string("invalid JSON: ") + e.what());
  }
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void StreamChannel::push(std::string event) {
  {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

void StreamChannel::close() {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
  }
  cv_.notify_all();
}

bool StreamChannel::pop(std::string& event) {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return closed_ || !events_.empty(); });
  if (events_.empty()) return false;
  event = std::move(events_.front());
  events_.pop_front();
  return true;
}

namespace {

std::vector<int32_t> tokenize(const ApiContext& ctx, const std::string& text, size_t index) {
  try {
    return ctx.tokenizer->encode(text);
  } catch (const std::exception& e) {
    throw ApiError(400, str("prompt ", index, " cannot be tokenized: ", e.what()));
  }
}

void check_fits(const ApiContext& ctx, size_t index, size_t prompt_tokens, int64_t to_generate,
                const char* field) {
  if (int64_t(prompt_tokens) + to_generate > ctx.max_sequence_length)
    throw ApiError(400, str("prompt ", index, " has ", prompt_tokens, " tokens; with ", field,
                            "=", to_generate, " that exceeds the model's maximum sequence length ",
                            ctx.max_sequence_length, ". Shorten the prompt or lower ", field));
}

std::string decode(const ApiContext& ctx, std::span<const int32_t> ids) {
  return ctx.tokenizer->decode(ids);
}

}  // namespace

MegatronApiRequest parse_megatron_request(const nlohmann::json& body, const ApiContext& ctx,
                                          uint64_t fallback_seed) {
  if (body.is_object()) {
    if (body.contains("max_len"))
      throw ApiError(400, "max_len is no longer used; replace it with tokens_to_generate");
    if (body.contains("sentences"))
      throw ApiError(400, "sentences is no longer used; replace it with prompts");
  }
  const Fields f(body, {"prompts", "tokens_to_generate", "logprobs", "temperature", "top_k",
                        "top_p", "top_p_decay", "top_p_bound", "add_BOS", "stop_on_double_eol",
                        "stop_on_eol", "prevent_newline_after_colon", "random_seed", "no_log",
                        "beam_width", "stop_token", "length_penalty"});
  if (!f.has("prompts")) throw ApiError(400, "prompts argument required (a list of strings)");
  const auto& prompts = f.at("prompts");
  if (!prompts.is_array()) f.fail("prompts", "must be a list of strings");
  if (prompts.empty()) throw ApiError(400, "prompts is empty; send at least one prompt");
  if (int64_t(prompts.size()) > ctx.max_prompts)
    throw ApiError(400, str("Maximum number of prompts is ", ctx.max_prompts, ", got ",
                            prompts.size()));
  for (const auto& p : prompts)
    if (!p.is_string()) f.fail("prompts", "must be a list of strings");

  MegatronApiRequest out;
  // Megatron's default of 64 tokens; a T5 decoder's [BOS] and its tokens fit its position table.
  const int64_t default_tokens = std::min<int64_t>(
      ctx.encoder_decoder ? std::min<int64_t>(64, ctx.max_sequence_length - 1) : 64,
      ctx.max_tokens_to_generate);
  const int64_t to_generate = f.integer("tokens_to_generate", default_tokens, 0,
                                        ctx.max_tokens_to_generate);
  out.logprobs = f.boolean("logprobs", false);
  if (to_generate == 0 && !out.logprobs)
    throw ApiError(400, "tokens_to_generate=0 implies logprobs should be true (scoring mode)");
  SamplingParams sp;
  sp.temperature = float(f.number("temperature", 1.0, kMinTemperature, kMaxTemperature));
  sp.top_k = int(f.integer("top_k", 0, 0, kMaxTopK));
  sp.top_p = float(f.number("top_p", 0.0, 0.0, 1.0));
  if (sp.top_p > 0.0f && sp.top_k > 0)
    throw ApiError(400, "cannot set both top_k and top_p samplings; use one of them");
  sp.top_p_decay = float(f.number("top_p_decay", 0.0, 0.0, 1.0));
  if (sp.top_p_decay > 0.0f && sp.top_p == 0.0f)
    throw ApiError(400, "top_p_decay cannot be set without top_p");
  sp.top_p_bound = float(f.number("top_p_bound", 0.0, 0.0, 1.0));
  if (sp.top_p_bound > 0.0f && sp.top_p == 0.0f)
    throw ApiError(400, "top_p_bound cannot be set without top_p");
  if (sp.top_p_bound > sp.top_p)
    throw ApiError(400, "top_p_bound must be greater than 0 and less than or equal to top_p");
  if (const std::string e = sampling_params_error(sp, kRequestFieldNames); !e.empty())
    throw ApiError(400, e);
  const bool add_bos = f.boolean("add_BOS", false);
  const bool stop_on_double_eol = f.boolean("stop_on_double_eol", false);
  const bool stop_on_eol = f.boolean("stop_on_eol", false);
  const bool no_newline_after_colon = f.boolean("prevent_newline_after_colon", false);
  const int64_t seed = f.integer("random_seed", -1, -1, INT64_MAX);
  out.no_log = f.boolean("no_log", false);

  if (ctx.encoder_decoder) {
    if (add_bos || stop_on_eol || stop_on_double_eol || no_newline_after_colon)
      throw ApiError(400, "add_BOS, stop_on_eol, stop_on_double_eol and prevent_newline_after_colon "
                          "are for GPT models; this server holds a T5 model, whose decoder always "
                          "starts from [BOS] and stops at [EOS]");
    if (to_generate < 1)
      throw ApiError(400, "tokens_to_generate must be >= 1 for a T5 model (its decoder writes "
                          "the spans; there is no prompt to score)");
  }
  const auto bos = ctx.tokenizer->eod();
  if (add_bos && !bos)
    throw ApiError(400, "add_BOS needs a tokenizer with an end-of-document token; " +
                            ctx.tokenizer->type() + " has none");
  std::vector<std::vector<int32_t>> tokens, encoder_inputs;
  if (ctx.encoder_decoder) {  // each prompt is an encoder input; every decoder starts from [BOS]
    encoder_inputs = t5_encoder_inputs(prompts, ctx, to_generate);
    tokens.assign(encoder_inputs.size(), {*ctx.tokenizer->bos()});
  }
  for (size_t i = 0; i < prompts.size() && !ctx.encoder_decoder; ++i) {
    const auto& text = prompts[i].get_ref<const std::string&>();
    if (text.empty() && !add_bos)
      throw ApiError(400, str("prompt ", i, " is empty; empty prompts require add_BOS=true"));
    std::vector<int32_t> ids;
    if (add_bos) ids.push_back(*bos);
    const auto encoded = tokenize(ctx, text, i);
    ids.insert(ids.end(), encoded.begin(), encoded.end());
    if (ids.empty())
      throw ApiError(400, str("prompt ", i, " has no tokens after tokenization; set add_BOS=true"));
    check_fits(ctx, i, ids.size(), to_generate, "tokens_to_generate");
    tokens.push_back(std::move(ids));
  }

  out.job = std::make_shared<Job>();
  if (f.has("beam_width")) {
    const int beam = int(f.integer("beam_width", 1, 1, ctx.max_beam_width));
    if (prompts.size() != 1)
      throw ApiError(400, "when doing beam search, send exactly one prompt");
    if (to_generate < 1) throw ApiError(400, "beam search needs tokens_to_generate >= 1");
    out.job->kind = Job::Kind::BeamSearch;
    out.job->beam.prompt = tokens[0];
    if (ctx.encoder_decoder) out.job->beam.encoder_input = encoder_inputs[0];
    out.job->beam.tokens_to_generate = to_generate;
    out.job->beam.beam_width = beam;
    out.job->beam.stop_token =
        int32_t(f.integer("stop_token", ctx.encoder_decoder ? *ctx.tokenizer->eos()
                                                            : bos.value_or(int32_t(ctx.vocab - 1)),
                          0, ctx.vocab - 1));
    out.job->beam.length_penalty = float(f.number("length_penalty", 1.0, -100.0, 100.0));
    return out;
  }
  if (f.has("stop_token") || f.has("length_penalty"))
    throw ApiError(400, "stop_token and length_penalty apply to beam search; set beam_width");
  for (size_t i = 0; i < tokens.size(); ++i) {
    SequenceRequest r;
    r.prompt = std::move(tokens[i]);
    if (ctx.encoder_decoder) r.encoder_input = std::move(encoder_inputs[i]);
    r.tokens_to_generate = to_generate;
    r.return_logprobs = out.logprobs;
    r.sampling = sp;
    r.seed = seed >= 0 ? uint64_t(seed) : fallback_seed;
    r.sequence = i;
    r.stop_on_eol = stop_on_eol;
    r.stop_on_double_eol = stop_on_double_eol;
    r.prevent_newline_after_colon = no_newline_after_colon;
    out.job->rows.push_back(std::move(r));
  }
  return out;
}

nlohmann::json megatron_response(const MegatronApiRequest& request, const ApiContext& ctx) {
  if (ctx.encoder_decoder) return t5_megatron_response(request, ctx);
  const Job& job = *request.job;
  nlohmann::json text = nlohmann::json::array(), segments = nlohmann::json::array();
  auto add = [&](std::span<const int32_t> ids) {
    text.push_back(decode(ctx, ids));
    nlohmann::json seg = nlohmann::json::array();
    for (int32_t id : ids) seg.push_back(ctx.tokenizer->token_text(id));
    segments.push_back(std::move(seg));
  };
  nlohmann::json out;
  if (job.kind == Job::Kind::BeamSearch) {
    nlohmann::json scores = nlohmann::json::array();
    for (const auto& h : job.hypotheses) {
      add(h.tokens);
      scores.push_back(h.score);
    }
    out["text"] = std::move(text);
    out["segments"] = std::move(segments);
    out["scores"] = std::move(scores);
    return out;
  }
  nlohmann::json tokens = nlohmann::json::array(), logprobs = nlohmann::json::array();
  for (const auto& r : job.results) {
    add(r.tokens);
    tokens.push_back(r.tokens);
    if (request.logprobs) logprobs.push_back(r.logprobs);
  }
  out["text"] = std::move(text);
  out["segments"] = std::move(segments);
  out["tokens"] = std::move(tokens);
  // Megatron's answer always has "logprobs": the lists when asked for, else null.
  out["logprobs"] = request.logprobs ? std::move(logprobs) : nlohmann::json(nullptr);
  return out;
}

}  // namespace megatron::inference
