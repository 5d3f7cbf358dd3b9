// The training report's numbers and series (report_model.h).
#include "report/report_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>

#include "core/error.h"
#include "training/metrics.h"

namespace megatron::report {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? std::nan("") : v[v.size() / 2];
}

int64_t arg_int(const RunRecord& r, const char* name) {
  const auto v = r.argument(name);
  if (!v) return 0;
  try {
    return std::stoll(*v);
  } catch (const std::exception&) {
    return 0;
  }
}

// Megatron's FLOPs of one iteration of `gbs` samples, when the arguments give the model.
std::optional<double> flops_per_iteration(const RunRecord& r, int64_t gbs) {
  training::FlopsModel m{arg_int(r, "num_layers"),
                         arg_int(r, "hidden_size"),
                         arg_int(r, "num_attention_heads"),
                         arg_int(r, "kv_channels"),
                         arg_int(r, "num_query_groups"),
                         arg_int(r, "ffn_hidden_size"),
                         arg_int(r, "seq_length"),
                         arg_int(r, "padded_vocab_size"),
                         r.argument("activation").value_or("") == "swiglu"};
  if (m.seq_length == 0) m.seq_length = arg_int(r, "model.seq_length");
  if (m.num_layers <= 0 || m.hidden_size <= 0 || m.num_attention_heads <= 0 || m.seq_length <= 0 ||
      m.padded_vocab_size <= 0 || gbs <= 0)
    return std::nullopt;
  return training::flops_per_iteration(m, gbs);
}

// A TensorBoard tag's values when it has at least as many points as the log has intervals
// (denser); otherwise the intervals' field.
template <class F>
Series series_of(const RunRecord& r, const std::string& tag, const std::string& name,
                 const std::string& color, F field) {
  Series s{name, color, {}, {}};
  auto tb = r.scalars.find(tag);
  if (tb != r.scalars.end() && tb->second.size() >= r.intervals.size()) {
    for (const Scalar& v : tb->second) {
      s.x.push_back(double(v.step));
      s.y.push_back(v.value);
    }
    return s;
  }
  for (const Interval& iv : r.intervals) {
    const std::optional<double> y = field(iv);
    if (y && std::isfinite(*y)) {
      s.x.push_back(double(iv.iteration));
      s.y.push_back(*y);
    }
  }
  return s;
}

Plot line_plot(const std::string& id, const std::string& title, const std::string& y_label,
               std::vector<Series> series, const std::string& note = "") {
  Plot p;
  p.id = id;
  p.title = title;
  p.x_label = "iteration";
  p.y_label = y_label;
  p.series = std::move(series);
  p.note = note;
  return p;
}

}  // namespace

ReportModel build_report_model(const RunRecord& r, const ReportOptions& o) {
  ReportModel m;
  m.title = o.title;
  m.refresh_seconds = o.refresh_seconds;
  m.unigram_loss = o.unigram_loss;
  m.sources = r.sources;
  m.layout = r.layout;
  {
    const std::time_t now = std::time(nullptr);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
    m.generated = buf;
  }
  const Interval* last = r.intervals.empty() ? nullptr : &r.intervals.back();
  m.iterations = last ? last->iteration : 0;
  m.train_iters = last ? last->train_iters : arg_int(r, "train_iters");
  m.status = r.finished ? "finished"
             : last ? str("in progress or stopped: iteration ", m.iterations, " of ", m.train_iters,
                          " in the log (re-run megatron report to refresh)")
                    : "no iteration logged yet";
  // Per-interval throughput: the log's TFLOP/s, or Megatron's formula over the step time.
  const int64_t world = r.world_size();
  std::vector<double> tokens, tflops;
  Series tok{"tokens/s", "#1f77b4", {}, {}}, tfl{"TFLOP/s per device", "#9467bd", {}, {}};
  const int64_t seq = std::max(arg_int(r, "seq_length"), arg_int(r, "model.seq_length"));
  for (const Interval& iv : r.intervals) {
    std::optional<double> t = iv.tokens_per_second;
    if (!t && seq > 0 && iv.ms_per_iteration > 0)
      t = double(iv.global_batch_size * seq) / (iv.ms_per_iteration / 1000.0);
    if (t) {
      tokens.push_back(*t);
      tok.x.push_back(double(iv.iteration));
      tok.y.push_back(*t);
    }
    // Megatron's formula over the step time when the arguments give the model (the log prints
    // TFLOP/s with one decimal only), else the log's own figure.
    std::optional<double> f = iv.tflops_per_device;
    if (iv.ms_per_iteration > 0)
      if (auto fl = flops_per_iteration(r, iv.global_batch_size))
        f = *fl / (iv.ms_per_iteration / 1000.0) / double(world) / 1e12;
    if (f) {
      tflops.push_back(*f);
      tfl.x.push_back(double(iv.iteration));
      tfl.y.push_back(*f);
    }
  }
  if (!tokens.empty()) m.median_tokens_per_second = median(tokens);
  if (!tflops.empty()) m.median_tflops_per_device = median(tflops);
  if (m.median_tflops_per_device && o.peak_tflops)
    m.mfu = *m.median_tflops_per_device / *o.peak_tflops;
  if (last) m.last_loss = last->lm_loss;
  for (const Evaluation& e : r.evaluations)
    if (e.split == "validation" && (!m.best_validation_loss || e.loss < *m.best_validation_loss))
      m.best_validation_loss = e.loss;
  int64_t skipped = 0, nan = 0;
  for (const Interval& iv : r.intervals) {
    skipped += iv.skipped;
    nan += iv.nan;
  }
  double max_alloc = 0, max_res = 0;
  std::map<int, MemoryLine> per_rank;
  for (const MemoryLine& l : r.memory) {
    per_rank[l.rank] = l;
    max_alloc = std::max(max_alloc, l.max_allocated);
    max_res = std::max(max_res, l.max_reserved);
  }
  // Cards.
  m.cards.push_back({"iterations", str(m.iterations, " / ", m.train_iters)});
  if (last) m.cards.push_back({"consumed samples", str(last->consumed_samples)});
  if (m.last_loss) m.cards.push_back({"last lm loss", fmt("%.6E", *m.last_loss)});
  if (m.best_validation_loss)
    m.cards.push_back({"best validation loss", fmt("%.6E", *m.best_validation_loss)});
  if (o.unigram_loss) m.cards.push_back({"unigram baseline", fmt("%.4f", *o.unigram_loss)});
  if (m.median_tokens_per_second)
    m.cards.push_back({"tokens/s (median)", fmt("%.1f", *m.median_tokens_per_second)});
  if (m.median_tflops_per_device)
    m.cards.push_back({"TFLOP/s per device (median)", fmt("%.3g", *m.median_tflops_per_device)});
  m.cards.push_back({"MFU", m.mfu
                                ? fmt("%.1f%%", 100.0 * *m.mfu) + " of " +
                                      fmt("%.4g", *o.peak_tflops) + " TFLOP/s (" + o.peak_name + ")"
                                : std::string("give --peak-tflops or --device")});
  m.cards.push_back(
      {"skipped iterations", str(skipped, nan > 0 ? str(" (", nan, " NaN)") : std::string())});
  if (!per_rank.empty())
    m.cards.push_back({"peak memory (MiB)", fmt("%.1f", max_alloc) + " allocated, " +
                                                fmt("%.1f", max_res) + " resident"});
  // Plots.
  std::vector<Series> loss{series_of(r, "lm loss", "training", "#1f77b4", [](const Interval& i) {
    return std::optional<double>(i.lm_loss);
  })};
  Series valid{"validation", "#d62728", {}, {}, false, true},
      test{"test", "#2ca02c", {}, {}, false, true};
  for (const Evaluation& e : r.evaluations) {
    Series& s = e.split == "test" ? test : valid;
    s.x.push_back(double(e.iteration));
    s.y.push_back(e.loss);
  }
  if (valid.x.empty())
    if (auto tb = r.scalars.find("lm loss validation"); tb != r.scalars.end())
      for (const Scalar& v : tb->second) {
        valid.x.push_back(double(v.step));
        valid.y.push_back(v.value);
      }
  if (!valid.x.empty()) loss.push_back(valid);
  if (!test.x.empty()) loss.push_back(test);
  if (o.unigram_loss && !loss[0].x.empty()) {
    loss.push_back({"unigram baseline",
                    "#7f7f7f",
                    {loss[0].x.front(), loss[0].x.back()},
                    {*o.unigram_loss, *o.unigram_loss},
                    true,
                    false});
  }
  m.plots.push_back(line_plot("loss", "Loss", "lm loss (nats)", loss,
                              o.unigram_loss ? "baseline: " + o.unigram_source : ""));
  m.plots.push_back(line_plot(
      "lr", "Learning rate", "learning rate",
      {series_of(r, "learning-rate", "learning rate", "#ff7f0e",
                 [](const Interval& i) { return std::optional<double>(i.learning_rate); })}));
  m.plots.push_back(line_plot("grad-norm", "Gradient norm", "grad norm",
                              {series_of(r, "grad-norm", "grad norm", "#2ca02c",
                                         [](const Interval& i) { return i.grad_norm; })}));
  Series skipped_series{"skipped iterations", "#d62728", {}, {}, false, true};
  for (const Interval& iv : r.intervals) {
    skipped_series.x.push_back(double(iv.iteration));
    skipped_series.y.push_back(double(iv.skipped));
  }
  m.plots.push_back(
      line_plot("loss-scale", "Loss scale", "loss scale",
                {series_of(r, "loss-scale", "loss scale", "#8c564b",
                           [](const Interval& i) { return std::optional<double>(i.loss_scale); })},
                str(skipped, " skipped iteration(s)")));
  if (skipped > 0)
    m.plots.push_back(
        line_plot("skipped", "Skipped iterations per interval", "skipped", {skipped_series}));
  m.plots.push_back(line_plot("throughput", "Throughput", "tokens/s", {tok}));
  m.plots.push_back(
      line_plot("tflops", "TFLOP/s per device", "TFLOP/s", {tfl},
                m.mfu ? "MFU " + fmt("%.1f%%", 100.0 * *m.mfu) + " against " +
                            fmt("%.4g", *o.peak_tflops) + " TFLOP/s, " + o.peak_name
                      : "MFU: give the device's dense peak (--peak-tflops or --device)"));
  Series step{"step", "#1f77b4", {}, {}}, comm{"communication", "#ff7f0e", {}, {}};
  for (const Interval& iv : r.intervals) {
    step.x.push_back(double(iv.iteration));
    step.y.push_back(iv.ms_per_iteration);
    if (iv.comm_ms_per_iteration) {
      comm.x.push_back(double(iv.iteration));
      comm.y.push_back(*iv.comm_ms_per_iteration);
    }
  }
  std::vector<Series> time_series{step};
  if (!comm.x.empty()) time_series.push_back(comm);
  m.plots.push_back(line_plot("step-time", "Time per iteration", "ms", time_series));
  if (!per_rank.empty()) {
    Plot p;
    p.id = "memory";
    p.title = "Memory per rank";
    p.x_label = "rank";
    p.y_label = "MiB";
    p.bars = true;
    Series a{"max allocated", "#1f77b4", {}, {}}, res{"max reserved (resident)", "#ff7f0e", {}, {}};
    for (const auto& [rank, l] : per_rank) {
      p.categories.push_back(str(rank));
      a.x.push_back(double(rank));
      a.y.push_back(l.max_allocated);
      res.x.push_back(double(rank));
      res.y.push_back(l.max_reserved);
      m.memory.push_back({str(rank), str(l.iteration), fmt("%.1f", l.allocated),
                          fmt("%.1f", l.max_allocated), fmt("%.1f", l.reserved),
                          fmt("%.1f", l.max_reserved)});
    }
    p.series = {a, res};
    m.plots.push_back(p);
  }
  // Time per phase: the steps, their communication, and the rest of the wall time the log spans
  // (evaluation, checkpoints, logging).
  double steps = 0, comm_s = 0;
  int64_t prev = r.intervals.empty() ? 0 : r.intervals.front().iteration - 1;
  for (const Interval& iv : r.intervals) {
    const double n = double(iv.iteration - prev);
    steps += n * iv.ms_per_iteration / 1000.0;
    if (iv.comm_ms_per_iteration) comm_s += n * *iv.comm_ms_per_iteration / 1000.0;
    prev = iv.iteration;
  }
  m.phases.push_back({"training steps", fmt("%.3f", steps)});
  if (comm_s > 0) m.phases.push_back({"of which communication (this rank)", fmt("%.3f", comm_s)});
  if (r.intervals.size() >= 2 && r.intervals.front().seconds && last->seconds) {
    const double wall = *last->seconds - *r.intervals.front().seconds;
    double between = 0;  // the steps logged after the first line
    for (size_t i = 1; i < r.intervals.size(); ++i)
      between += double(r.intervals[i].iteration - r.intervals[i - 1].iteration) *
                 r.intervals[i].ms_per_iteration / 1000.0;
    m.phases.push_back(
        {"evaluation, checkpoints and logging", fmt("%.3f", std::max(0.0, wall - between))});
    m.phases.push_back(
        {"wall time between the first and last logged iteration", fmt("%.3f", wall)});
  }
  for (const Checkpoint& c : r.checkpoints)
    m.checkpoints.push_back(
        {str(c.iteration), c.dir, fmt("%.1f", c.bytes / (1024.0 * 1024.0)), c.saved});
  for (const auto& [k, v] : r.arguments) m.arguments.push_back({k, v});
  return m;
}

}  // namespace megatron::report
