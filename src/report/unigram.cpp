// The unigram baseline (unigram.h).
#include "report/unigram.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "data/data_builder.h"
#include "data/indexed_dataset.h"
#include "data/mock_gpt_dataset.h"

namespace megatron::report {

namespace {

using Counts = std::unordered_map<int32_t, double>;

double entropy(const std::vector<std::pair<Counts, double>>& parts) {  // (counts, weight)
  Counts p;
  for (const auto& [c, w] : parts) {
    double n = 0;
    for (const auto& kv : c) n += kv.second;
    if (n > 0)
      for (const auto& [t, k] : c) p[t] += w * k / n;
  }
  double h = 0;
  for (const auto& kv : p)
    if (kv.second > 0) h -= kv.second * std::log(kv.second);
  return h;
}

// Tokens of evenly spaced sequences of `d`, up to `budget`.
Counts sample_counts(const data::LowLevelDataset& d, int64_t budget) {
  Counts c;
  const int64_t n = d.num_sequences();
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) total += d.sequence_length(i);
  const int64_t stride = std::max<int64_t>(1, total / std::max<int64_t>(1, budget));
  std::vector<int32_t> buf;
  for (int64_t i = 0; i < n; i += stride) {
    buf.clear();
    d.read(i, 0, d.sequence_length(i), buf);
    for (int32_t t : buf) c[t] += 1;
  }
  return c;
}

// The arguments block writes lists as JSON (["1.0", "prefix"]) or Python (['prefix']).
std::vector<std::string> as_list(const std::string& v) {
  std::string s = v;
  for (char& ch : s)
    if (ch == '\'') ch = '"';
  nlohmann::json j = nlohmann::json::parse(s, nullptr, false);
  std::vector<std::string> out;
  if (j.is_array()) {
    for (const auto& e : j) out.push_back(e.is_string() ? e.get<std::string>() : e.dump());
    return out;
  }
  std::istringstream in(v);
  for (std::string t; in >> t;) out.push_back(t);
  return out;
}

}  // namespace

std::optional<UnigramBaseline> unigram_baseline(const RunRecord& run,
                                                const std::vector<std::string>& given,
                                                int64_t max_tokens) {
  std::vector<std::string> paths = given;
  if (paths.empty()) {
    // Megatron's mock data: --mock-data, or (as the trainer requires data) no data path at all.
    auto empty = [&](const char* name) {
      const auto v = run.argument(name);
      return v && as_list(*v).empty();
    };
    const bool mock = run.argument("mock_data").value_or("") == "True" ||
                      (empty("data_path") && empty("train_data_path") && empty("valid_data_path") &&
                       empty("test_data_path"));
    if (mock) {
      const data::MockGPTLowLevelDataset mock(0);
      Counts c;  // document i: 1 .. L_i - 1 and EOD
      std::vector<double> longer(size_t(data::MockGPTLowLevelDataset::kMaxSequenceLength) + 1, 0);
      for (int32_t len : mock.sequence_lengths()) longer[size_t(len)] += 1;
      double at_least = 0;
      for (int64_t t = int64_t(longer.size()) - 1; t >= 1; --t) {
        at_least += longer[size_t(t)];  // documents of length >= t hold token t - 1 ... (t-1 >= 1)
        if (t - 1 >= 1) c[int32_t(t - 1)] = at_least;
      }
      c[-1] = double(mock.num_sequences());  // EOD, once per document
      return UnigramBaseline{entropy({{c, 1.0}}), "Megatron's mock documents (--mock-data)"};
    }
    if (auto dp = run.argument("data_path")) paths = as_list(*dp);
  }
  if (paths.empty()) return std::nullopt;
  const data::Blend blend = data::parse_blend(paths, "--data-path");
  std::vector<std::pair<Counts, double>> parts;
  int64_t per = max_tokens / int64_t(blend.prefixes.size());
  for (size_t i = 0; i < blend.prefixes.size(); ++i) {
    const data::IndexedDataset d(blend.prefixes[i]);
    parts.push_back({sample_counts(d, per),
                     blend.weights ? (*blend.weights)[i] : 1.0 / double(blend.prefixes.size())});
  }
  std::string src = "the training data (";
  for (size_t i = 0; i < blend.prefixes.size(); ++i) src += (i ? ", " : "") + blend.prefixes[i];
  return UnigramBaseline{entropy(parts), src + ")"};
}

}  // namespace megatron::report
