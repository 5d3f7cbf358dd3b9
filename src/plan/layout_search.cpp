// The layout search (layout_search.h).
#include "plan/layout_search.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace megatron::plan {

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

bool same(const Layout& a, const Layout& b) {
  return a.tp == b.tp && a.pp == b.pp && a.cp == b.cp && a.dp == b.dp && a.vp == b.vp &&
         a.micro_batch_size == b.micro_batch_size &&
         (a.sequence_parallel || a.tp == 1) == (b.sequence_parallel || b.tp == 1) &&
         a.distributed_optimizer == b.distributed_optimizer && a.recompute == b.recompute;
}

}  // namespace

std::vector<Candidate> search_layouts(const PlanInput& in, const DeviceSpec& device,
                                      const SearchOptions& options) {
  std::vector<Candidate> out;
  const int world = in.world_size;
  const int layers = in.args.model.num_layers;
  for (int tp : divisors(world))
    for (int pp : divisors(world / tp))
      for (int cp : divisors(world / tp / pp)) {
        const int dp = world / tp / pp / cp;
        if (in.global_batch_size % dp != 0 || layers % pp != 0) continue;
        std::vector<int> vps{1};
        if (pp > 1)
          for (int v : divisors(layers / pp))
            if (v > 1) vps.push_back(v);
        std::vector<int64_t> mbss;
        const int64_t per_dp = in.global_batch_size / dp;
        for (int64_t m = 1; m <= per_dp && m <= options.max_micro_batch_size; ++m)
          if (per_dp % m == 0) mbss.push_back(m);
        if (per_dp % in.layout.micro_batch_size == 0 &&
            std::find(mbss.begin(), mbss.end(), in.layout.micro_batch_size) == mbss.end())
          mbss.push_back(in.layout.micro_batch_size);
        for (int vp : vps)
          for (int64_t mbs : mbss)
            for (model::RecomputeGranularityId rec :
                 {model::RecomputeGranularityId::none, model::RecomputeGranularityId::selective, model::RecomputeGranularityId::full})
              for (bool dist : {false, true})
                for (bool sp : {false, true}) {
                  if ((sp && tp == 1) || (dist && dp * cp == 1)) continue;
                  Layout l{tp, pp, cp, dp, vp, mbs, sp, dist, rec};
                  Candidate c;
                  c.layout = l;
                  try {
                    const PlanInput li = with_layout(in, l);
                    const MemoryPrediction mem = predict_memory(li);
                    c.peak_bytes = mem.worst().peak + device.reserved_bytes;
                    c.time = estimate_step_time(li, device);
                  } catch (const Error&) {
                    continue;  // a layout the trainer refuses for this run
                  }
                  c.fits = c.peak_bytes <= device.memory_bytes;
                  out.push_back(c);
                }
      }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& x, const Candidate& y) {
    if (x.fits != y.fits) return x.fits;
    if (x.time.total != y.time.total) return x.time.total < y.time.total;
    return x.peak_bytes < y.peak_bytes;
  });
  return out;
}

std::string format_search_table(const std::vector<Candidate>& ranked, const Layout& current,
                                size_t rows) {
  std::string s;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%4s  %-4s %-4s %-4s %-4s %-4s %-4s %-3s %-8s %-9s %10s %10s %12s %9s %6s\n",
                "rank", "TP", "PP", "VP", "CP", "DP", "mbs", "SP", "dist-opt", "recompute",
                "memory", "step (s)", "tokens/s", "TFLOP/s", "MFU");
  s += buf;
  size_t shown = 0;
  for (size_t i = 0; i < ranked.size() && shown < rows; ++i) {
    const Candidate& c = ranked[i];
    if (!c.fits) break;
    const Layout& l = c.layout;
    std::snprintf(buf, sizeof buf,
                  "%4zu  %-4d %-4d %-4d %-4d %-4d %-4lld %-3s %-8s %-9s %7.2f GiB %10.4g %12.1f "
                  "%9.3g %5.1f%%%s\n",
                  i + 1, l.tp, l.pp, l.vp, l.cp, l.dp, (long long)l.micro_batch_size,
                  l.sequence_parallel && l.tp > 1 ? "yes" : "no",
                  l.distributed_optimizer ? "yes" : "no", l.recompute_label(),
                  c.peak_bytes / (1024.0 * 1024.0 * 1024.0), c.time.total, c.time.tokens_per_second,
                  c.time.tflops_per_device, 100.0 * c.time.mfu,
                  same(l, current) ? "  <- the run's layout" : "");
    s += buf;
    ++shown;
  }
  return s;
}

nlohmann::json candidate_json(const Candidate& c) {
  const Layout& l = c.layout;
  return nlohmann::json{{"tensor_model_parallel_size", l.tp},
                        {"pipeline_model_parallel_size", l.pp},
                        {"virtual_pipeline_model_parallel_size", l.vp},
                        {"context_parallel_size", l.cp},
                        {"data_parallel_size", l.dp},
                        {"micro_batch_size", l.micro_batch_size},
                        {"sequence_parallel", l.sequence_parallel && l.tp > 1},
                        {"use_distributed_optimizer", l.distributed_optimizer},
                        {"recompute", l.recompute_label()},
                        {"fits", c.fits},
                        {"peak_memory_bytes", c.peak_bytes},
                        {"step_seconds", c.time.total},
                        {"tokens_per_second", c.time.tokens_per_second},
                        {"tflops_per_device", c.time.tflops_per_device},
                        {"mfu", c.time.mfu},
                        {"time_breakdown",
                         {{"compute", c.time.compute},
                          {"bubble", c.time.bubble},
                          {"tp_comm", c.time.tp_comm},
                          {"cp_comm", c.time.cp_comm},
                          {"pp_comm", c.time.pp_comm},
                          {"dp_comm", c.time.dp_comm},
                          {"optimizer", c.time.optimizer}}},
                        {"flags", l.describe()}};
}

}  // namespace megatron::plan
