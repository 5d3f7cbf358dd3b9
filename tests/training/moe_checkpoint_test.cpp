// Checkpoints under expert parallelism (training/checkpoint.h): under mpirun (Mpi* tests) a run
// with its experts spread over 2 expert-parallel ranks, with the plain or the distributed
// optimizer, alone or beside data or tensor parallelism, saves one folder per expert-parallel rank
// (mp_rank_TT_EEE, Megatron's names) holding the dense weights and that rank's experts under their
// global numbers, and resumes from it bit for bit (losses, grad norms, final parameters); the
// checkpoint loads under another expert-parallel size (resharded on load) and converts to a
// single rank; the flags take --save/--load with --expert-model-parallel-size.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/safetensors.h"
#include "parallel_test_util.h"
#include "test_util.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

// 2 layers, the second an MoE layer of 4 GeLU experts (top-2, no shared expert) with the
// load-balancing loss, the first a dense MLP.
TrainingArgs ep_args(const Fixture& f, int ep, bool dist_opt) {
  TrainingArgs a = f.args(10);
  a.model.add_bias_linear = false;
  a.model.num_moe_experts = 4;
  a.model.moe_layer_freq = "[0,1]";
  a.model.moe_ffn_hidden_size = 32;
  a.model.moe_router_topk = 2;
  a.model.moe_aux_loss_coeff = 0.01f;
  a.parallel.expert_model_parallel_size = ep;
  a.parallel.use_distributed_optimizer = dist_opt;
  return a;
}

std::string expert_of(const std::string& name) {  // "...local_experts.<e>.linear_fc1.weight" -> e
  const std::string key = "local_experts.";
  const size_t at = name.find(key);
  if (at == std::string::npos) return "";
  return name.substr(at + key.size(), name.find('.', at + key.size()) - at - key.size());
}

// Each EP folder holds the dense weights and its own experts (global numbers), nothing else.
void expect_expert_folders(const fs::path& iter_dir, int ep, bool dist_opt, int dp, int tp = 1) {
  const json meta = json::parse(testing::read_file(iter_dir / "metadata.json"));
  EXPECT_EQ(meta["parallel"]["expert_model_parallel_size"], ep);
  EXPECT_EQ(meta["parallel"]["data_parallel_size"], dp);
  EXPECT_FALSE(fs::exists(iter_dir / "mp_rank_00"));
  int shard_files = 0;
  for (int k = 0; k < tp * ep; ++k) {  // TP rank t, EP rank e
    const int t = k / ep, e = k % ep;
    const fs::path folder = iter_dir / checkpoint_rank_dir(t, 1, 0, ep, e);
    SCOPED_TRACE(folder.string());
    const SafetensorsContents st = read_safetensors(folder / "model.safetensors");
    std::set<std::string> experts;
    for (const auto& [n, t] : st.tensors)
      if (!expert_of(n).empty()) experts.insert(expert_of(n));
    const int per = 4 / ep;
    std::set<std::string> want;
    for (int x = e * per; x < (e + 1) * per; ++x) want.insert(std::to_string(x));
    EXPECT_EQ(experts, want);
    EXPECT_TRUE(st.tensors.count("decoder.layers.0.mlp.linear_fc1.weight"));
    EXPECT_TRUE(st.tensors.count("decoder.layers.1.mlp.router.weight"));
    EXPECT_EQ(fs::exists(folder / "optimizer.safetensors"), !dist_opt);
    for (const auto& entry : fs::directory_iterator(folder))
      shard_files += entry.path().filename().string().starts_with("distrib_optim_dp_");
  }
  EXPECT_EQ(shard_files, dist_opt ? tp * dp : 0);  // one shard per rank, none written twice
}

// Saved at iteration 5 and resumed, the run equals the uninterrupted one bit for bit: losses, MoE
// losses, grad norms and the final parameters.
TEST(MpiMoeCheckpoint, ExpertParallelResumeIsBitExact) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  const int n = world()->size();
  struct L { std::string name; bool dist_opt; int tp; };
  std::vector<L> layouts = {{"ep2", false, 1}, {"ep2_distopt", true, 1}};
  // 4 ranks: EP 2 x expert-DP 2; EP 2 x TP 2 (the experts tensor-parallel as the dense MLP)
  if (n == 4) layouts = {{"ep2_dp2_distopt", true, 1}, {"ep2_tp2", false, 2}};
  for (const L& l : layouts) {
    SCOPED_TRACE(l.name);
    TrainingArgs base = ep_args(f, 2, l.dist_opt);
    base.parallel.tensor_model_parallel_size = l.tp;
    ResumeExtras extras;
    extras.optimizer = true;
    extras.at_split = [&](const fs::path& it) { expect_expert_folders(it, 2, l.dist_opt, n / l.tp, l.tp); };
    expect_exact_resume(base, f.dir / (l.name + "_full"), f.dir / (l.name + "_split"),
                        [](const TrainingArgs& a) { return pretrain(a); }, 5, extras);
  }
}

// An EP2 checkpoint loads under expert-parallel size 1 (every rank then holds all experts, read by
// name from both folders) and an EP1 checkpoint under EP2; the resumed runs follow the
// uninterrupted curve (the EP2 and EP1 curves agree within 1e-5, as the parity test shows).
// `checkpoint convert` of the EP2 checkpoint gives one folder with every expert, and of the EP1
// one a folder per EP rank, each with the same parameters and optimizer state; a missing file of
// an EP folder is an error naming it.
TEST(MpiMoeCheckpoint, ExpertParallelSizeChangesOnLoadAndConversion) {
  SKIP_ON_ONE_RANK();
  Fixture f;
  // From EP to EP: on 4 ranks also 4 -> 2, where each rank reads only the folders of its experts.
  std::vector<std::pair<int, int>> changes = {{2, 1}, {1, 2}};
  if (world()->size() == 4) changes.push_back({4, 2});
  for (const bool dist_opt : {false, true}) {
    for (const auto& [from_ep, to_ep] : changes) {
      const std::string name = str("ep", from_ep, "_to_ep", to_ep, dist_opt ? "_distopt" : "");
      SCOPED_TRACE(name);
      TrainingArgs full = ep_args(f, from_ep, dist_opt);
      full.save = f.dir / (name + "_full");
      full.save_interval = 5;
      const TrainingSummary whole = pretrain(full);
      TrainingArgs rest = ep_args(f, to_ep, dist_opt);
      rest.load = full.save;
      rest.ckpt_step = 5;
      rest.save = f.dir / (name + "_rest");
      rest.save_interval = 1000;
      const TrainingSummary r = pretrain(rest);
      ASSERT_EQ(r.start_iteration, 5);
      ASSERT_EQ(r.losses.size(), 5u);
      for (size_t i = 0; i < 5; ++i) {
        EXPECT_NEAR(r.losses[i], whole.losses[5 + i], 1e-5 * whole.losses[5 + i]) << i + 6;
        EXPECT_NEAR(r.grad_norms[i], whole.grad_norms[5 + i], 1e-4 * whole.grad_norms[5 + i]) << i + 6;
      }
      if (world()->rank() == 0) {
        expect_same_params(rest.save, full.save, 10, 1e-5);
        if (from_ep == 1) {  // and an EP1 checkpoint to one folder per EP rank of 2
          ConvertOptions o;
          o.load = full.save;
          o.save = f.dir / (name + "_to_ep2");
          o.target_ep = 2;
          const ConvertResult c = convert_checkpoint(o);
          EXPECT_EQ(c.to.expert_model_parallel_size, 2);
          expect_expert_folders(c.dir, 2, false, world()->size());
          expect_same_params(o.save, full.save, 10, 0.0);
          expect_same_optimizer_state(o.save, full.save, 10, 0.0, 0.0);
        }
        if (from_ep == 2) {  // convert the EP2 checkpoint to one rank: nothing changes
          ConvertOptions o;
          o.load = full.save;
          o.save = f.dir / (name + "_converted");
          const ConvertResult c = convert_checkpoint(o);
          EXPECT_EQ(c.from.expert_model_parallel_size, 2);
          EXPECT_EQ(c.to.expert_model_parallel_size, 1);
          EXPECT_TRUE(fs::exists(c.dir / "mp_rank_00/model.safetensors"));
          expect_same_params(o.save, full.save, 10, 0.0);
          expect_same_optimizer_state(o.save, full.save, 10, 0.0, 0.0);
          // A missing expert folder's file is an error naming it.
          const fs::path broken = f.dir / (name + "_broken");
          fs::copy(full.save, broken, fs::copy_options::recursive);
          const std::string lost = dist_opt ? "mp_rank_00_001/distrib_optim_dp_001.safetensors"
                                            : "mp_rank_00_001/model.safetensors";
          fs::remove(broken / "iter_0000010" / lost);
          ConvertOptions ob = o;
          ob.load = broken;
          ob.save = f.dir / (name + "_broken_converted");
          try {
            convert_checkpoint(ob);
            ADD_FAILURE() << "converted a checkpoint missing " << lost;
          } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(lost), std::string::npos) << e.what();
          }
        }
      }
      world()->barrier();
    }
  }
}

TEST(MoeCheckpointCli, SaveAndLoadTakeExpertParallelism) {
  const std::string base = "pretrain-gpt --num-layers 2 --hidden-size 32 --num-attention-heads 4 "
                           "--seq-length 16 --max-position-embeddings 16 --micro-batch-size 1 "
                           "--train-iters 1 --lr 1e-3 --mock-data --tokenizer-type NullTokenizer "
                           "--vocab-size 4096 --disable-bias-linear --num-experts 4 ";
  // With --save the only complaint of a single process is the world size, not the checkpoint.
  const testing::CommandResult ep = testing::run_cli(base + "--expert-model-parallel-size 2 "
                                                     "--save /nonexistent/x --save-interval 1");
  EXPECT_NE(ep.exit_code, 0);
  EXPECT_NE(ep.output.find("--expert-model-parallel-size (2)"), std::string::npos) << ep.output;
  EXPECT_EQ(ep.output.find("--save/--load with"), std::string::npos) << ep.output;
  // Megatron's .pt files for MoE: saved (one rank: the mp_rank_00 folder).
  testing::TempDir dir;
  const testing::CommandResult pt = testing::run_cli(base + "--save " + (dir / "pt").string() +
                                                     " --save-interval 1 --ckpt-format torch");
  EXPECT_EQ(pt.exit_code, 0) << pt.output;
  EXPECT_TRUE(fs::exists(dir / "pt" / "iter_0000001" / "mp_rank_00" / "model_optim_rng.pt")) << pt.output;
}

}  // namespace
}  // namespace megatron::training
