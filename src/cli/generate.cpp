// `megatron generate`: text generation from a checkpoint on the command line. Prompts come from
// --prompt (repeatable), --prompt-file (one per line) or standard input (one per line). Prints
// prompt + generation per prompt (Megatron's "text"), or JSON lines with --output-format jsonl.
// Sampling flags follow Megatron's text generation tools (greedy by default: --top_k 1).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/command.h"
#include "cli/inference_flags.h"
#include "core/error.h"
#include "inference/beam_search.h"
#include "inference/generation.h"

namespace megatron::cli {
namespace {

struct GenerateArgs {
  InferenceFlags model;
  std::vector<std::string> prompts;
  std::string prompt_file;
  int64_t tokens_to_generate = 30;
  float temperature = 1.0f;
  int top_k = 1;
  float top_p = 0.0f;
  float top_p_decay = 0.0f;
  float top_p_bound = 0.0f;
  int64_t random_seed = -1;
  bool add_bos = false;
  bool stop_on_eol = false;
  bool stop_on_double_eol = false;
  bool prevent_newline_after_colon = false;
  bool return_log_probs = false;
  int beam_width = 0;
  float length_penalty = 1.0f;
  int64_t stop_token = -1;
  int micro_batch_size = 8;
  std::string output_format = "text";
};

std::vector<std::string> read_lines(std::istream& in) {
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

void print_result(const GenerateArgs& a, const data::Tokenizer& tok, const std::string& prompt,
                  std::span<const int32_t> tokens, const std::vector<float>* logprobs,
                  const float* score) {
  const std::string text = tok.decode(tokens);
  if (a.output_format == "jsonl") {
    nlohmann::json j = {{"prompt", prompt}, {"text", text}, {"tokens", tokens}};
    if (logprobs) j["logprobs"] = *logprobs;
    if (score) j["score"] = *score;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return;
  }
  std::printf("%s\n", text.c_str());
  if (score) std::printf("score: %.6f\n", double(*score));
  if (logprobs) {
    std::printf("logprobs:");
    for (float lp : *logprobs) std::printf(" %.5f", double(lp));
    std::printf("\n");
  }
  std::printf("\n");
}

void run_generate(GenerateArgs& a) {
  using namespace inference;
  MG_REQUIRE(a.prompts.empty() || a.prompt_file.empty(), "pass --prompt or --prompt-file, not both");
  MG_REQUIRE(a.temperature > 0.0f && a.temperature <= 100.0f, "--temperature must be in (0, 100]");
  MG_REQUIRE(a.top_k >= 0 && a.top_k <= 1000, "--top_k must be in [0, 1000]");
  MG_REQUIRE(a.top_p >= 0.0f && a.top_p <= 1.0f, "--top_p must be in [0, 1]");
  MG_REQUIRE(!(a.top_p > 0.0f && a.top_k > 1), "--top_k and --top_p cannot be combined; set --top_k 0 to use --top_p");
  MG_REQUIRE(a.top_p_decay == 0.0f || a.top_p > 0.0f, "--top-p-decay needs --top_p");
  MG_REQUIRE(a.top_p_bound == 0.0f || (a.top_p > 0.0f && a.top_p_bound <= a.top_p),
             "--top-p-bound needs --top_p and must not exceed it");
  MG_REQUIRE(a.tokens_to_generate >= 0, "--num-tokens-to-generate must be >= 0");
  MG_REQUIRE(a.tokens_to_generate > 0 || a.return_log_probs,
             "--num-tokens-to-generate 0 scores the prompts: add --return-log-probs");
  MG_REQUIRE(a.micro_batch_size >= 1, "--micro-batch-size must be >= 1");
  std::vector<std::string> prompts = a.prompts;
  if (!a.prompt_file.empty()) {
    std::ifstream in(a.prompt_file);
    MG_REQUIRE(in, "cannot read --prompt-file ", a.prompt_file);
    prompts = read_lines(in);
    MG_REQUIRE(!prompts.empty(), "--prompt-file ", a.prompt_file, " has no prompts (one per line)");
  } else if (prompts.empty()) {
    prompts = read_lines(std::cin);
    MG_REQUIRE(!prompts.empty(), "no prompts: pass --prompt, --prompt-file or lines on standard input");
  }
  auto loaded = load_inference_model(a.model.finish());
  const auto& tok = *loaded.tokenizer;
  auto& model = *loaded.model;
  const auto special = SpecialTokens::from_tokenizer(tok);
  MG_REQUIRE(!a.add_bos || special.eod, "--add-BOS needs a tokenizer with an end-of-document token");
  const uint64_t seed = a.random_seed >= 0 ? uint64_t(a.random_seed) : std::random_device{}();

  std::vector<std::vector<int32_t>> tokens;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> ids;
    if (a.add_bos) ids.push_back(*special.eod);
    tok.encode(prompts[i], ids);
    MG_REQUIRE(!ids.empty(), "prompt ", i + 1, " has no tokens; use --add-BOS");
    MG_REQUIRE(int64_t(ids.size()) + a.tokens_to_generate <= model.max_sequence_length(), "prompt ",
               i + 1, " has ", ids.size(), " tokens; with --num-tokens-to-generate ",
               a.tokens_to_generate, " that exceeds the model's maximum sequence length ",
               model.max_sequence_length());
    tokens.push_back(std::move(ids));
  }
  const int64_t vocab = tok.vocab_size();
  if (a.beam_width > 0) {
    MG_REQUIRE(a.tokens_to_generate >= 1, "beam search needs --num-tokens-to-generate >= 1");
    for (size_t i = 0; i < prompts.size(); ++i) {
      BeamSearchRequest req;
      req.prompt = tokens[i];
      req.tokens_to_generate = a.tokens_to_generate;
      req.beam_width = a.beam_width;
      req.length_penalty = a.length_penalty;
      req.stop_token = a.stop_token >= 0 ? int32_t(a.stop_token) : special.eod.value_or(int32_t(vocab - 1));
      MG_REQUIRE(req.stop_token < vocab, "--stop-token ", req.stop_token, " is outside the vocabulary");
      for (const auto& h : beam_search(model, req, vocab))
        print_result(a, tok, prompts[i], h.tokens, nullptr, &h.score);
    }
    return;
  }
  for (size_t begin = 0; begin < tokens.size(); begin += size_t(a.micro_batch_size)) {
    std::vector<SequenceRequest> rows;
    for (size_t i = begin; i < std::min(tokens.size(), begin + size_t(a.micro_batch_size)); ++i) {
      SequenceRequest r;
      r.prompt = tokens[i];
      r.tokens_to_generate = a.tokens_to_generate;
      r.return_logprobs = a.return_log_probs;
      r.sampling = {a.temperature, a.top_k, a.top_p, a.top_p_decay, a.top_p_bound};
      r.seed = seed;
      r.sequence = i;
      r.stop_on_eol = a.stop_on_eol;
      r.stop_on_double_eol = a.stop_on_double_eol;
      r.prevent_newline_after_colon = a.prevent_newline_after_colon;
      rows.push_back(std::move(r));
    }
    const auto results = generate(model, rows, vocab, special);
    for (size_t k = 0; k < results.size(); ++k)
      print_result(a, tok, prompts[begin + k], results[k].tokens,
                   a.return_log_probs ? &results[k].logprobs : nullptr, nullptr);
  }
}

CommandRegistrar reg("generate", "Generate text from a checkpoint (sampling or beam search)", 60,
                     [](CLI::App& sub) {
  auto a = std::make_shared<GenerateArgs>();
  a->model.add(sub);
  sub.add_option("--prompt,--prompts", a->prompts, "Prompt text (repeatable)");
  sub.add_option("--prompt-file", a->prompt_file, "File with one prompt per line");
  sub.add_option("--num-tokens-to-generate,--tokens-to-generate", a->tokens_to_generate,
                 "Tokens to generate per prompt")->capture_default_str();
  sub.add_option("--temperature", a->temperature, "Sampling temperature")->capture_default_str();
  sub.add_option("--top_k,--top-k", a->top_k, "Top-k sampling (1 = greedy, 0 = off)")->capture_default_str();
  sub.add_option("--top_p,--top-p", a->top_p, "Nucleus sampling mass (0 = off)")->capture_default_str();
  sub.add_option("--top-p-decay", a->top_p_decay, "top_p *= decay after each token");
  sub.add_option("--top-p-bound", a->top_p_bound, "Lower bound for the decayed top_p");
  sub.add_option("--random-seed,--seed", a->random_seed, "Sampling seed (-1 = random)");
  sub.add_flag("--add-BOS", a->add_bos, "Prepend the end-of-document token");
  sub.add_flag("--stop-on-eol", a->stop_on_eol, "Stop a sequence at a newline");
  sub.add_flag("--stop-on-double-eol", a->stop_on_double_eol, "Stop a sequence at a blank line");
  sub.add_flag("--prevent-newline-after-colon", a->prevent_newline_after_colon,
               "Never generate a newline right after ':'");
  sub.add_flag("--return-log-probs", a->return_log_probs, "Print the log-prob of every token after the first");
  sub.add_option("--beam-width", a->beam_width, "Beam search with this many beams")->check(CLI::Range(1, 64));
  sub.add_option("--length-penalty", a->length_penalty, "Beam score = sum log p / length^penalty");
  sub.add_option("--stop-token", a->stop_token, "Beam search end token (default: end of document)");
  sub.add_option("--micro-batch-size", a->micro_batch_size, "Prompts decoded together")->capture_default_str();
  sub.add_option("--output-format", a->output_format, "text or jsonl")
      ->check(CLI::IsMember({"text", "jsonl"}))
      ->capture_default_str();
  add_megatron_flags(sub, a->model.megatron, "generate", CommandKind::Inference);
  sub.callback([a] { run_generate(*a); });
});

}  // namespace
}  // namespace megatron::cli
