// Text and JSON of `megatron plan` (plan_output.h).
#include "plan/plan_output.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace megatron::plan {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", bytes / kMiB);
  return buf;
}

std::string row(const std::string& label, const std::vector<std::string>& cells) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "  %-34s", label.c_str());
  std::string s = buf;
  for (const std::string& c : cells) {
    std::snprintf(buf, sizeof buf, " %12s", c.c_str());
    s += buf;
  }
  return s + "\n";
}

std::string layout_line(const PlanInput& in) {
  const Layout& l = in.layout;
  return str("world ", in.world_size, " = TP ", l.tp, " x PP ", l.pp, " x CP ", l.cp, " x DP ",
             l.dp, l.vp > 1 ? str(", ", l.vp, " virtual stages per pipeline rank") : std::string(),
             l.sequence_parallel && l.tp > 1 ? ", sequence parallel" : "",
             l.distributed_optimizer ? ", distributed optimizer" : "",
             l.recompute != "none" ? ", " + l.recompute + " recomputation" : std::string(), "; ",
             in.num_microbatches, " micro-batches of ", in.args.micro_batch_size,
             " per rank and iteration (global batch ", in.global_batch_size, ", sequence ",
             in.args.model.seq_length, ", padded vocabulary ", in.args.model.padded_vocab_size,
             ")");
}

std::string prediction_table(const MemoryPrediction& p, double process) {
  std::string s;
  std::vector<std::string> head;
  for (const StageMemory& st : p.stages) head.push_back(str("stage ", st.pp_rank));
  s += row("MiB per rank", head);
  auto line = [&](const std::string& label, auto field) {
    std::vector<std::string> cells;
    for (const StageMemory& st : p.stages) cells.push_back(mib(field(st)));
    s += row(label, cells);
  };
  {
    std::vector<std::string> cells;
    for (const StageMemory& st : p.stages) cells.push_back(str(st.parameters));
    s += row("parameters (elements)", cells);
  }
  line("weights", [](const StageMemory& m) { return m.weights; });
  line("fp32 working copies", [](const StageMemory& m) { return m.working_weights; });
  line("gradients (fp32)", [](const StageMemory& m) { return m.gradients; });
  line("main weights (fp32)", [](const StageMemory& m) { return m.main_weights; });
  line("optimizer moments", [](const StageMemory& m) { return m.optimizer_moments; });
  line("communication buffers", [](const StageMemory& m) { return m.comm_buffers; });
  line("micro-batch inputs", [](const StageMemory& m) { return m.inputs; });
  line("activations, one micro-batch",
       [](const StageMemory& m) { return m.activations_per_microbatch; });
  {
    std::vector<std::string> cells;
    for (const StageMemory& st : p.stages) cells.push_back(str(st.max_in_flight));
    s += row("micro-batches in flight (most)", cells);
  }
  line("activations held at the peak", [](const StageMemory& m) { return m.activations; });
  line("largest workspace",
       [](const StageMemory& m) { return m.workspace + m.workspace_persistent; });
  line("peak (host allocator)", [](const StageMemory& m) { return m.peak; });
  line("dataset indices", [](const StageMemory& m) { return m.data_indices; });
  line("collective buffers (MPI)", [](const StageMemory& m) { return m.collective_extra; });
  line("heap retention (estimate)", [](const StageMemory& m) {
    return m.resident_overhead - m.data_indices - m.collective_extra;
  });
  line("peak resident (+ program)",  // the stage's most loaded rank (collectives' roles differ)
       [process](const StageMemory& m) { return m.peak_resident(process); });
  return s;
}

nlohmann::json stage_json(const StageMemory& m) {
  return {{"pp_rank", m.pp_rank},
          {"parameters", m.parameters},
          {"weights", m.weights},
          {"working_weights", m.working_weights},
          {"gradients", m.gradients},
          {"main_weights", m.main_weights},
          {"optimizer_moments", m.optimizer_moments},
          {"comm_buffers", m.comm_buffers},
          {"inputs", m.inputs},
          {"activations_per_microbatch", m.activations_per_microbatch},
          {"max_in_flight", m.max_in_flight},
          {"activations", m.activations},
          {"workspace", m.workspace + m.workspace_persistent},
          {"peak", m.peak},
          {"resident_overhead", m.resident_overhead},
          {"data_indices", m.data_indices},
          {"collective_extra", m.collective_extra}};
}

nlohmann::json time_json(const StepTime& t) {
  return {{"step_seconds", t.total},
          {"compute", t.compute},
          {"bubble", t.bubble},
          {"tp_comm", t.tp_comm},
          {"cp_comm", t.cp_comm},
          {"pp_comm", t.pp_comm},
          {"dp_comm", t.dp_comm},
          {"optimizer", t.optimizer},
          {"model_flops", t.model_flops},
          {"tokens_per_second", t.tokens_per_second},
          {"tflops_per_device", t.tflops_per_device},
          {"mfu", t.mfu}};
}

std::string time_text(const StepTime& t, const DeviceSpec& d) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "step time on %s: %.4g s (compute %.4g, pipeline bubble %.4g, TP %.4g, CP %.4g, "
                "PP %.4g, DP %.4g, optimizer %.4g); %.1f tokens/s, %.3g TFLOP/s per device, MFU "
                "%.1f%% of %.4g TFLOP/s\n",
                d.name.c_str(), t.total, t.compute, t.bubble, t.tp_comm, t.cp_comm, t.pp_comm,
                t.dp_comm, t.optimizer, t.tokens_per_second, t.tflops_per_device, 100.0 * t.mfu,
                d.peak_flops / 1e12);
  return buf;
}

}  // namespace

std::string plan_text(const PlanResult& r, size_t search_rows) {
  std::string s = "plan: " + layout_line(r.input) + "\n";
  if (r.input.megatron_ffn_hidden_size)
    s += str("note: --swiglu without --ffn-hidden-size: Megatron-LM's MLP width is ",
             *r.input.megatron_ffn_hidden_size,
             " (int(8h/3 / 64) x 64), used in its report below; "
             "this build trains with 4 x --hidden-size = ",
             r.input.args.model.ffn(), " (give --ffn-hidden-size to have both the same)\n");
  s += "\nMegatron-LM's theoretical memory report "
       "(megatron/training/theoretical_memory_usage.py):\n";
  for (const std::string& line : r.megatron.lines) s += line + "\n";
  s += "\nThis build's prediction (what the trainer allocates on each rank of a pipeline stage):\n";
  s += prediction_table(r.prediction, r.process_resident);
  const StageMemory& w = r.prediction.worst();
  s += str("most loaded: stage ", w.pp_rank, ", peak ", mib(w.peak), " MiB of tensors (",
           mib(w.peak + w.resident_overhead + r.process_resident),
           " MiB resident with this program's ", mib(r.process_resident),
           " MiB); Megatron's formula: ", mib(r.megatron.total_mb * kMiB), " MB\n");
  if (r.device && r.time) s += "\n" + time_text(*r.time, *r.device);
  if (r.device && !r.search.empty()) {
    size_t fit = 0;
    for (const Candidate& c : r.search) fit += c.fits;
    s += str("\nlayout search on ", r.device->description, ", ", mib(r.device->memory_bytes),
             " MiB per device (", mib(r.device->reserved_bytes), " MiB reserved): ", fit, " of ",
             r.search.size(), " layouts fit; the fastest ", std::min(fit, search_rows), ":\n");
    s += format_search_table(r.search, r.input.layout, search_rows);
    if (fit == 0) s += "no layout fits: more devices, a smaller micro-batch or model\n";
  }
  if (r.measurement && r.measured_input && r.measured_prediction && r.measured_time) {
    const Measurement& m = *r.measurement;
    const StageMemory& p = r.measured_prediction->stages.at(size_t(m.pp_rank));
    const StepTime& t = *r.measured_time;
    const double compute = t.compute + t.optimizer;
    s += str("\nmeasured on this machine: world rank ", m.world_rank, " (pipeline stage ",
             m.pp_rank, ") of ", r.measured_input->layout.describe(), ", ", m.iterations,
             " steps, the others' communication simulated\n");
    char buf[512];
    std::snprintf(
        buf, sizeof buf,
        "  peak host allocator: measured %.1f MiB, predicted %.1f MiB (%+.1f%%)\n"
        "  peak resident:       measured %.1f MiB, predicted %.1f MiB (%+.1f%%)\n"
        "  step time:           measured %.4g s, predicted %.4g s of compute and optimizer "
        "(%+.1f%%); on the real layout add %.4g s of communication and bubble\n",
        m.peak_allocated / kMiB, p.peak / kMiB, 100.0 * (p.peak / m.peak_allocated - 1),
        m.peak_resident / kMiB, (p.peak + p.resident_overhead + m.resident_before) / kMiB,
        100.0 * ((p.peak + p.resident_overhead + m.resident_before) / m.peak_resident - 1),
        m.seconds_per_iteration, compute, 100.0 * (compute / m.seconds_per_iteration - 1),
        t.total - compute);
    s += buf;
  }
  return s;
}

nlohmann::json plan_json(const PlanResult& r) {
  nlohmann::json j;
  const Layout& l = r.input.layout;
  j["world_size"] = r.input.world_size;
  j["layout"] = candidate_json(Candidate{l, 0, {}, true})["flags"];
  j["num_microbatches"] = r.input.num_microbatches;
  j["global_batch_size"] = r.input.global_batch_size;
  j["padded_vocab_size"] = r.input.args.model.padded_vocab_size;
  const MegatronMemoryReport& m = r.megatron;
  j["megatron"] = {{"weight_and_optimizer_bytes", m.weight_and_optimizer_bytes},
                   {"activation_bytes", m.activation_bytes},
                   {"weight_and_optimizer_mb", m.weight_and_optimizer_mb},
                   {"activation_mb", m.activation_mb},
                   {"total_mb", m.total_mb},
                   {"lines", m.lines}};
  nlohmann::json stages = nlohmann::json::array();
  for (const StageMemory& st : r.prediction.stages) stages.push_back(stage_json(st));
  j["prediction"] = {
      {"stages", stages},
      {"most_loaded_stage", r.prediction.worst().pp_rank},
      {"peak", r.prediction.worst().peak},
      {"process_resident", r.process_resident},
      {"peak_resident",
       r.prediction.worst().peak + r.prediction.worst().resident_overhead + r.process_resident}};
  if (r.device)
    j["device"] = {{"name", r.device->name},
                   {"description", r.device->description},
                   {"memory_bytes", r.device->memory_bytes},
                   {"peak_flops", r.device->peak_flops},
                   {"efficiency", r.device->efficiency},
                   {"memory_bandwidth", r.device->memory_bandwidth},
                   {"interconnect_bandwidth", r.device->interconnect_bandwidth},
                   {"reserved_bytes", r.device->reserved_bytes},
                   {"measured", r.device->measured}};
  if (r.time) j["time"] = time_json(*r.time);
  if (!r.search.empty()) {
    nlohmann::json c = nlohmann::json::array();
    for (const Candidate& x : r.search) c.push_back(candidate_json(x));
    j["search"] = c;
  }
  if (r.measurement && r.measured_input && r.measured_prediction && r.measured_time) {
    const Measurement& m = *r.measurement;
    const StageMemory& p = r.measured_prediction->stages.at(size_t(m.pp_rank));
    j["measure"] = {{"world_rank", m.world_rank},
                    {"pp_rank", m.pp_rank},
                    {"layout", r.measured_input->layout.describe()},
                    {"iterations", m.iterations},
                    {"seconds_per_iteration", m.seconds_per_iteration},
                    {"peak_allocated", m.peak_allocated},
                    {"peak_resident", m.peak_resident},
                    {"resident_before", m.resident_before},
                    {"predicted_peak", p.peak},
                    {"predicted_peak_resident", p.peak + p.resident_overhead + m.resident_before},
                    {"predicted_time", time_json(*r.measured_time)}};
  }
  return j;
}

}  // namespace megatron::plan
