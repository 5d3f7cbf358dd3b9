// `megatron evaluate`: zero-shot evaluation as Megatron-LM's tasks/main.py --task LAMBADA |
// WIKITEXT103 (inference/evaluate.h), on any checkpoint generate and serve load (sharded or
// not), with the model and tokenizer flags of generate (or --use-checkpoint-args). Prints
// Megatron's lines: the dataset summary, "> working on iteration: N" every --log-interval
// micro-batches (with samples done and the rate), and the result between dashes. Under an MPI
// job (megatron launch --nproc_per_node N, as Megatron's scripts run it) the ranks are data
// parallel: rank r scores samples r, r + N, ..., the totals are summed, and rank 0 prints.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/inference_flags.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "inference/evaluate.h"

namespace megatron::cli {
namespace {

struct EvaluateArgs {
  InferenceFlags model;
  std::string task;
  std::vector<std::string> valid_data;
  bool strict_lambada = false;
  int64_t overlapping_eval = 32;
  int64_t micro_batch_size = 1;
  int64_t batch_size = 0;  // Megatron's removed flag
  int64_t log_interval = 100;
  int64_t seed = 1234;
  CompatFlags runtime;  // --num-workers and the other runtime flags of Megatron's scripts
};

void print_result(const std::string& line) {
  const std::string dashes(line.size() + 1, '-');
  log_print(dashes);
  log_print(line);
  log_print(dashes);
}

void run_evaluate(EvaluateArgs& a, const CLI::App& sub) {
  using namespace inference;
  MG_REQUIRE(a.task == "LAMBADA" || a.task == "WIKITEXT103", "--task ", a.task,
             " is not implemented: evaluate runs Megatron's zero-shot GPT tasks LAMBADA and "
             "WIKITEXT103");
  MG_REQUIRE(a.batch_size == 0, "--batch-size is no longer valid (Megatron-LM removed it): use "
             "--micro-batch-size");
  MG_REQUIRE(a.valid_data.size() == 1, "--valid-data takes exactly one file for ", a.task, " (got ",
             a.valid_data.size(), ")");
  MG_REQUIRE(a.micro_batch_size >= 1, "--micro-batch-size must be >= 1");
  MG_REQUIRE(a.log_interval >= 1, "--log-interval must be >= 1");
  check_compat_flags(a.runtime, sub, CompatScope::Training);
  const InferenceModelOptions options = a.model.finish();
  const auto world = world_communicator();
  const int ranks = world->size(), rank = world->rank();
  auto print = [rank](const std::string& line) {
    if (rank == 0) log_print(line);
  };
  const int64_t seq_length = options.model.seq_length > 0 ? options.model.seq_length
                                                          : options.model.max_position_embeddings;
  InferenceModel loaded = load_inference_model(options);
  const data::Tokenizer& tok = *loaded.tokenizer;
  LanguageModel& model = *loaded.model;
  const std::string& path = a.valid_data.front();

  std::vector<ZeroShotSample> lambada;
  std::optional<LMWindows> windows;
  if (a.task == "LAMBADA") {
    print("> building lambada dataset from " + path + " ...");
    lambada = build_lambada_samples(path, tok, a.strict_lambada, seq_length);
    print(str(" > found ", lambada.size(), " samples."));
  } else {
    std::optional<Detokenizer> detok = detokenizer_for_path(path);
    if (!detok) {
      if (rank == 0)
        log_info("note: ", path, " names none of ptb, wiki, lambada (Megatron picks its detokenizer "
               "by them); using the WikiText detokenizer");
      detok = Detokenizer::Wiki;
    }
    windows.emplace(build_wikitext_windows(path, tok, seq_length, a.overlapping_eval, detok));
    print(str(" > number of original tokens: ", windows->num_original_tokens(),
              ", number of detokenized tokens: ", windows->num_tokenized_tokens()));
  }
  const int64_t count = windows ? windows->size() : int64_t(lambada.size());
  const int64_t mine = count > rank ? (count - rank + ranks - 1) / ranks : 0;  // this rank's share
  const auto start = std::chrono::steady_clock::now();
  ZeroShotOptions o;
  o.micro_batch_size = a.micro_batch_size;
  o.pad_id = tok.eod_or_throw();
  o.progress = [&](int64_t iteration, int64_t done, int64_t total) {
    if (iteration % a.log_interval != 0) return;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::string rate;
    if (done > 0 && seconds > 0) {
      const double per_second = double(done) / seconds;
      char buf[96];
      std::snprintf(buf, sizeof buf, " | %.2f samples/s | eta %.0f s", per_second,
                    double(total - done) / per_second);
      rate = buf;
    }
    print(str("> working on iteration: ", iteration, " | samples ", done, "/", total, rate));
  };
  ZeroShotTotals t = score_samples(model, mine, [&](int64_t j) {
    const int64_t i = rank + j * ranks;
    return windows ? windows->get(i) : lambada[size_t(i)];
  }, o);
  if (ranks > 1) {
    Tensor sums = Tensor::from_vector<double>(
        {t.loss_sum, double(t.correct), double(t.samples), double(t.scored)}, {4});
    world->all_reduce(sums);
    const double* v = sums.data<double>();
    t = {v[0], int64_t(v[1]), int64_t(v[2]), int64_t(v[3])};
  }
  if (rank != 0) return;
  log_info(str("evaluate: ", t.samples, " samples, ", t.correct, " correct, ", t.scored,
               " scored tokens, loss sum ", python_float_repr(t.loss_sum), " nats"));
  if (a.task == "LAMBADA")
    print_result(lambada_result_line(a.task, t.correct, t.samples));
  else
    print_result(wikitext_result_line(a.task, t.loss_sum, windows->num_tokenized_tokens(),
                                      windows->num_original_tokens()));
  log_print("done :-)");
}

CommandRegistrar reg("evaluate", "Zero-shot LAMBADA accuracy or WikiText-103 perplexity (Megatron's tasks/main.py)",
                     62, [](CLI::App& sub) {
  auto a = std::make_shared<EvaluateArgs>();
  a->model.add(sub);
  sub.add_option("--task", a->task, "LAMBADA (cloze accuracy) or WIKITEXT103 (perplexity)")->required();
  sub.add_option("--valid-data", a->valid_data,
                 "The evaluation file: lambada_test.jsonl ({\"text\": ...} per line) or the raw "
                 "WikiText-103 test file (wiki.test.tokens)")
      ->required();
  sub.add_flag("--strict-lambada", a->strict_lambada,
               "Target the whole last word (tokenized with its leading space), not its last token");
  sub.add_option("--overlapping-eval", a->overlapping_eval,
                 "WikiText windows start every this many tokens; each scores its last this many")
      ->capture_default_str();
  sub.add_option("--micro-batch-size", a->micro_batch_size, "Samples evaluated together")
      ->capture_default_str();
  sub.add_option("--batch-size", a->batch_size, "Removed from Megatron-LM: use --micro-batch-size");
  sub.add_option("--log-interval", a->log_interval, "Progress line every this many micro-batches")
      ->capture_default_str();
  sub.add_option("--seed", a->seed, "Accepted (evaluation is deterministic)")->capture_default_str();
  add_compat_flags(sub, a->runtime, CompatScope::Training);
  add_megatron_flags(sub, a->model.megatron, "evaluate", CommandKind::Inference);
  sub.callback([a, &sub] { run_evaluate(*a, sub); });
});

}  // namespace
}  // namespace megatron::cli
