// The task layer of the text generation server: turns request bodies of the two APIs into
// engine jobs (validating every field: type, range, combination, unknown names) and finished
// jobs into response bodies. No HTTP here: the transport (server.h) calls these functions and
// maps ApiError to a status code with {"error": message}.
//
//  PUT /api (Megatron): {"prompts": [...], "tokens_to_generate": 64, "logprobs": false,
//    "temperature": 1.0, "top_k": 0, "top_p": 0.0, "top_p_decay", "top_p_bound", "add_BOS",
//    "stop_on_eol", "stop_on_double_eol", "prevent_newline_after_colon", "random_seed",
//    "no_log", "beam_width", "stop_token", "length_penalty"}
//    -> {"text", "segments", "tokens", "logprobs"?} or, with beam_width, {"text", "segments",
//    "scores"}.
//  A T5 checkpoint (ctx.encoder_decoder) answers PUT /api T5-style (server_t5.cpp): each prompt
//    is the encoder's input with <extra_id_N> sentinels, the decoder starts from [BOS] and stops
//    at [EOS], and the answer gives per prompt the prompt with its spans filled ("text"), the
//    decoder's text ("output"), the spans by sentinel ("spans"), the decoder's tokens ("tokens",
//    "segments") and their log-probs; GPT-only fields (add_BOS, stop_on_eol, ...) are refused.
//  POST /v1/completions (OpenAI): {"prompt", "max_tokens": 16, "temperature": 1.0 (0 = greedy),
//    "top_p": 1.0, "top_k": 0, "n": 1, "stop", "logprobs": null|0..10, "echo", "seed", "stream",
//    "model", "user", "best_of" (= n), "presence_penalty"/"frequency_penalty" (0 only)}
//    -> OpenAI's text_completion object with usage; with "stream": server-sent events.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "inference/server_queue.h"

namespace megatron::data {
class Tokenizer;
}

namespace megatron::inference {

// A client mistake (4xx) or a server condition (503, 500), with the message for {"error": ...}.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message) : std::runtime_error(message), status(status) {}
  int status;
};

struct ApiContext {
  const data::Tokenizer* tokenizer = nullptr;
  int64_t vocab = 0;                // real vocabulary size
  int64_t max_sequence_length = 0;  // the model's context (prompt + generation)
  int64_t max_tokens_to_generate = 1024;
  int max_prompts = 128;
  int max_beam_width = 16;
  int max_choices = 16;  // OpenAI "n"
  bool encoder_decoder = false;  // a T5 model: PUT /api fills the prompts' sentinel spans
};

// Parses a request body into JSON, refusing nesting deeper than 32 levels.
nlohmann::json parse_json_body(const std::string& body);
// Serializes with invalid UTF-8 replaced, never throwing.
std::string dump_json(const nlohmann::json& j);

// ---- PUT /api -------------------------------------------------------------------------------
struct MegatronApiRequest {
  std::shared_ptr<Job> job;
  bool logprobs = false;
  bool no_log = false;
};
MegatronApiRequest parse_megatron_request(const nlohmann::json& body, const ApiContext& ctx,
                                          uint64_t fallback_seed);
nlohmann::json megatron_response(const MegatronApiRequest& request, const ApiContext& ctx);

// T5 (server_t5.cpp): the encoder inputs of `prompts` (a checked list of strings), each with its
// sentinels, fitting the model with `to_generate` decoder tokens; and the answer of a finished job.
std::vector<std::vector<int32_t>> t5_encoder_inputs(const nlohmann::json& prompts,
                                                    const ApiContext& ctx, int64_t to_generate);
nlohmann::json t5_megatron_response(const MegatronApiRequest& request, const ApiContext& ctx);

// ---- POST /v1/completions -------------------------------------------------------------------
// Server-sent events of one streaming request, filled on the scheduler thread and drained by
// the HTTP thread. cancel() (the client went away) makes the rows stop at their next token.
class StreamChannel {
 public:
  void push(std::string event);
  void close();
  // Waits for the next event; false once closed and drained.
  bool pop(std::string& event);
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::string> events_;
  bool closed_ = false;
  std::atomic<bool> cancelled_{false};
};

struct CompletionRequest {
  std::shared_ptr<Job> job;
  bool stream = false;
  bool echo = false;
  int logprobs = -1;  // -1: none; else top-n per token
  int n = 1;
  std::vector<std::string> stop;
  std::string id;
  std::string model;
  int64_t created = 0;
  std::shared_ptr<StreamChannel> channel;  // set when stream
};
// With "stream": true the job's rows push chunks into request.channel, which is closed with
// "data: [DONE]" when the job finishes.
CompletionRequest parse_completion_request(const nlohmann::json& body, const ApiContext& ctx,
                                           uint64_t fallback_seed, const std::string& id);
nlohmann::json completion_response(const CompletionRequest& request, const ApiContext& ctx);

}  // namespace megatron::inference
