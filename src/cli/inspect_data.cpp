// `megatron inspect-data PREFIX`: what an indexed dataset holds. Modes, chosen in run():
//   (default)  summary: documents, sequences, tokens, dtype, document-length percentiles
//   --show N   document N, decoded with the tokenizer flags (token ids without --tokenizer-type)
// Each mode is one function over the opened dataset; a new mode adds its flags in setup() and
// one branch in run().
#include <algorithm>
#include <cmath>
#include <optional>

#include "cli/command.h"
#include "cli/tokenizer_options.h"
#include "core/error.h"
#include "core/log.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"

namespace megatron::cli {
namespace {

struct InspectFlags {
  std::string prefix;
  std::optional<int64_t> show;  // --show N
  data::TokenizerOptions tokenizer;
};

// Nearest-rank percentile of sorted values.
int64_t percentile(const std::vector<int64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  size_t rank = size_t(std::ceil(p / 100.0 * double(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

void print_summary(const data::IndexedDataset& ds) {
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
  data::IndexedDataset ds(f.prefix);
  if (f.show) {
    show_document(ds, *f.show, f);
    return;
  }
  print_summary(ds);
}

CommandRegistrar reg("inspect-data", "Show what an indexed dataset (.bin/.idx) holds", 102,
                     [](CLI::App& sub) {
                       auto f = std::make_shared<InspectFlags>();
                       sub.add_option("prefix", f->prefix, "Dataset prefix (without .bin/.idx)")
                           ->required();
                       sub.add_option("--show", f->show, "Print document N (decoded with the "
                                                         "tokenizer flags, else as ids)");
                       add_tokenizer_options(sub, f->tokenizer);
                       sub.callback([f] { run(*f); });
                     });

}  // namespace
}  // namespace megatron::cli
