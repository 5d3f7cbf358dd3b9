// `megatron generate`: text generation from a checkpoint on the command line. Prompts come from
// --prompt (repeatable), --prompt-file (one per line) or standard input (one per line). Prints
// prompt + generation per prompt (Megatron's "text"), or JSON lines with --output-format jsonl.
// Sampling flags follow Megatron's text generation tools (greedy by default: --top_k 1).
// On a T5 checkpoint (pretrain-t5's) each prompt is an encoder input with <extra_id_N> sentinels
// and the output shows the spans the decoder wrote for them (inference/t5_generation.h); under
// launch with --tensor-model-parallel-size every rank holds its shard and rank 0 prints.
#include <cmath>
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
#include "inference/t5_generation.h"

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

// One result: `j` with the log-probs and score as a JSON line (--output-format jsonl), or `text`
// followed by them.
void print_output(const GenerateArgs& a, nlohmann::json j, const std::string& text,
                  const std::vector<float>* logprobs, const float* score) {
  if (a.output_format == "jsonl") {
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

void print_result(const GenerateArgs& a, const data::Tokenizer& tok, const std::string& prompt,
                  std::span<const int32_t> tokens, const std::vector<float>* logprobs,
                  const float* score) {
  const std::string text = tok.decode(tokens);
  print_output(a, {{"prompt", prompt}, {"text", text}, {"tokens", tokens}}, text, logprobs, score);
}

// The prompts of --prompt, --prompt-file or standard input.
std::vector<std::string> read_prompts(const GenerateArgs& a) {
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
  return prompts;
}

// A T5 checkpoint fills the <extra_id_N> spans of each prompt (inference/t5_generation.h). Text
// output: the prompt with its spans filled in "[...]", then the decoder's own text; jsonl adds the
// spans by sentinel and the decoder's tokens.
void print_t5_result(const GenerateArgs& a, const data::Tokenizer& tok, const std::string& prompt,
                     std::span<const int32_t> encoder_input, std::span<const int32_t> decoded,
                     const std::vector<float>* logprobs, const float* score) {
  const std::span<const int32_t> generated = decoded.subspan(1);  // after [BOS]
  const inference::T5Output out = inference::read_t5_output(tok, encoder_input, generated);
  nlohmann::json spans = nlohmann::json::object();
  for (const auto& [n, ids] : out.spans) spans["<extra_id_" + std::to_string(n) + ">"] = tok.decode(ids);
  print_output(a,
               {{"prompt", prompt}, {"text", out.filled}, {"output", out.text}, {"spans", spans},
                {"tokens", generated}},
               out.filled + "\noutput: " + out.text, logprobs, score);
}

// The decoder of every prompt starts from [BOS] (Megatron's text_dec) and stops at [EOS] (the
// tokenizer's end of document) or the token limit; sampling and beam search as for GPT.
void run_t5_generate(const GenerateArgs& a, const inference::InferenceModelOptions& options,
                     const inference::SamplingParams& sampling) {
  using namespace inference;
  MG_REQUIRE(a.tokens_to_generate >= 1, "--num-tokens-to-generate must be >= 1 for a T5 "
             "checkpoint (its decoder writes the spans)");
  MG_REQUIRE(!a.add_bos && !a.stop_on_eol && !a.stop_on_double_eol && !a.prevent_newline_after_colon,
             "--add-BOS, --stop-on-eol, --stop-on-double-eol and --prevent-newline-after-colon are "
             "GPT's: a T5 decoder always starts from [BOS] and stops at [EOS]");
  T5Inference loaded = load_t5_model(options);
  const auto& tok = *loaded.tokenizer;
  T5Engine& model = *loaded.model;
  // Under launch every tensor-parallel rank runs the same generation: rank 0 reads the prompts
  // and draws the seed, and prints.
  std::vector<std::string> prompts;
  if (loaded.reports) prompts = read_prompts(a);
  uint64_t seed = a.random_seed >= 0 ? uint64_t(a.random_seed) : std::random_device{}();
  if (loaded.group) {
    broadcast_lines(*loaded.group, prompts);
    Tensor s = Tensor::from_vector<int64_t>({int64_t(seed)}, {1});
    loaded.group->broadcast(s, 0);
    seed = uint64_t(s.data<int64_t>()[0]);
  }
  auto print = [&](auto&&... args) {
    if (loaded.reports) print_t5_result(args...);
  };
  std::vector<std::vector<int32_t>> inputs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    inputs.push_back(encode_t5_prompt(tok, prompts[i], int64_t(i + 1)));
    MG_REQUIRE(!inputs.back().empty(), "prompt ", i + 1, " has no tokens");
    MG_REQUIRE(int64_t(inputs.back().size()) <= model.max_sequence_length(), "prompt ", i + 1,
               " has ", inputs.back().size(), " tokens, more than the encoder takes "
               "(--max-position-embeddings ", model.max_sequence_length(), ")");
  }
  const int32_t bos = *tok.bos();
  MG_REQUIRE(1 + a.tokens_to_generate <= model.max_sequence_length(), "--num-tokens-to-generate ",
             a.tokens_to_generate, " with the decoder's [BOS] exceeds the model's maximum "
             "sequence length ", model.max_sequence_length());
  const auto special = SpecialTokens::from_tokenizer(tok);
  const int64_t vocab = tok.vocab_size();
  if (a.beam_width > 0) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      model.set_encoder_inputs({inputs[i]});
      BeamSearchRequest req;
      req.prompt = {bos};
      req.tokens_to_generate = a.tokens_to_generate;
      req.beam_width = a.beam_width;
      req.length_penalty = a.length_penalty;
      req.stop_token = a.stop_token >= 0 ? int32_t(a.stop_token) : *tok.eos();
      MG_REQUIRE(req.stop_token < vocab, "--stop-token ", req.stop_token, " is outside the vocabulary");
      for (const auto& h : beam_search(model, req, vocab))
        print(a, tok, prompts[i], inputs[i], h.tokens, nullptr, &h.score);
    }
    return;
  }
  for (size_t begin = 0; begin < inputs.size(); begin += size_t(a.micro_batch_size)) {
    const size_t end = std::min(inputs.size(), begin + size_t(a.micro_batch_size));
    model.set_encoder_inputs({inputs.begin() + long(begin), inputs.begin() + long(end)});
    std::vector<SequenceRequest> rows;
    for (size_t i = begin; i < end; ++i) {
      SequenceRequest r;
      r.prompt = {bos};
      r.tokens_to_generate = a.tokens_to_generate;
      r.return_logprobs = a.return_log_probs;
      r.sampling = sampling;
      r.seed = seed;
      r.sequence = i;
      rows.push_back(std::move(r));
    }
    const auto results = generate(model, rows, vocab, special);
    for (size_t k = 0; k < results.size(); ++k)
      print(a, tok, prompts[begin + k], inputs[begin + k], results[k].tokens,
            a.return_log_probs ? &results[k].logprobs : nullptr, nullptr);
  }
}

void run_generate(GenerateArgs& a) {
  using namespace inference;
  MG_REQUIRE(a.prompts.empty() || a.prompt_file.empty(), "pass --prompt or --prompt-file, not both");
  MG_REQUIRE(!(a.top_p > 0.0f && a.top_k > 1), "--top_k and --top_p cannot be combined; set --top_k 0 to use --top_p");
  const SamplingParams sampling{a.temperature, a.top_k, a.top_p, a.top_p_decay, a.top_p_bound};
  if (const std::string e = sampling_params_error(sampling, kFlagNames); !e.empty())
    MG_THROW(e);
  MG_REQUIRE(std::isfinite(a.length_penalty), "--length-penalty must be a finite number, got ",
             a.length_penalty);
  MG_REQUIRE(a.tokens_to_generate >= 0, "--num-tokens-to-generate must be >= 0");
  MG_REQUIRE(a.tokens_to_generate > 0 || a.return_log_probs,
             "--num-tokens-to-generate 0 scores the prompts: add --return-log-probs");
  MG_REQUIRE(a.micro_batch_size >= 1, "--micro-batch-size must be >= 1");
  const InferenceModelOptions options = a.model.finish();
  if (options.model.family_id() == model::ModelFamilyId::t5) return run_t5_generate(a, options, sampling);
  // Under launch/mpirun with tensor or pipeline parallelism every rank loads its shard; rank 0
  // reads the prompts, generates and prints, the others run their part of each forward.
  auto loaded = load_inference_model(options);
  if (!loaded.leader()) {
    loaded.follow();
    return;
  }
  MG_REQUIRE(loaded.data_parallel_size == 1, "generate runs one model: launch --tensor-model-"
             "parallel-size x --pipeline-model-parallel-size ranks (", loaded.group->size(),
             "), not ", loaded.group->size() * loaded.data_parallel_size);
  const std::vector<std::string> prompts = read_prompts(a);
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
    loaded.finish();
    return;
  }
  for (size_t begin = 0; begin < tokens.size(); begin += size_t(a.micro_batch_size)) {
    std::vector<SequenceRequest> rows;
    for (size_t i = begin; i < std::min(tokens.size(), begin + size_t(a.micro_batch_size)); ++i) {
      SequenceRequest r;
      r.prompt = tokens[i];
      r.tokens_to_generate = a.tokens_to_generate;
      r.return_logprobs = a.return_log_probs;
      r.sampling = sampling;
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
  loaded.finish();
}

CommandRegistrar reg("generate", "Generate text from a checkpoint (sampling or beam search)", 60,
                     [](CLI::App& sub) {
  auto a = std::make_shared<GenerateArgs>();
  a->model.accept_t5 = true;  // a T5 checkpoint fills the sentinel spans of its prompts
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
