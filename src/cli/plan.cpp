// `megatron plan`: pretrain-gpt's command line plus --world-size (or the launcher's world), and
// nothing built: Megatron-LM's theoretical memory report, this build's per-rank prediction beside
// it, with a device the step time, with --search every layout that fits ranked by step time,
// with --measure a few real steps of one rank's share on this machine (src/plan/).
#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "cli/command.h"
#include "cli/pretrain_flags.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "plan/plan_output.h"

namespace megatron::cli {
namespace {

struct PlanFlags {
  PretrainFlags run;
  int world_size = 0;
  bool search = false, measure = false, json = false;
  std::string device;
  std::optional<double> memory_gib, tflops, interconnect_gbps;
  int64_t top = 20, max_micro_batch_size = 16;
  int measure_iters = 4, measure_rank = -1;
};

// The plan models the experts of a layer on every rank, sharded as the dense MLP is; expert
// parallelism is refused by name, whatever the trainer accepts.
void refuse_expert_parallelism(const PretrainFlags& run) {
  const MoeFlags& moe = run.moe;
  MG_REQUIRE(moe.expert_model_parallel_size <= 1, "plan: --expert-model-parallel-size ",
             moe.expert_model_parallel_size, ": the plan does not model expert parallelism yet "
             "(experts split over ranks, the all-to-all dispatch); size the run with 1");
  const int tp = run.a.parallel.tensor_model_parallel_size;
  MG_REQUIRE(moe.expert_tensor_parallel_size == 0 || moe.expert_tensor_parallel_size == tp,
             "plan: --expert-tensor-parallel-size ", moe.expert_tensor_parallel_size,
             " differs from --tensor-model-parallel-size ", tp, ": the plan models the experts "
             "sharded as the dense MLP is; leave the flag out or give ", tp);
}

void run(const PlanFlags& f) {
  refuse_expert_parallelism(f.run);
  training::TrainingArgs a = resolve_pretrain_flags(f.run);
  MG_REQUIRE(f.world_size >= 0, "--world-size must be >= 1 (got ", f.world_size, ")");
  auto world = world_communicator();
  const int world_size = f.world_size > 0 ? f.world_size : world->size();
  const bool printer = world->rank() == 0;
  auto tokenizer = data::build_tokenizer(a.tokenizer);
  tokenizer->eod_or_throw();  // the trainer's data needs an end-of-document token
  plan::PlanResult r;
  r.input = plan::make_plan_input(a, world_size, tokenizer->vocab_size());
  r.megatron = plan::megatron_theoretical_memory(plan::megatron_args_for(r.input),
                                                 r.input.first_num_microbatches);
  r.prediction = plan::predict_memory(r.input);
  // A rank of a world on this machine gets its share of the cores (as `megatron launch` sets it),
  // and holds the MPI runtime (its libraries, transports and their buffers: about 10 MiB with
  // Open MPI 4.1): loaded here before measuring, when the plan is for several ranks.
  if (world_size > 1) load_mpi_runtime();
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  r.process_resident = plan::process_resident_baseline(
      r.input, world_size > 1 ? std::max(1, cores / world_size) : 0);
  const bool want_device = f.search || !f.device.empty() || f.tflops || f.memory_gib;
  if (want_device) {
    MG_REQUIRE(!f.device.empty() || (f.tflops && f.memory_gib),
               "--search needs a device: --device "
               "h100|h200|cpu, or --device-tflops and --device-memory-gib");
    r.device = plan::make_device(f.device, world_size,
                                 {f.memory_gib, f.tflops, f.interconnect_gbps}, a.bf16 || a.fp16);
    if (r.device->name != "cpu") {  // a GPU run: no attention probabilities kept
      r.input.keeps_attention_probs = false;
      r.prediction = plan::predict_memory(r.input);
    }
    r.time = plan::estimate_step_time(r.input, *r.device);
  }
  if (f.search) {
    plan::SearchOptions so;
    so.max_micro_batch_size = f.max_micro_batch_size;
    r.search = plan::search_layouts(r.input, *r.device, so);
  }
  if (f.measure) {
    // The search's fastest fitting layout, or the run's own.
    plan::PlanInput chosen = r.input;
    if (!r.search.empty() && r.search.front().fits)
      chosen = plan::with_layout(r.input, r.search.front().layout);
    chosen.keeps_attention_probs = true;  // measured here, on the CPU
    const plan::MemoryPrediction pred = plan::predict_memory(chosen);
    const int rank = f.measure_rank >= 0
                         ? f.measure_rank
                         : plan::first_rank_of_stage(chosen.layout, pred.worst().pp_rank);
    const plan::DeviceSpec here = plan::make_device("cpu", chosen.world_size, {}, a.bf16 || a.fp16);
    r.measured_time = plan::estimate_step_time(chosen, here);
    r.measured_prediction = pred;
    r.measurement = plan::measure_rank(chosen, rank, f.measure_iters);
    r.measured_input = chosen;
  }
  if (!printer) return;
  if (f.json)
    log_print(plan::plan_json(r).dump(2));
  else
    log_print(plan::plan_text(r, size_t(f.top)));
}

CommandRegistrar reg(
    "plan",
    "Size a pretrain-gpt run before it starts: Megatron's theoretical "
    "memory, this build's prediction, a layout search (--search) and a check on "
    "this machine (--measure)",
    21, [](CLI::App& sub) {
      auto f = std::make_shared<PlanFlags>();
      f->run.a.tokenizer.type = "GPT2BPETokenizer";  // pretrain_gpt.py's default
      f->run.device_flag = false;                     // plan's --device names hardware (below)
      add_pretrain_flags(sub, &f->run);
      sub.add_option("--world-size", f->world_size,
                     "Ranks (devices) of the run (default: the launcher's world, or 1)")
          ->check(CLI::Range(1, 1 << 24));
      sub.add_flag("--search", f->search, "Rank every layout of the world that fits the device");
      sub.add_option("--device", f->device, "h100, h200, or cpu (this machine, measured)")
          ->check(CLI::IsMember({"h100", "h200", "cpu"}));
      sub.add_option("--device-memory-gib", f->memory_gib,
                     "Memory per device in GiB (overrides --device)");
      sub.add_option("--device-tflops", f->tflops,
                     "Dense peak TFLOP/s per device in the run's precision (overrides --device)");
      sub.add_option(
          "--interconnect-gbps", f->interconnect_gbps,
          "Interconnect bandwidth per device and direction, Gbit/s (overrides --device)");
      sub.add_option("--top", f->top, "Rows of the search table")->capture_default_str();
      sub.add_option("--max-micro-batch-size", f->max_micro_batch_size,
                     "Largest micro-batch size the search tries")
          ->capture_default_str();
      sub.add_flag("--json", f->json,
                   "Print one JSON object (raw bytes and seconds) instead of text");
      sub.add_flag("--measure", f->measure,
                   "Run a few steps of one rank's share of the layout (the search's pick with "
                   "--search) here and print measured against predicted memory and time");
      sub.add_option("--measure-iters", f->measure_iters,
                     "Steps --measure runs (the first warms up)")
          ->capture_default_str();
      sub.add_option("--measure-rank", f->measure_rank,
                     "World rank --measure runs (default: the first of the most loaded stage)");
      sub.callback([f] { run(*f); });
    });

}  // namespace
}  // namespace megatron::cli
