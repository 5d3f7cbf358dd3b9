// `megatron inspect-data PREFIX`: what an indexed dataset holds. Modes, chosen in run():
//   (default)  summary: documents, sequences, tokens, dtype, document-length percentiles (from
//              the index alone); --entropy adds the unigram entropy (reads the whole .bin)
//   --show N   document N, decoded with the tokenizer flags (token ids without --tokenizer-type)
//   --samples K  the first K training samples built from the training data flags (--data-path,
//              --split, --seq-length, --seed, batch/iteration flags) exactly as training sees them;
//              with --dataset-type bert --format json, the first K samples of --split-name's
//              split as pretrain-bert builds them, one JSON object a line, key for key the dict
//              Megatron's BERTMaskedWordPieceDataset returns; with --dataset-type t5 likewise
//              pretrain-t5's samples (T5MaskedWordPieceDataset)
// Each mode is one function over the opened dataset; a new mode adds its flags in setup() and
// one branch in run().
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <optional>
#include <unordered_map>

#include "cli/bert_data_flags.h"
#include "cli/command.h"
#include "cli/tokenizer_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "data/bert_dataset.h"
#include "data/data_builder.h"
#include "data/indexed_dataset.h"
#include "data/t5_dataset.h"
#include "data/tokenizer.h"
#include "model/layer_spec.h"

namespace megatron::cli {
namespace {

struct InspectFlags {
  std::string prefix;
  std::optional<int64_t> show;  // --show N
  bool entropy = false;         // --entropy: the summary also reads every token
  data::TokenizerOptions tokenizer;
  // --samples K mode
  std::optional<int64_t> samples;
  std::string format = "text";
  // --dataset-type: the model family (model/layer_kinds.h) whose samples are shown
  std::string dataset_type = model::kind_name(model::ModelFamilyId::gpt);
  std::string split_name = "train";  // bert, t5: which split's samples
  data::GPTDataConfig data;
  data::BertDataConfig bert;  // the masking flags (BERT and T5); the data flags are read from `data`
  data::T5DataConfig t5;      // the T5 lengths
  int64_t micro_batch_size = 1, global_batch_size = -1, train_iters = 0, train_samples = -1;
  int64_t eval_interval = 1000, eval_iters = 100;
};

// --dataset-type bert|t5: samples of one split as JSON lines.
void show_masked_samples(InspectFlags f) {
  const std::string& type = f.dataset_type;
  const bool t5 = model::model_family_kind(type).id == model::ModelFamilyId::t5;
  MG_REQUIRE(f.format == "json", "--dataset-type ", type, " prints each sample as one JSON object: add --format json");
  MG_REQUIRE(!f.data.data_path.empty() || !f.data.train_data_path.empty() || !f.data.valid_data_path.empty() ||
                 !f.data.test_data_path.empty(),
             "--samples needs the data: --data-path (or --train-data-path/--valid-data-path/--test-data-path)");
  if (t5) {
    MG_REQUIRE(f.data.seq_length == 0 || f.t5.encoder_seq_length == 0,
               "give --encoder-seq-length or its alias --seq-length, not both");
    if (f.t5.encoder_seq_length == 0) f.t5.encoder_seq_length = f.data.seq_length;
    MG_REQUIRE(f.t5.encoder_seq_length > 0, "--dataset-type t5 needs --encoder-seq-length");
    MG_REQUIRE(f.t5.decoder_seq_length > 0, "--dataset-type t5 needs --decoder-seq-length");
  } else {
    MG_REQUIRE(f.data.seq_length > 0, "--samples needs --seq-length");
  }
  MG_REQUIRE(f.train_iters > 0 || f.train_samples >= 0, "--samples needs --train-iters or --train-samples");
  MG_REQUIRE(!f.tokenizer.type.empty(), "--dataset-type ", type, " needs the tokenizer flags "
             "(--tokenizer-type BertWordPieceLowerCase --vocab-file vocab.txt",
             t5 ? " --vocab-extra-ids 100)" : ")");
  auto tok = data::build_tokenizer(f.tokenizer);
  const auto vocab = std::make_shared<const data::WordPieceVocab>(data::wordpiece_vocab(*tok));
  const int64_t gbs = f.global_batch_size > 0 ? f.global_batch_size : f.micro_batch_size;
  const auto n =
      data::train_valid_test_num_samples(f.train_samples, f.train_iters, gbs, f.eval_interval, f.eval_iters);
  auto fill = [&](data::MaskedDataConfig& c) {
    c.data_path = f.data.data_path;
    c.train_data_path = f.data.train_data_path;
    c.valid_data_path = f.data.valid_data_path;
    c.test_data_path = f.data.test_data_path;
    c.split = f.data.split;
    c.seed = f.data.seed;
    c.data_cache_path = f.data.data_cache_path;
    c.tokenizer = tok->type();
    c.vocab = vocab;
    c.mask_prob = f.bert.mask_prob;
    c.short_seq_prob = f.bert.short_seq_prob;
  };
  auto show = [&](const auto& ds, const auto& to_json) {
    const auto& split = f.split_name == "train" ? ds.train : f.split_name == "valid" ? ds.valid : ds.test;
    MG_REQUIRE(split, "the ", f.split_name, " split is empty (check --split or --", f.split_name, "-data-path)");
    MG_REQUIRE(*f.samples >= 0 && *f.samples <= split->size(), "asked for ", *f.samples, " samples but the ",
               f.split_name, " split has ", split->size());
    for (int64_t k = 0; k < *f.samples; ++k) log_print(to_json(split->sample(k)));
  };
  if (t5) {
    data::T5DataConfig c = f.t5;
    fill(c);
    show(data::build_t5_datasets(c, n), data::t5_sample_json);
  } else {
    data::BertDataConfig c = f.bert;
    fill(c);
    c.seq_length = f.data.seq_length;
    show(data::build_bert_datasets(c, n), data::bert_sample_json);
  }
}

void show_samples(InspectFlags f) {
  MG_REQUIRE(f.format != "json", "--format json prints BERT or T5 samples: add --dataset-type bert or t5");
  MG_REQUIRE(f.split_name == "train", "--split-name ", f.split_name,
             " is for --dataset-type bert or t5; GPT samples are shown from the training split");
  MG_REQUIRE(!f.data.data_path.empty() || !f.data.train_data_path.empty(),
             "--samples needs the training data: --data-path (or --train-data-path)");
  MG_REQUIRE(f.data.seq_length > 0, "--samples needs --seq-length");
  MG_REQUIRE(f.format == "ids" || !f.tokenizer.type.empty(),
             "--samples prints decoded text: give the tokenizer flags, or --format ids");
  int64_t gbs = f.global_batch_size > 0 ? f.global_batch_size : f.micro_batch_size;
  MG_REQUIRE(f.train_iters > 0 || f.train_samples >= 0, "--samples needs --train-iters or --train-samples");
  f.data.tokenizer = f.tokenizer.type;
  auto n = data::train_valid_test_num_samples(f.train_samples, f.train_iters, gbs, f.eval_interval, f.eval_iters);
  auto samples = data::first_training_samples(f.data, n, *f.samples);
  std::unique_ptr<data::Tokenizer> tok;
  if (f.format != "ids") tok = data::build_tokenizer(f.tokenizer);
  for (size_t k = 0; k < samples.size(); ++k) {
    if (tok) {
      log_print(str("--- sample ", k, " ---"));
      log_print(tok->decode(samples[k]));
    } else {
      std::string line = "[";
      for (size_t i = 0; i < samples[k].size(); ++i) line += (i ? ", " : "") + std::to_string(samples[k][i]);
      log_print(line + "]");
    }
  }
}

// Nearest-rank percentile of sorted values.
int64_t percentile(const std::vector<int64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  size_t rank = size_t(std::ceil(p / 100.0 * double(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

void print_summary(const data::IndexedDataset& ds, bool with_entropy) {
  auto lengths = ds.sequence_lengths();
  auto docs = ds.document_indices();
  std::vector<int64_t> doc_lengths(size_t(ds.num_documents()));
  for (size_t d = 0; d + 1 < docs.size(); ++d) {
    int64_t n = 0;
    for (int64_t s = docs[d]; s < docs[d + 1]; ++s) n += lengths[size_t(s)];
    doc_lengths[d] = n;
  }
  std::sort(doc_lengths.begin(), doc_lengths.end());
  log_print(str("dataset:   ", ds.prefix()));
  log_print(str("dtype:     ", data::index_dtype_name(ds.dtype())));
  log_print(str("documents: ", ds.num_documents()));
  log_print(str("sequences: ", ds.num_sequences()));
  log_print(str("tokens:    ", ds.num_tokens()));
  log_print(str("document length (tokens): min ", percentile(doc_lengths, 0), ", p50 ",
                percentile(doc_lengths, 50), ", p90 ", percentile(doc_lengths, 90), ", p99 ",
                percentile(doc_lengths, 99), ", max ",
                doc_lengths.empty() ? 0 : doc_lengths.back()));
  if (!with_entropy) return;
  // The entropy of the token frequencies: the loss (nats/token) of the best model that ignores
  // context, the baseline a trained language model's loss should fall well below.
  // Ids below kDense are counted in an array, larger ones in a map: memory follows the distinct
  // ids present, not the largest id a file holds.
  constexpr int32_t kDense = int32_t(1) << 22;
  std::vector<int64_t> counts;
  std::unordered_map<int32_t, int64_t> sparse;
  std::vector<int32_t> ids;
  ProgressLine progress(true, 30);  // reading the whole .bin of a large dataset takes a while
  for (int64_t q = 0; q < ds.num_sequences(); ++q) {
    if (progress.due()) progress.update("--entropy: " + progress_text(q, ds.num_sequences(), progress.elapsed(), "sequences"));
    ids.clear();
    ds.read(q, 0, ds.sequence_length(q), ids);
    for (size_t k = 0; k < ids.size(); ++k) {
      const int32_t t = ids[k];
      MG_REQUIRE(t >= 0, ds.prefix(), ".bin: sequence ", q, " holds token id ", t, " at position ",
                 k, "; token ids are never negative (a corrupted file, or one written with "
                 "another dtype than its .idx says)");
      if (t >= kDense) {
        ++sparse[t];
        continue;
      }
      if (size_t(t) >= counts.size()) counts.resize(size_t(t) + 1, 0);
      ++counts[size_t(t)];
    }
  }
  const double total = double(ds.num_tokens());
  double entropy = 0;
  int64_t distinct = 0;
  const auto add = [&](int64_t c) {
    if (c == 0) return;
    entropy -= double(c) / total * std::log(double(c) / total);
    ++distinct;
  };
  for (int64_t c : counts) add(c);
  for (const auto& [id, c] : sparse) add(c);
  if (total > 0)
    log_print(str("unigram entropy: ", std::fixed, std::setprecision(4), entropy, " nats/token over ",
                  distinct, " distinct tokens (the loss of a model that ignores context)"));
}

void show_document(const data::IndexedDataset& ds, int64_t doc, const InspectFlags& f) {
  MG_REQUIRE(doc >= 0 && doc < ds.num_documents(), "--show ", doc, " is out of range: ",
             ds.prefix(), " has ", ds.num_documents(), " documents");
  std::vector<int32_t> ids;
  auto docs = ds.document_indices();
  for (int64_t s = docs[size_t(doc)]; s < docs[size_t(doc) + 1]; ++s)
    ds.read(s, 0, ds.sequence_length(s), ids);
  if (f.tokenizer.type.empty()) {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
    log_print(line);
  } else {
    log_print(data::build_tokenizer(f.tokenizer)->decode(ids));
  }
}

void run(const InspectFlags& f) {
  if (f.samples) {
    if (model::model_family_kind(f.dataset_type).id != model::ModelFamilyId::gpt)
      show_masked_samples(f);
    else
      show_samples(f);
    return;
  }
  MG_REQUIRE(!f.prefix.empty(), "give a dataset PREFIX (or --samples K with the training data flags)");
  data::IndexedDataset ds(f.prefix);
  if (f.show) {
    show_document(ds, *f.show, f);
    return;
  }
  print_summary(ds, f.entropy);
}

CommandRegistrar reg("inspect-data", "Show what an indexed dataset (.bin/.idx) holds", 102,
                     [](CLI::App& sub) {
                       auto f = std::make_shared<InspectFlags>();
                       sub.add_option("prefix", f->prefix, "Dataset prefix (without .bin/.idx)");
                       sub.add_option("--show", f->show, "Print document N (decoded with the "
                                                         "tokenizer flags, else as ids)");
                       sub.add_flag("--entropy", f->entropy,
                                    "Summary: also the unigram entropy (reads every token)");
                       add_tokenizer_options(sub, f->tokenizer);
                       sub.add_option("--samples", f->samples, "Print the first K training samples");
                       sub.add_option("--format", f->format, "--samples output: text or ids (one JSON list a "
                                                             "line); json (one sample dict a line, BERT, T5)")
                           ->check(CLI::IsMember({"text", "ids", "json"}));
                       sub.add_option("--dataset-type", f->dataset_type, "--samples: gpt, bert (pretrain-bert's "
                                                                         "masked samples) or t5 (pretrain-t5's)")
                           ->check(CLI::IsMember(model::model_family_names()))->capture_default_str();
                       sub.add_option("--split-name", f->split_name, "--samples: the split shown (bert, t5)")
                           ->check(CLI::IsMember({"train", "valid", "test"}))->capture_default_str();
                       add_bert_data_flags(sub, f->bert);
                       add_t5_length_flags(sub, f->t5);
                       add_dataset_flags(sub, f->data);
                       sub.add_option("--seq-length", f->data.seq_length, "Sequence length");
                       sub.add_option("--seed", f->data.seed, "Random seed")->capture_default_str();
                       sub.add_option("--micro-batch-size", f->micro_batch_size, "Micro-batch size");
                       sub.add_option("--global-batch-size", f->global_batch_size, "Global batch size");
                       sub.add_option("--train-iters", f->train_iters, "Training iterations");
                       sub.add_option("--train-samples", f->train_samples, "Training samples");
                       sub.add_option("--eval-interval", f->eval_interval, "Evaluation interval")->capture_default_str();
                       sub.add_option("--eval-iters", f->eval_iters, "Evaluation iterations")->capture_default_str();
                       sub.callback([f] { run(*f); });
                     });

}  // namespace
}  // namespace megatron::cli
