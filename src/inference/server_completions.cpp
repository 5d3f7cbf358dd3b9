// Task layer for the OpenAI-compatible POST /v1/completions: prompt forms, sampling fields,
// stop strings (cut from the text; the row ends at the first token that completes one),
// echo, log-probs in OpenAI's shape, n choices per prompt, and streaming as server-sent events.
#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "data/tokenizer.h"
#include "data/unicode.h"
#include "inference/server_api.h"
#include "inference/server_fields.h"

namespace megatron::inference {
namespace {

using nlohmann::json;

// The completion text of a row so far and where a stop string cut it.
struct Completion {
  std::string text;
  bool stopped = false;  // a stop string was found (text is cut before it)
};

// Text of the generated tokens (a final EOD excluded), cut at the first stop string.
Completion completion_text(const data::Tokenizer& tok, std::span<const int32_t> generated,
                           const std::vector<std::string>& stop) {
  const auto eod = tok.eod();
  if (!generated.empty() && eod && generated.back() == *eod)
    generated = generated.first(generated.size() - 1);
  Completion c;
  c.text = tok.decode(generated);
  size_t cut = std::string::npos;
  for (const auto& s : stop) cut = std::min(cut, c.text.find(s));
  if (cut != std::string::npos) {
    c.text.resize(cut);
    c.stopped = true;
  }
  return c;
}

// How much of `text` is safe to stream now: not a possible start of a stop string, and not an
// incomplete UTF-8 character (or a replacement character that more bytes may still fix).
size_t streamable(const std::string& text, size_t hold_back) {
  size_t end = text.size() > hold_back ? text.size() - hold_back : 0;
  while (end > 0 && (static_cast<unsigned char>(text[end - 1]) & 0xC0) == 0x80) --end;
  if (end > 0 && static_cast<unsigned char>(text[end - 1]) >= 0xC0) --end;
  static const std::string replacement = "\xEF\xBF\xBD";
  while (end >= 3 && text.compare(end - 3, 3, replacement) == 0) end -= 3;
  return end;
}

// OpenAI's text of one token in "logprobs": the token's bytes when they are whole UTF-8
// characters, else "bytes:" and the bytes as \xNN escapes (what OpenAI returns for a token that
// holds part of a character). *size: the token's length in the text, for "text_offset".
std::string api_token_text(const data::Tokenizer& tok, int32_t id, size_t* size) {
  const auto raw = tok.token_raw_bytes(id);
  if (!raw) {
    std::string text = tok.token_text(id);
    *size = text.size();
    return text;
  }
  *size = raw->size();
  if (data::unicode::repair_utf8(*raw) == *raw) return *raw;
  static const char* digits = "0123456789abcdef";
  std::string out = "bytes:";
  for (unsigned char c : *raw) out += {'\\', 'x', digits[c >> 4], digits[c & 15]};
  return out;
}

// The fewest leading tokens whose text begins with `text`. (Their decoded prefix does so from
// some count on: a prefix that ends inside a character decodes to U+FFFD there and does not
// match yet, so a binary search over the count finds it.)
size_t tokens_covering(const data::Tokenizer& tok, std::span<const int32_t> ids, const std::string& text) {
  size_t lo = 0, hi = ids.size();
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (tok.decode(ids.first(mid)).starts_with(text)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

json chunk(const CompletionRequest& req, size_t index, const std::string& text,
           const json& finish_reason) {
  json c = {{"id", req.id},
            {"object", "text_completion"},
            {"created", req.created},
            {"model", req.model},
            {"choices", json::array({{{"text", text},
                                      {"index", index},
                                      {"logprobs", nullptr},
                                      {"finish_reason", finish_reason}}})}};
  return c;
}

std::string sse(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

struct StreamRow {
  size_t sent = 0;  // bytes of the completion text already streamed
};

std::vector<std::vector<int32_t>> parse_prompts(const Fields& f, const ApiContext& ctx) {
  if (!f.has("prompt"))
    throw ApiError(400, "prompt is required: a string, a list of strings, or token id lists");
  const json& p = f.at("prompt");
  std::vector<std::vector<int32_t>> out;
  auto check_ids = [&](const json& list) {
    std::vector<int32_t> ids;
    for (const auto& t : list) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= ctx.vocab)
        f.fail("prompt", str("token ids must be integers in [0, ", ctx.vocab, ")"));
      ids.push_back(int32_t(t.get<int64_t>()));
    }
    return ids;
  };
  auto encode = [&](const std::string& text) {
    try {
      return ctx.tokenizer->encode(text);
    } catch (const std::exception& e) {
      throw ApiError(400, str("prompt ", out.size(), " cannot be tokenized: ", e.what()));
    }
  };
  if (p.is_string()) {
    out.push_back(encode(p.get<std::string>()));
  } else if (p.is_array() && !p.empty()) {
    if (std::all_of(p.begin(), p.end(), [](const json& x) { return x.is_string(); })) {
      for (const auto& s : p) out.push_back(encode(s.get<std::string>()));
    } else if (std::all_of(p.begin(), p.end(), [](const json& x) { return x.is_number(); })) {
      out.push_back(check_ids(p));
    } else if (std::all_of(p.begin(), p.end(), [](const json& x) { return x.is_array(); })) {
      for (const auto& l : p) out.push_back(check_ids(l));
    } else {
      f.fail("prompt", "must be a string, a list of strings, a list of token ids or a list of "
                       "token id lists (not a mix)");
    }
  } else {
    f.fail("prompt", "must be a non-empty string list or token list, or a string");
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].empty()) {
      // An empty prompt starts from the end-of-document token, as OpenAI's models do.
      const auto eod = ctx.tokenizer->eod();
      if (!eod) throw ApiError(400, str("prompt ", i, " is empty"));
      out[i].push_back(*eod);
    }
  }
  return out;
}

}  // namespace

CompletionRequest parse_completion_request(const json& body, const ApiContext& ctx,
                                           uint64_t fallback_seed, const std::string& id) {
  const Fields f(body, {"prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "stop",
                        "logprobs", "echo", "seed", "stream", "model", "user", "best_of",
                        "presence_penalty", "frequency_penalty", "logit_bias", "suffix"});
  if (ctx.encoder_decoder)
    throw ApiError(400, "this server holds a T5 model, which fills the <extra_id_N> spans of its "
                        "prompts: send them to PUT /api ({\"prompts\": [...], "
                        "\"tokens_to_generate\": N})");
  CompletionRequest req;
  req.id = id;
  req.created = std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  req.model = "megatron";
  if (f.has("model")) {
    if (!f.at("model").is_string()) f.fail("model", "must be a string");
    req.model = f.at("model").get<std::string>();
  }
  if (f.has("user") && !f.at("user").is_string()) f.fail("user", "must be a string");
  for (const char* k : {"presence_penalty", "frequency_penalty"})
    if (f.number(k, 0.0, -2.0, 2.0) != 0.0) f.fail(k, "is not supported (only 0)");
  if (f.has("logit_bias") && !(f.at("logit_bias").is_object() && f.at("logit_bias").empty()))
    f.fail("logit_bias", "is not supported");
  if (f.has("suffix")) f.fail("suffix", "is not supported");

  const auto prompts = parse_prompts(f, ctx);
  const int64_t max_tokens = f.integer("max_tokens", std::min<int64_t>(16, ctx.max_tokens_to_generate), 0,
                                     ctx.max_tokens_to_generate);
  SamplingParams sp;
  const double temperature = f.number("temperature", 1.0, 0.0, kMaxTemperature);
  if (temperature == 0.0) {
    sp.top_k = 1;  // OpenAI: temperature 0 is greedy decoding
  } else {
    if (temperature < kMinTemperature)
      f.fail("temperature", str("must be 0 (greedy decoding) or a number in [", kMinTemperature,
                                ", ", kMaxTemperature, "] (the smallest normal single-precision "
                                "number)"));
    sp.temperature = float(temperature);
    sp.top_k = int(f.integer("top_k", 0, 0, kMaxTopK));
  }
  const double top_p = f.number("top_p", 1.0, 0.0, 1.0);
  if (top_p < 1.0) {
    if (sp.top_k > 1) throw ApiError(400, "cannot set both top_k and top_p; use one of them");
    if (top_p == 0.0) f.fail("top_p", "must be greater than 0");
    sp.top_p = float(top_p);
  }
  if (const std::string e = sampling_params_error(sp, kRequestFieldNames); !e.empty())
    throw ApiError(400, e);
  req.n = int(f.integer("n", 1, 1, ctx.max_choices));
  if (f.has("best_of") && f.integer("best_of", 1, 1, ctx.max_choices) != req.n)
    f.fail("best_of", "is not supported except equal to n");
  if (int64_t(prompts.size()) * req.n > ctx.max_prompts)
    throw ApiError(400, str("too many completions: ", prompts.size(), " prompts x n=", req.n,
                            " exceeds ", ctx.max_prompts));
  if (f.has("stop")) {
    const json& s = f.at("stop");
    if (s.is_string()) {
      req.stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 16 &&
               std::all_of(s.begin(), s.end(), [](const json& x) { return x.is_string(); })) {
      for (const auto& x : s) req.stop.push_back(x.get<std::string>());
    } else {
      f.fail("stop", "must be a string or a list of at most 16 strings");
    }
    for (const auto& x : req.stop)
      if (x.empty()) f.fail("stop", "strings must not be empty");
  }
  if (f.has("logprobs")) {
    if (f.at("logprobs").is_boolean()) f.fail("logprobs", "must be an integer in [0, 10]");
    req.logprobs = int(f.integer("logprobs", -1, 0, 10));
  }
  req.echo = f.boolean("echo", false);
  req.stream = f.boolean("stream", false);
  if (req.stream && req.logprobs >= 0)
    throw ApiError(400, "logprobs is not supported with stream=true; drop one of them");
  const int64_t seed = f.integer("seed", -1, -1, INT64_MAX);

  for (size_t i = 0; i < prompts.size(); ++i)
    if (int64_t(prompts[i].size()) + max_tokens > ctx.max_sequence_length)
      throw ApiError(400, str("prompt ", i, " has ", prompts[i].size(), " tokens; with max_tokens=",
                              max_tokens, " that exceeds the model's maximum sequence length ",
                              ctx.max_sequence_length, ". Shorten the prompt or lower max_tokens"));

  req.job = std::make_shared<Job>();
  if (req.stream) req.channel = std::make_shared<StreamChannel>();
  const size_t hold_back = [&] {
    size_t m = 0;
    for (const auto& s : req.stop) m = std::max(m, s.size());
    return m > 0 ? m - 1 : 0;
  }();
  auto stream_rows = std::make_shared<std::vector<StreamRow>>(prompts.size() * size_t(req.n));
  const data::Tokenizer* tok = ctx.tokenizer;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int c = 0; c < req.n; ++c) {
      const size_t index = i * size_t(req.n) + size_t(c);
      SequenceRequest r;
      r.prompt = prompts[i];
      r.tokens_to_generate = max_tokens;
      r.return_logprobs = req.logprobs >= 0;
      r.top_logprobs = std::max(req.logprobs, 0);
      r.sampling = sp;
      r.seed = seed >= 0 ? uint64_t(seed) : fallback_seed;
      r.sequence = index;
      if (req.echo && req.stream)
        req.channel->push(sse(chunk(req, index, tok->decode(r.prompt), nullptr)));
      if (!req.stop.empty() || req.stream) {
        const size_t prompt_len = r.prompt.size();
        auto channel = req.channel;
        auto stop = req.stop;
        auto meta = std::make_shared<CompletionRequest>(req);
        meta->job.reset();
        meta->channel.reset();
        r.on_token = [=](std::span<const int32_t> tokens, float) {
          const auto done = completion_text(*tok, tokens.subspan(prompt_len), stop);
          if (channel) {
            auto& row = (*stream_rows)[index];
            const size_t end = done.stopped ? done.text.size() : streamable(done.text, hold_back);
            if (end > row.sent) {
              channel->push(sse(chunk(*meta, index, done.text.substr(row.sent, end - row.sent), nullptr)));
              row.sent = end;
            }
            if (channel->cancelled()) return false;
          }
          return !done.stopped;
        };
      }
      req.job->rows.push_back(std::move(r));
    }
  }
  if (req.stream) {
    auto meta = std::make_shared<CompletionRequest>(req);
    meta->job.reset();
    auto stop = req.stop;
    req.job->on_finished = [meta, stream_rows, stop, tok](Job& job) {
      auto& channel = *meta->channel;
      if (!job.error.empty()) {
        channel.push(sse(json{{"error", job.error}}));
      } else {
        for (size_t index = 0; index < job.results.size(); ++index) {
          const auto& res = job.results[index];
          const auto done = completion_text(
              *tok, std::span(res.tokens).subspan(size_t(res.prompt_length)), stop);
          auto& row = (*stream_rows)[index];
          const std::string rest = row.sent < done.text.size() ? done.text.substr(row.sent) : "";
          const bool stopped = done.stopped || res.finish != FinishReason::Length;
          channel.push(sse(chunk(*meta, index, rest, stopped ? "stop" : "length")));
        }
      }
      channel.push("data: [DONE]\n\n");
      channel.close();
    };
  }
  return req;
}

json completion_response(const CompletionRequest& req, const ApiContext& ctx) {
  const auto& tok = *ctx.tokenizer;
  json choices = json::array();
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (size_t index = 0; index < req.job->results.size(); ++index) {
    const auto& res = req.job->results[index];
    const auto prompt = std::span(res.tokens).first(size_t(res.prompt_length));
    const auto generated = std::span(res.tokens).subspan(size_t(res.prompt_length));
    const auto done = completion_text(tok, generated, req.stop);
    if (index % size_t(req.n) == 0) prompt_tokens += res.prompt_length;
    completion_tokens += int64_t(generated.size());
    const std::string prefix = req.echo ? tok.decode(prompt) : std::string();
    json logprobs = nullptr;
    if (req.logprobs >= 0) {
      // One entry per token: the prompt's when echoed, then every generated token that
      // contributes to the returned text (a final EOD excluded; with a stop string, up to the
      // token that reaches the cut).
      const auto eod = tok.eod();
      size_t generated_count = generated.size();
      if (generated_count > 0 && eod && generated.back() == *eod) --generated_count;
      if (done.stopped) generated_count = tokens_covering(tok, generated.first(generated_count), done.text);
      json tokens = json::array(), token_lps = json::array(), tops = json::array(),
           offsets = json::array();
      size_t offset = 0;
      const size_t first = req.echo ? 0 : size_t(res.prompt_length);
      const size_t end = size_t(res.prompt_length) + generated_count;
      for (size_t j = first; j < end; ++j) {
        size_t bytes = 0;
        tokens.push_back(api_token_text(tok, res.tokens[j], &bytes));
        offsets.push_back(offset);
        offset += bytes;
        if (j == 0) {
          token_lps.push_back(nullptr);
          tops.push_back(nullptr);
          continue;
        }
        token_lps.push_back(res.logprobs.at(j - 1));
        json top = json::object();
        if (req.logprobs > 0) {
          size_t unused = 0;
          for (const auto& [id, lp] : res.top_logprobs.at(j - 1)) top[api_token_text(tok, id, &unused)] = lp;
        }
        tops.push_back(req.logprobs > 0 ? top : json(nullptr));
      }
      logprobs = {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops},
                  {"text_offset", offsets}};
    }
    const bool stopped = done.stopped || res.finish != FinishReason::Length;
    choices.push_back({{"text", prefix + done.text},
                       {"index", index},
                       {"logprobs", logprobs},
                       {"finish_reason", stopped ? "stop" : "length"}});
  }
  return {{"id", req.id},
          {"object", "text_completion"},
          {"created", req.created},
          {"model", req.model},
          {"choices", choices},
          {"usage",
           {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}}}};
}

}  // namespace megatron::inference
