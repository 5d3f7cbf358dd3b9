// Megatron-LM's two loss normalisations (training/trainer.h) against an independent PyTorch
// computation of its formula (tests/reference/loss_normalisation_reference.py, float64, which
// simulates every rank as Megatron-LM's loss_func, forward_step, DDP gradient scaling and
// finalize_model_grads do): one SGD step (lr 1, momentum 0, no weight decay, no clipping) of the
// tiny GPT with --eod-mask-loss on a corpus of short documents, 8 micro-batches of one sample
// whose loss-token counts differ. The gradient recovered from the checkpoints (weights before -
// weights after) must equal the reference's within 1e-5, in Megatron's default mode and with
// --calculate-per-token-loss, on one rank and (Mpi*) under DP, PP and CP; the reference's two modes
// differ by far more than that on this data, so the wrong formula cannot pass.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "data/data_builder.h"
#include "data/indexed_dataset.h"
#include "parallel_test_util.h"
#include "test_util.h"
#include "training/trainer.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

constexpr double kTolerance = 1e-5;
constexpr int kEod = 63;

// Documents of 2..12 tokens then EOD: a 16-token sample holds 1 to 6 EODs, so with
// --eod-mask-loss the micro-batches' loss-token counts differ.
void write_short_documents(const std::string& prefix) {
  data::IndexedDatasetBuilder b(prefix, data::IndexDType::U16);
  for (int d = 0; d < 300; ++d) {
    std::vector<int32_t> doc;
    const int len = 2 + (d * 7) % 11, step = 1 + d % 5;
    for (int i = 0; i < len; ++i) doc.push_back((d + i * step) % 60);
    doc.push_back(kEod);
    b.add_item(doc);
    b.end_document();
  }
  b.finalize();
}

// One SGD step with a constant learning rate `lr` (0: the run only saves the initial weights).
TrainingArgs one_step_args(const fs::path& dir, double lr, bool per_token) {
  TrainingArgs a = tiny_gpt_args(dir, 1);
  a.model.num_layers = 4;  // 2 model chunks of 1 layer per stage under PP2 interleaved
  a.data.data_path = {(dir / "short_docs").string()};
  a.data.eod_mask_loss = true;
  a.micro_batch_size = 1;
  a.global_batch_size = 8;
  a.optimizer_name = "sgd";
  a.optimizer.sgd_momentum = 0.0;
  a.optimizer.clip_grad = 0.0;
  a.weight_decay = 0.0;
  a.lr = lr;
  a.min_lr = lr;
  a.lr_decay_style = "constant";
  a.lr_warmup_iters = 0;
  a.eval_iters = 0;
  a.save_interval = 1;
  a.calculate_per_token_loss = per_token;
  return a;
}

struct Run {
  std::string name;
  TrainingArgs args;
};

struct Layout {
  std::string name;
  int dp = 1, cp = 1, pp = 1, tp = 1;
  int layers_per_virtual_stage = 0;  // > 0: the interleaved schedule
  bool dist_opt = false, recompute = false;
};

// The references of every layout, both modes: name -> tensor name -> gradient (float64).
using Reference = std::map<std::string, std::map<std::string, std::vector<double>>>;

// Writes the initial weights (checkpoint `init` at iteration 1) and the global batch's samples,
// runs the PyTorch reference for `layouts`, and returns its gradients ("<layout>/default",
// "<layout>/per_token"). Single process (rank 0).
Reference pytorch_reference(const fs::path& dir, const std::string& init, const TrainingArgs& a,
                            const std::vector<Layout>& layouts) {
  const fs::path ref = dir / "reference";
  fs::create_directories(ref);
  const json meta = json::parse(testing::read_file(fs::path(init) / "iter_0000001" / "metadata.json"));
  const SafetensorsContents st =
      read_safetensors(fs::path(init) / "iter_0000001" / "mp_rank_00" / "model.safetensors");
  json spec;
  spec["model"] = meta["args"]["model"];
  spec["eod"] = kEod;
  spec["eod_mask_loss"] = true;
  std::ofstream wf(ref / "weights.bin", std::ios::binary);
  for (const auto& [name, t] : st.tensors) {
    spec["params"].push_back({{"name", name}, {"shape", t.shape()}});
    const std::vector<float> v = t.to_float_vector();
    wf.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
  }
  wf.close();
  for (const Layout& l : layouts) spec["layouts"].push_back({{"name", l.name}, {"dp", l.dp}, {"cp", l.cp}});
  testing::write_file(ref / "spec.json", spec.dump());

  // The global batch as the trainer reads it: the first 8 samples of the training split.
  data::GPTDataConfig dc = a.data;
  dc.seq_length = a.model.seq_length;
  dc.seed = uint32_t(a.seed);
  dc.eod_id = kEod;
  dc.vocab_size = a.tokenizer.vocab_size;
  const auto samples = data::first_training_samples(
      dc, data::train_valid_test_num_samples(-1, a.train_iters, a.global_batch_size, a.eval_interval, a.eval_iters),
      a.global_batch_size);
  std::ofstream sf(ref / "samples.bin", std::ios::binary);
  std::set<int> counts;
  for (const auto& s : samples) {
    sf.write(reinterpret_cast<const char*>(s.data()), std::streamsize(s.size() * sizeof(int32_t)));
    int c = 0;
    for (size_t i = 0; i + 1 < s.size(); ++i) c += s[i] != kEod;
    counts.insert(c);
  }
  sf.close();
  EXPECT_GE(counts.size(), 3u) << "the micro-batches' loss-token counts should differ";

  const auto r = testing::run_command("/usr/bin/python3 " +
                                      (testing::source_dir() / "tests/reference/loss_normalisation_reference.py").string() +
                                      " " + ref.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string raw = testing::read_file(ref / "out.bin");
  const double* p = reinterpret_cast<const double*>(raw.data());
  size_t off = 0, n = raw.size() / sizeof(double);
  Reference out;
  for (const Layout& l : layouts)
    for (const char* mode : {"default", "per_token"})
      for (const auto& [name, t] : st.tensors) {
        const size_t k = size_t(t.numel());
        if (off + k > n) {
          ADD_FAILURE() << "out.bin is too short";
          return out;
        }
        out[l.name + "/" + mode][name].assign(p + off, p + off + k);
        off += k;
      }
  EXPECT_EQ(off, n) << "out.bin has unexpected trailing values";
  return out;
}

// The gradient the step applied, (before - after) / lr with lr 1, against the reference; and
// the reference of the other mode is far from it.
void expect_gradient(const std::map<std::string, std::vector<float>>& before, const std::string& after_save,
                     const std::map<std::string, std::vector<double>>& ref,
                     const std::map<std::string, std::vector<double>>& other_mode, const std::string& what) {
  const auto after = gathered_model(after_save, 1);
  ASSERT_EQ(after.size(), ref.size()) << what;
  double worst = 0, modes_apart = 0;
  for (const auto& [name, g] : ref) {
    const std::vector<float>& w0 = before.at(name);
    const std::vector<float>& w1 = after.at(name);
    ASSERT_EQ(w1.size(), g.size()) << what << " " << name;
    for (size_t i = 0; i < g.size(); ++i) {
      const double got = double(w0[i]) - double(w1[i]);
      worst = std::max(worst, std::abs(got - g[i]));
      modes_apart = std::max(modes_apart, std::abs(g[i] - other_mode.at(name)[i]));
    }
  }
  EXPECT_LE(worst, kTolerance) << what << ": largest gradient difference to the reference";
  EXPECT_GE(modes_apart, 100 * kTolerance) << what << ": the two modes must differ on this data";
  std::printf("%s: gradient within %.2e of the reference (the other mode's is %.2e away)\n",
              what.c_str(), worst, modes_apart);
}

// Trains one step in every layout and mode over the world (or alone when the layout's size is
// 1) and compares each with the reference; rank 0 writes the initial weights and runs PyTorch.
void check_layouts(const std::vector<Layout>& layouts) {
  Fixture f;
  const fs::path dir = f.dir.path();
  if (world()->rank() == 0) write_short_documents((dir / "short_docs").string());
  world()->barrier();
  const std::string init = f.dir / "init";
  if (world()->rank() == 0) {
    TrainingArgs a = one_step_args(dir, 0.0, false);
    a.save = init;
    run_single(a);
  }
  world()->barrier();
  for (const Layout& l : layouts) {
    for (bool per_token : {false, true}) {
      TrainingArgs a = one_step_args(dir, 1.0, per_token);
      a.save = f.dir / (l.name + (per_token ? "_per_token" : "_default"));
      a.parallel.context_parallel_size = l.cp;
      a.parallel.pipeline_model_parallel_size = l.pp;
      a.parallel.tensor_model_parallel_size = l.tp;
      a.model.sequence_parallel = l.tp > 1;
      a.parallel.num_layers_per_virtual_pipeline_stage = l.layers_per_virtual_stage;
      a.parallel.use_distributed_optimizer = l.dist_opt;
      if (l.recompute) {
        a.model.recompute_granularity = "full";
        a.model.recompute_method = "uniform";
        a.model.recompute_num_layers = 2;
      }
      const int size = l.dp * l.cp * l.pp * l.tp;
      if (size == 1) {
        if (world()->rank() == 0) run_single(a);
      } else {
        ASSERT_EQ(size, world()->size()) << l.name;
        pretrain(a);
      }
    }
  }
  world()->barrier();
  if (world()->rank() == 0) {
    const Reference ref = pytorch_reference(dir, init, one_step_args(dir, 1.0, false), layouts);
    const auto before = gathered_model(init, 1);
    for (const Layout& l : layouts) {
      if (!ref.count(l.name + "/default")) continue;  // the reference failed (reported above)
      const auto& def = ref.at(l.name + "/default");
      const auto& tok = ref.at(l.name + "/per_token");
      expect_gradient(before, f.dir / (l.name + "_default"), def, tok, l.name + " default");
      expect_gradient(before, f.dir / (l.name + "_per_token"), tok, def,
                      l.name + " --calculate-per-token-loss");
    }
  }
  world()->barrier();
}

// One rank, and with full recomputation (the loss gradient is taken in the forward, which the
// recomputation does not repeat).
TEST(LossNormalisation, OneSgdStepFollowsMegatronsFormulaOnOneRank) {
  Layout recompute{"single_recompute"};
  recompute.recompute = true;
  check_layouts({{"single"}, recompute});
}

// np 2: DP2, PP2 (1F1B), PP2 interleaved, TP2 with sequence parallelism, and CP2 (each rank
// divides by its own slice's loss tokens in the default mode); np 4: DP4 with the distributed
// optimizer, PP2 interleaved x DP2 and CP2 x DP2.
TEST(MpiLossNormalisation, OneSgdStepFollowsMegatronsFormulaInParallelLayouts) {
  SKIP_ON_ONE_RANK();
  // name, dp, cp, pp, tp, layers per virtual stage, distributed optimizer
  if (world()->size() == 2)
    check_layouts({{"dp2", 2}, {"pp2", 1, 1, 2}, {"pp2_interleaved", 1, 1, 2, 1, 1},
                   {"tp2_sp", 1, 1, 1, 2}, {"cp2", 1, 2}});
  else if (world()->size() == 4)
    check_layouts({{"dp4_distopt", 4, 1, 1, 1, 0, true}, {"pp2_interleaved_dp2", 2, 1, 2, 1, 1},
                   {"cp2_dp2", 2, 2}});
  else
    GTEST_SKIP() << "layouts for 2 or 4 ranks";
}

}  // namespace
}  // namespace megatron::training
