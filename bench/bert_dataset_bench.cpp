// BERT data start-up and per-sample cost against Megatron's algorithm in Python/NumPy
// (tests/reference/megatron_bert_dataset.py, run in the same invocation on the same files):
//   1. the sample index of a split (helpers.cpp build_mapping + the mt19937_64 shuffle);
//   2. building samples 0 .. K-1 (bert_dataset.py __getitem__: segments, truncation, masking).
// Megatron runs (1) in C++ (helpers.cpp) and (2) in Python, once per sample in the data loader.
// Usage: bert_dataset_bench [documents] [seq_length] [samples requested] [samples built] [dir]
// Writes a synthetic sentence-split dataset (documents of 0..9 sentences of 1..60 tokens, words
// and "##" pieces of a 105-token vocabulary) into dir (default /tmp/bert_dataset_bench) once.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "core/error.h"
#include "data/bert_dataset.h"
#include "data/bert_wordpiece.h"
#include "data/indexed_dataset.h"

using namespace megatron::data;
namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void write_data(const std::string& dir, int64_t documents) {
  fs::create_directories(dir);
  std::ofstream v(dir + "/vocab.txt");
  v << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
  for (int i = 0; i < 60; ++i) v << "w" << i << "\n";
  for (int i = 0; i < 40; ++i) v << "##p" << i << "\n";
  v.close();
  std::mt19937 gen(1);
  IndexedDatasetBuilder b(dir + "/data_text_sentence", IndexDType::U16);
  std::vector<int32_t> tokens, lengths;
  for (int64_t d = 0; d < documents; ++d) {
    tokens.clear();
    lengths.clear();
    const int sentences = int(gen() % 10);
    for (int s = 0; s < sentences; ++s) {
      const int n = 1 + int(gen() % 60);
      for (int t = 0; t < n; ++t) tokens.push_back(gen() % 10 < 3 ? 65 + int(gen() % 40) : 5 + int(gen() % 60));
      lengths.push_back(n);
    }
    b.add_document(tokens, lengths);
  }
  b.finalize();
}

nlohmann::json ask_python(const nlohmann::json& request, const std::string& dir) {
  const std::string req = dir + "/request.json";
  std::ofstream(req) << request.dump() << "\n";
  const std::string cmd = "/usr/bin/python3 " MG_SOURCE_DIR "/tests/reference/megatron_bert_dataset.py < " + req;
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  std::string out;
  char buf[4096];
  while (p && fgets(buf, sizeof buf, p.get())) out += buf;
  return nlohmann::json::parse(out);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t documents = argc > 1 ? std::atoll(argv[1]) : 200000;
  const int64_t seq_length = argc > 2 ? std::atoll(argv[2]) : 512;
  const int64_t requested = argc > 3 ? std::atoll(argv[3]) : 400000;
  const int64_t built = argc > 4 ? std::atoll(argv[4]) : 2000;
  const std::string dir = argc > 5 ? argv[5] : "/tmp/bert_dataset_bench";
  if (!fs::exists(dir + "/data_text_sentence.idx") || !fs::exists(dir + "/vocab.txt")) write_data(dir, documents);
  auto data = std::make_shared<const IndexedDataset>(dir + "/data_text_sentence");
  MG_REQUIRE(data->num_documents() == documents, dir, " holds ", data->num_documents(),
             " documents; remove it or give that count");

  MaskedSampleIndexParams p;
  p.max_length = int32_t(seq_length - 3);
  p.short_seq_prob = 0.1;
  p.seed = 1234;
  p.min_sentences = 2;
  p.num_samples = requested;
  double best = 1e30;
  int64_t rows = 0, epochs = 0;
  for (int r = 0; r < 3; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    auto index = build_masked_sample_index(data->document_indices(), data->sequence_lengths(), p);
    best = std::min(best, seconds_since(t0));
    rows = index.size();
    epochs = index.num_epochs;
  }
  nlohmann::json req = {{"op", "time_mapping"},    {"prefix", dir + "/data_text_sentence"},
                        {"documents", {0, documents}}, {"num_samples", requested},
                        {"max_length", p.max_length}, {"short_seq_prob", p.short_seq_prob},
                        {"seed", p.seed},            {"min_sentences", p.min_sentences},
                        {"repeat", 1}};
  auto py = ask_python(req, dir);
  MG_REQUIRE(py["rows"].get<int64_t>() == rows, "the reference built ", py["rows"], " samples, we built ", rows);

  BertDataConfig c;
  c.seq_length = seq_length;
  c.use_cache = false;
  c.vocab = std::make_shared<const WordPieceVocab>(wordpiece_vocab(BertWordPieceTokenizer(dir + "/vocab.txt", true)));
  BertMaskedWordPieceDataset ds(data, Split::Train, {0, documents}, requested, c, "1", {});
  auto t0 = std::chrono::steady_clock::now();
  int64_t masked = 0;
  for (int64_t k = 0; k < built; ++k)
    for (int64_t m : ds.sample(k).loss_mask) masked += m;
  const double ours = seconds_since(t0);
  req = {{"op", "time_samples"}, {"prefix", dir + "/data_text_sentence"}, {"documents", {0, documents}},
         {"num_samples", requested}, {"vocab_file", dir + "/vocab.txt"}, {"seq_length", seq_length},
         {"seed", 1234}, {"mask_prob", 0.15}, {"short_seq_prob", 0.1}, {"binary_head", true}, {"count", built}};
  auto pys = ask_python(req, dir);
  MG_REQUIRE(pys["masked"].get<int64_t>() == masked, "the reference masked ", pys["masked"], " tokens, we ", masked);

  std::printf("documents %lld, sentences %lld, --seq-length %lld, %lld samples requested -> %lld samples "
              "(%lld epochs)\n\n",
              (long long)documents, (long long)data->num_sequences(), (long long)seq_length, (long long)requested,
              (long long)rows, (long long)epochs);
  std::printf("| what | megatron.cpp | Megatron's algorithm in Python/NumPy | ratio |\n|---|---|---|---|\n");
  const double pm = py["seconds"].get<double>(), ps = pys["seconds"].get<double>();
  std::printf("| sample index (build_mapping + shuffle) | %.3f s | %.3f s | %.0fx |\n", best, pm, pm / best);
  std::printf("| samples 0..%lld (__getitem__) | %.3f s (%.0f samples/s) | %.3f s (%.0f samples/s) | %.0fx |\n",
              (long long)built - 1, ours, double(built) / ours, ps, double(built) / ps, ps / ours);
  return 0;
}
