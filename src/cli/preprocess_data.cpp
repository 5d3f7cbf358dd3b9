// `megatron preprocess-data`: Megatron's tools/preprocess_data.py flags -> data::preprocess_data
// (JSONL, plain text or Parquet input).
// SIGINT/SIGTERM/SIGHUP (a closed terminal) set a flag the pipeline polls, so an interrupted run
// removes its temporary files and leaves no output pair behind.
#include <algorithm>
#include <csignal>
#include <cstdio>

#include "cli/command.h"
#include "cli/tokenizer_options.h"
#include "core/error.h"
#include "core/log.h"
#include "data/preprocess.h"

namespace megatron::cli {
namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_stop_signal(int) { g_stop.store(true); }

struct Flags {
  data::PreprocessOptions opt;
  data::TokenizerOptions tokenizer;
  std::string input_format = "auto";
  std::string on_error = "fail";
  int partitions = 1;
  bool keep_sequential_samples = false;
  std::string lang = "english";
  std::string dataset_impl = "mmap";  // --dataset-impl (older Megatron-LM)
  int64_t chunk_size = 0;             // --chunk-size (older Megatron-LM)
};

void run(Flags& f) {
  MG_REQUIRE(f.partitions == 1, "--partitions ", f.partitions,
             " is not supported: the input is already processed by --workers threads in one "
             "pass; use --partitions 1");
  MG_REQUIRE(f.on_error == "fail" || f.on_error == "skip",
             "--on-error must be fail or skip, got '", f.on_error, "'");
  MG_REQUIRE(f.lang == "english", "--lang ", f.lang,
             " is not supported: the built-in sentence splitter follows English rules");
  MG_REQUIRE(f.dataset_impl == "mmap", "--dataset-impl ", f.dataset_impl,
             " names Megatron-LM's old non-mmap format, which this build does not write; use "
             "--dataset-impl mmap (the format every current Megatron-LM reads)");
  f.opt.skip_errors = f.on_error == "skip";
  f.opt.input_format = data::input_format_from_name(f.input_format);
  auto tokenizer = data::build_tokenizer(f.tokenizer);
  if (tokenizer->type().rfind("Bert", 0) == 0 && !f.opt.split_sentences)
    log_warn("BERT tokenizer detected, are you sure you don't want to split sentences?");

  g_stop = false;
  f.opt.stop_requested = &g_stop;
  struct sigaction sa {}, old_int {}, old_term {}, old_hup {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGHUP, &sa, &old_hup);
  struct Restore {
    struct sigaction a, b, c;
    ~Restore() {
      sigaction(SIGINT, &a, nullptr);
      sigaction(SIGTERM, &b, nullptr);
      sigaction(SIGHUP, &c, nullptr);
    }
  } restore{old_int, old_term, old_hup};

  data::PreprocessStats s = data::preprocess_data(f.opt, *tokenizer);
  const double mb = double(s.input_bytes) / 1e6;
  const double secs = std::max(s.seconds, 1e-9);
  char rates[160];
  std::snprintf(rates, sizeof rates, "input: %.2f MB, elapsed: %.2f s, %.2f MB/s, %.0f tokens/s",
                mb, s.seconds, mb / secs, double(s.tokens) / secs);
  log_print(str("documents: ", s.documents, " (empty: ", s.empty, ", skipped: ", s.skipped,
                "), tokens: ", s.tokens, ", ", rates));
  for (const auto& p : s.output_prefixes) log_print(str("wrote ", p, ".bin and ", p, ".idx"));
}

CommandRegistrar reg(
    "preprocess-data", "Tokenize JSONL/text into Megatron .bin/.idx datasets", 100,
    [](CLI::App& sub) {
      auto f = std::make_shared<Flags>();
      sub.add_option("--input", f->opt.input,
                     "Input JSONL, .txt or .parquet file, or a quoted glob of files "
                     "('data/*.parquet'), read in sorted order into one dataset")
          ->required();
      sub.add_option("--json-keys", f->opt.json_keys,
                     "Keys to extract from each JSON line (Parquet: string columns); one output "
                     "dataset per key")
          ->default_str("text");
      sub.add_option("--output-prefix", f->opt.output_prefix,
                     "Output prefix: writes PREFIX_KEY_document.bin/.idx")
          ->required();
      sub.add_option("--input-format", f->input_format,
                     "auto (*.parquet = parquet, *.txt = text-lines, else jsonl), jsonl, text-lines "
                     "(one document per line), text-paragraphs (documents separated by blank "
                     "lines) or parquet")
          ->capture_default_str();
      sub.add_flag("--split-sentences", f->opt.split_sentences,
                   "Split documents into sentences (rule-based splitter)");
      sub.add_flag("--keep-newlines", f->opt.keep_newlines,
                   "With --split-sentences, keep newlines between sentences");
      sub.add_flag("--append-eod", f->opt.append_eod, "Append an EOD token to every document");
      sub.add_option("--lang", f->lang, "Sentence splitter language")->capture_default_str();
      sub.add_option("--workers", f->opt.workers, "Tokenizing threads")->required();
      sub.add_option("--partitions", f->partitions, "Only 1 is supported")->capture_default_str();
      sub.add_flag("--keep-sequential-samples", f->keep_sequential_samples,
                   "Accepted for compatibility (the output always keeps input order)");
      sub.add_option("--dataset-impl", f->dataset_impl,
                     "mmap: Megatron's .bin/.idx format, the only one written (older "
                     "Megatron-LM's flag)")
          ->check(CLI::IsMember({"lazy", "cached", "mmap"}))
          ->capture_default_str();
      sub.add_option("--chunk-size", f->chunk_size,
                     "Documents per worker task in older Megatron-LM; accepted, the workers take "
                     "documents as they free up here")
          ->check(CLI::PositiveNumber);
      sub.add_option("--log-interval", f->opt.log_interval, "Progress every N documents")
          ->capture_default_str();
      sub.add_option("--on-error", f->on_error,
                     "fail: stop at the first bad record; skip: skip and count bad records")
          ->capture_default_str();
      add_tokenizer_options(sub, f->tokenizer)->required();
      sub.callback([f] { run(*f); });
    });

}  // namespace
}  // namespace megatron::cli
