// Masked-LM scores of a BERT model over micro-batches (bert_evaluate.h).
#include "inference/bert_evaluate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "training/metrics.h"

namespace megatron::inference {

MaskedLMTotals& MaskedLMTotals::operator+=(const MaskedLMTotals& o) {
  micro_batches += o.micro_batches;
  lm_loss += o.lm_loss;
  masked += o.masked;
  lm_correct += o.lm_correct;
  sop_loss += o.sop_loss;
  sop_labelled += o.sop_labelled;
  sop_correct += o.sop_correct;
  return *this;
}

std::vector<double> MaskedLMTotals::values() const {
  return {micro_batches, lm_loss, masked, lm_correct, sop_loss, sop_labelled, sop_correct};
}

MaskedLMTotals MaskedLMTotals::from_values(std::span<const double> v) {
  MG_CHECK(v.size() == 7, "MaskedLMTotals::from_values: ", v.size(), " values");
  return {v[0], v[1], v[2], v[3], v[4], v[5], v[6]};
}

namespace {

// Cross entropy of `label` and whether it is the (first) argmax, over n logits.
std::pair<double, bool> cross_entropy(const float* z, int64_t n, int64_t label) {
  int64_t best = 0;
  for (int64_t k = 1; k < n; ++k)
    if (z[k] > z[best]) best = k;
  double sum = 0;
  for (int64_t k = 0; k < n; ++k) sum += std::exp(double(z[k]) - double(z[best]));
  return {std::log(sum) + double(z[best]) - double(z[label]), best == label};
}

}  // namespace

MaskedLMTotals score_masked_lm(const Tensor& lm_logits, const Tensor& sop_logits,
                               const model::Batch& in) {
  MG_CHECK(lm_logits.dim() == 3 && in.labels.defined() && in.loss_mask.defined(),
           "score_masked_lm: needs [b, s, V] logits, labels and the loss mask");
  const Tensor z = lm_logits.contiguous().to(Device::cpu());
  const Tensor labels = in.labels.contiguous().to(Device::cpu());
  const Tensor mask = in.loss_mask.contiguous().to(Device::cpu());
  const int64_t rows = z.size(0) * z.size(1), V = z.size(2);
  MG_CHECK(labels.numel() == rows && mask.numel() == rows, "score_masked_lm: labels and mask "
           "must have the logits' [b, s]");
  MaskedLMTotals t;
  t.micro_batches = 1;
  double loss = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const double m = mask.data<float>()[r];
    if (m == 0) continue;
    const int32_t label = labels.data<int32_t>()[r];
    MG_REQUIRE(label >= 0 && label < V, "masked position ", r, " has label ", label,
               ", outside the model's vocabulary of ", V);
    const auto [ce, right] = cross_entropy(z.data<float>() + r * V, V, label);
    loss += m * ce;
    t.masked += m;
    t.lm_correct += right ? m : 0;
  }
  t.lm_loss = t.masked > 0 ? loss / t.masked : 0;
  if (!sop_logits.defined()) return t;
  const Tensor s = sop_logits.contiguous().to(Device::cpu());
  const Tensor y = in.sequence_labels.contiguous().to(Device::cpu());
  MG_CHECK(s.dim() == 2 && s.size(1) == 2 && y.numel() == s.size(0),
           "score_masked_lm: sentence-order logits [b, 2] and labels [b]");
  double sop = 0;
  for (int64_t b = 0; b < s.size(0); ++b) {
    const int32_t label = y.data<int32_t>()[b];
    if (label < 0) continue;
    const auto [ce, right] = cross_entropy(s.data<float>() + 2 * b, 2, label);
    sop += ce;
    t.sop_labelled += 1;
    t.sop_correct += right ? 1 : 0;
  }
  t.sop_loss = t.sop_labelled > 0 ? sop / t.sop_labelled : 0;
  return t;
}

MaskedLMTotals evaluate_masked_lm(model::BertModel& model, int64_t count,
                                  const std::function<model::Batch(int64_t)>& micro_batch,
                                  const std::function<void(int64_t)>& progress) {
  const bool binary = model.config().bert_binary_head;
  MaskedLMTotals total;
  for (int64_t i = 0; i < count; ++i) {
    if (progress) progress(i);
    model::Batch in = micro_batch(i);
    const Tensor logits = model.forward_logits(in);
    const Tensor sop = binary ? model.forward_binary_logits(in) : Tensor();
    total += score_masked_lm(logits, sop, in);
  }
  return total;
}

std::string masked_lm_result_line(const std::string& prefix, const MaskedLMTotals& t,
                                  bool binary_head) {
  const double n = std::max(t.micro_batches, 1.0);
  training::NamedLosses losses = {{"lm loss", t.lm_loss / n}};
  if (binary_head) losses.emplace_back("sop loss", t.sop_loss / n);
  std::string line = training::format_evaluation_line(prefix, losses);
  char buf[128];
  std::snprintf(buf, sizeof buf, "lm accuracy: %.6f | ", t.lm_correct / std::max(t.masked, 1.0));
  line += buf;
  if (binary_head) {
    std::snprintf(buf, sizeof buf, "sop accuracy: %.6f | ", t.sop_correct / std::max(t.sop_labelled, 1.0));
    line += buf;
  }
  return line;
}

}  // namespace megatron::inference
