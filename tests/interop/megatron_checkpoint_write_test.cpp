// Writing Megatron-LM's torch checkpoints (checkpoint convert --save-format torch and
// save_torch_checkpoint): a trained tiny GPT's checkpoint (fp32, bf16, fp16) written for TP x PP
// layouts (virtual stages too, both layer specs) loads with torch.load into Megatron's module trees
// with strict names and shapes (every _extra_state Megatron-Core's specs have, the output layer's
// included), its optimizer into torch.optim.Adam over Megatron's parameter groups in the form the
// optimizer Megatron then builds takes (Transformer Engine's FusedAdam: the step per group; torch's
// AdamW: per parameter, and it steps), its RNG state into random / NumPy / torch equal to Megatron's seeding; read back (directly
// or converted to our format) every tensor, moment, main weight and the step are bit for bit the
// original's, and training resumed from it follows the original's loss curve exactly.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "model/gpt_model.h"
#include "model/layer_kinds.h"
#include "optim/optimizer.h"
#include "interop/checkpoint_test_util.h"
#include "test_util.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"
#include "training/parallel_test_util.h"
#include "training/torch_checkpoint.h"

namespace megatron::training {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using json = nlohmann::json;
using parallel_test::run_single;
using parallel_test::tiny_gpt_args;
using parallel_test::write_corpus;

using interop_testing::bit_equal;

CheckpointOnDisk open(const fs::path& dir) {
  auto c = find_checkpoint(dir, std::nullopt);
  EXPECT_TRUE(c.has_value()) << dir;
  return *c;
}

std::map<std::string, Tensor> everything(const fs::path& dir) {
  const MergedCheckpoint m = merge_checkpoint(open(dir), true);
  std::map<std::string, Tensor> out;
  for (const auto& [n, t] : m.model) out["model/" + n] = t;
  for (const auto& [kind, ts] : m.optimizer)
    for (const auto& [n, t] : ts) out[kind + "/" + n] = t;
  Tensor step = Tensor::empty({}, DType::I64);
  *step.data<int64_t>() = m.optimizer_step;
  out["step"] = step;
  return out;
}

void expect_same(const fs::path& got_dir, const fs::path& ref_dir, const std::string& what) {
  const auto got = everything(got_dir), ref = everything(ref_dir);
  EXPECT_EQ(got.size(), ref.size()) << what;
  for (const auto& [n, t] : ref) {
    auto it = got.find(n);
    ASSERT_NE(it, got.end()) << what << ": " << n;
    EXPECT_TRUE(bit_equal(it->second, t)) << what << ": " << n;
  }
  const CheckpointState a = open(got_dir).state, b = open(ref_dir).state;
  EXPECT_EQ(a.iteration, b.iteration) << what;
  EXPECT_EQ(a.consumed_train_samples, b.consumed_train_samples) << what;
  EXPECT_EQ(a.consumed_valid_samples, b.consumed_valid_samples) << what;
  EXPECT_EQ(a.scheduler_num_steps, b.scheduler_num_steps) << what;
  EXPECT_EQ(a.scheduler.max_lr, b.scheduler.max_lr) << what;
  EXPECT_EQ(a.scheduler.min_lr, b.scheduler.min_lr) << what;
  EXPECT_EQ(a.scheduler.lr_decay_steps, b.scheduler.lr_decay_steps) << what;
  EXPECT_EQ(a.scheduler.decay_style, b.scheduler.decay_style) << what;
  EXPECT_EQ(a.grad_scaler.scale, b.grad_scaler.scale) << what;
  EXPECT_EQ(a.grad_scaler.growth_tracker, b.grad_scaler.growth_tracker) << what;
  ASSERT_TRUE(a.rng && b.rng) << what;
  EXPECT_EQ(a.rng->seed, b.rng->seed) << what;
  EXPECT_EQ(a.rng->dropout_offset, b.rng->dropout_offset) << what;
  EXPECT_EQ(a.optimizer_type, b.optimizer_type) << what;
}

ConvertResult convert(const fs::path& from, const fs::path& to, int tp, int pp, const std::string& format,
                      int lpvs = 0, const std::string& impl = "transformer_engine") {
  ConvertOptions o;
  o.load = from;
  o.save = to;
  o.target_tp = tp;
  o.target_pp = pp;
  o.target_layers_per_virtual_stage = lpvs;
  o.save_format = format;
  o.transformer_impl = impl;
  return convert_checkpoint(o);
}

// The reference script's check of written folders ("DIR ITER T P V IMPL DTYPE" each): one JSON
// object per rank file.
std::vector<json> torch_check(const std::string& specs) {
  const auto r = mt::run_command("/usr/bin/python3 " +
                                 (mt::source_dir() / "tests/reference/megatron_checkpoint.py").string() +
                                 " check" + specs + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<json> out;
  std::istringstream in(r.output);
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << line;
    if (!j.is_discarded()) out.push_back(j);
  }
  return out;
}

struct Layout {
  int tp, pp, lpvs;
  std::string impl;
};

void write_and_check(const std::string& dtype, const std::vector<Layout>& layouts) {
  mt::TempDir tmp;
  write_corpus((tmp / "corpus").string());
  TrainingArgs a = tiny_gpt_args(tmp.path(), 8);
  a.model.num_layers = 4;
  a.save = (tmp / "ours").string();
  a.save_interval = 1000;
  a.exit_interval = 3;
  a.bf16 = dtype == "bf16";
  a.fp16 = dtype == "fp16";
  a.model.params_dtype = a.bf16 ? DType::BF16 : a.fp16 ? DType::F16 : DType::F32;
  ASSERT_EQ(run_single(a).iterations, 3);
  auto folder = [&](const Layout& l) { return tmp / str("torch_", l.tp, "_", l.pp, "_", l.lpvs, "_", l.impl); };
  auto chunks = [](const Layout& l) { return l.lpvs > 0 ? 4 / l.pp / l.lpvs : 1; };
  std::string specs;
  for (const Layout& l : layouts) {
    const ConvertResult r = convert(tmp / "ours", folder(l), l.tp, l.pp, "torch", l.lpvs, l.impl);
    EXPECT_EQ(r.num_files, size_t(l.tp * l.pp));
    specs += str(" ", folder(l).string(), " 3 ", l.tp, " ", l.pp, " ", chunks(l), " ", l.impl, " ", dtype);
  }
  const std::vector<json> all_ranks = torch_check(specs);  // one Python start for every layout
  for (const Layout& l : layouts) {
    const std::string what = str(dtype, " TP", l.tp, " PP", l.pp, " lpvs ", l.lpvs, " ", l.impl);
    SCOPED_TRACE(what);
    const fs::path torch = folder(l);
    const int vp = chunks(l);
    std::vector<json> ranks;
    for (const json& j : all_ranks)
      if (j["folder"] == torch.string()) ranks.push_back(j);
    ASSERT_EQ(ranks.size(), size_t(l.tp * l.pp));
    for (const json& j : ranks) {
      SCOPED_TRACE(j["rank"].get<std::string>());
      std::vector<std::string> keys = {"args", "checkpoint_version", "iteration", "opt_param_scheduler",
                                       "optimizer", "rng_state"};
      if (vp == 1) keys.push_back("model");
      for (int c = 0; c < vp && vp > 1; ++c) keys.push_back("model" + std::to_string(c));
      std::sort(keys.begin(), keys.end());
      EXPECT_EQ(j["keys"].get<std::vector<std::string>>(), keys);
      EXPECT_EQ(j["checkpoint_version"].get<double>(), 3.0);
      EXPECT_EQ(j["iteration"].get<int64_t>(), 3);
      const json& args = j["args"];
      EXPECT_EQ(args["num_layers"], 4);
      EXPECT_EQ(args["ffn_hidden_size"], 128);
      EXPECT_EQ(args["kv_channels"], 8);
      EXPECT_EQ(args["tensor_model_parallel_size"], l.tp);
      EXPECT_EQ(args["pipeline_model_parallel_size"], l.pp);
      EXPECT_EQ(args["padded_vocab_size"], 64);
      EXPECT_EQ(args["consumed_train_samples"], 24);
      EXPECT_EQ(args["tokenizer_type"], "NullTokenizer");
      EXPECT_EQ(args["transformer_impl"], l.impl);
      if (vp > 1) {
        EXPECT_EQ(args["virtual_pipeline_model_parallel_size"], vp);
      }
      EXPECT_EQ(j["params_dtype"], dtype == "bf16" ? "torch.bfloat16" : dtype == "fp16" ? "torch.float16"
                                                                                          : "torch.float32");
      EXPECT_EQ(j["groups"].size(), 2u);
      EXPECT_GT(j["groups"][0].get<int>(), 0);
      EXPECT_GT(j["groups"][1].get<int>(), 0);
      EXPECT_EQ(j["steps"], json::array({3.0}));
      // Transformer Engine's FusedAdam keeps the step per group (and refuses one per parameter:
      // the reference checks its load_state_dict's rule); torch's AdamW per parameter, and it
      // took a step from this state.
      EXPECT_EQ(j["step_per"], l.impl == "transformer_engine" ? "group" : "param");
      EXPECT_EQ(j["scheduler"]["num_steps"], 24);
      EXPECT_EQ(j["rng_equal"], json::array({true, true, true}));
      EXPECT_FALSE(j["weights_only"].is_boolean() && !j["weights_only"].get<bool>());
    }
    // Read directly, and converted back to our format: the original bit for bit.
    expect_same(torch, tmp / "ours", what + " (torch folder)");
    convert(torch, tmp / ("back_" + torch.filename().string()), 1, 1, "safetensors");
    expect_same(tmp / ("back_" + torch.filename().string()), tmp / "ours", what + " (converted back)");
  }
}

TEST(MegatronCheckpointWrite, Float32TensorAndPipelineParallel) {
  write_and_check("fp32", {{2, 2, 0, "transformer_engine"}, {2, 1, 0, "local"}});
}

TEST(MegatronCheckpointWrite, Bfloat16VirtualPipelineStages) {
  write_and_check("bf16", {{1, 2, 1, "transformer_engine"}});
}

TEST(MegatronCheckpointWrite, Float16WithTheLossScaler) { write_and_check("fp16", {{2, 1, 0, "local"}}); }

// Resuming from a checkpoint written in Megatron's format follows the curve of resuming from ours.
TEST(MegatronCheckpointWrite, ATorchCheckpointResumesTheSameCurve) {
  mt::TempDir tmp;
  write_corpus((tmp / "corpus").string());
  TrainingArgs a = tiny_gpt_args(tmp.path(), 8);
  a.save = (tmp / "ours").string();
  a.save_interval = 1000;
  a.exit_interval = 4;
  ASSERT_EQ(run_single(a).iterations, 4);
  TrainingArgs resume = a;
  resume.exit_interval = 0;
  resume.save = "";
  resume.load = (tmp / "ours").string();
  const TrainingSummary ref = run_single(resume);
  ASSERT_EQ(ref.losses.size(), 4u);
  convert(tmp / "ours", tmp / "torch", 1, 1, "torch", 0, "local");
  resume.load = (tmp / "torch").string();
  const TrainingSummary got = run_single(resume);
  EXPECT_EQ(got.start_iteration, 4);
  EXPECT_EQ(got.consumed_samples, ref.consumed_samples);
  ASSERT_EQ(got.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(got.losses[i], ref.losses[i]) << "iteration " << i + 5;
  // --finetune takes the weights only.
  resume.finetune = true;
  const TrainingSummary ft = run_single(resume);
  EXPECT_EQ(ft.start_iteration, 0);
}

// save_torch_checkpoint (pretrain-gpt --ckpt-format torch): save_checkpoint's inputs, Megatron's
// files out, equal to the live model and optimizer.
TEST(MegatronCheckpointWrite, SaveTorchCheckpointWritesTheLiveState) {
  mt::TempDir tmp;
  TrainingArgs a = tiny_gpt_args(tmp.path(), 1);
  a.model.padded_vocab_size = 64;
  model::GPTModel gpt(a.model, 7);
  model::ParameterList params = gpt.parameters();
  optim::Optimizer opt(params, a.optimizer);
  for (size_t i = 0; i < params.size(); ++i) {
    opt.state()[i].exp_avg.fill_(0.001 * double(i + 1));
    opt.state()[i].exp_avg_sq.fill_(1e-6 * double(i + 1));
  }
  opt.set_step_count(5);
  CheckpointState st;
  st.iteration = 5;
  st.consumed_train_samples = 40;
  st.scheduler.max_lr = 3e-3;
  st.scheduler.lr_decay_steps = 100;
  st.scheduler_num_steps = 40;
  st.rng = RngState{1234, 20};
  st.optimizer_type = "adam";
  st.args = training_args_to_json(a);
  const fs::path dir = save_torch_checkpoint(tmp / "save", st, params, &opt);
  EXPECT_EQ(dir, tmp / "save" / "iter_0000005");
  EXPECT_TRUE(fs::exists(dir / "mp_rank_00" / kTorchCheckpointFile));
  EXPECT_FALSE(fs::exists(tmp / "save" / ".torch_staging"));
  EXPECT_EQ(mt::read_file(tmp / "save" / "latest_checkpointed_iteration.txt"), "5");
  const CheckpointOnDisk c = open(tmp / "save");
  EXPECT_EQ(c.format, "torch");
  EXPECT_EQ(c.state.rng->dropout_offset, 20u);
  const MergedCheckpoint m = merge_checkpoint(c, true);
  EXPECT_EQ(m.optimizer_step, 5);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(bit_equal(m.model.at(params[i]->name), params[i]->value)) << params[i]->name;
    EXPECT_TRUE(bit_equal(m.optimizer.at("exp_avg").at(params[i]->name), opt.state()[i].exp_avg));
  }
}

// Every norm and activation kind of the layer table, with and without biases (Megatron names the
// GeLU forms through bias_gelu_fusion / openai_gelu, which depend on the biases): written in the
// torch format it reads back as the same kind, or the save stops with an error naming the kind.
// Never another kind: a kind Megatron-LM has no argument for would load there as a different model.
TEST(MegatronCheckpointWrite, EveryLayerKindReadsBackAsItselfOrIsRefusedByName) {
  int written = 0;
  for (const model::NormKind& norm : model::kNormKinds)
    for (const model::ActivationKind& act : model::kActivationKinds)
      for (const bool bias : {true, false}) {
        const std::string what =
            std::string(norm.name) + " + " + act.name + (bias ? "" : ", no biases");
        mt::TempDir tmp;
        TrainingArgs a = tiny_gpt_args(tmp.path(), 1);
        a.model.padded_vocab_size = 64;
        a.model.normalization = norm.name;
        a.model.activation = act.name;
        a.model.add_bias_linear = bias;
        model::GPTModel gpt(a.model, 7);
        model::ParameterList params = gpt.parameters();
        CheckpointState st;
        st.iteration = 1;
        st.scheduler.max_lr = 3e-3;
        st.scheduler.lr_decay_steps = 10;
        st.args = training_args_to_json(a);
        try {
          save_torch_checkpoint(tmp / "save", st, params, nullptr);
        } catch (const Error& e) {
          const std::string msg = e.what();
          EXPECT_TRUE(msg.find(std::string("'") + act.name + "'") != std::string::npos ||
                      msg.find(std::string("'") + norm.name + "'") != std::string::npos)
              << what << ": " << msg;
          EXPECT_FALSE(fs::exists(tmp / "save" / "latest_checkpointed_iteration.txt")) << what;
          continue;
        }
        ++written;
        const TrainingArgs back = training_args_from_json(open(tmp / "save").state.args);
        EXPECT_EQ(back.model.normalization, norm.name) << what;
        EXPECT_EQ(back.model.activation, act.name) << what;
        EXPECT_EQ(back.model.add_bias_linear, bias) << what;
      }
  // Megatron-LM has an argument for every kind this build has today.
  EXPECT_EQ(written, int(2 * model::kNormKindCount * model::kActivationKindCount));
}

TEST(MegatronCheckpointWrite, TheCommandLineConvertsBothWays) {
  mt::TempDir tmp;
  write_corpus((tmp / "corpus").string());
  TrainingArgs a = tiny_gpt_args(tmp.path(), 8);
  a.save = (tmp / "ours").string();
  a.save_interval = 1000;
  a.exit_interval = 2;
  ASSERT_EQ(run_single(a).iterations, 2);
  const auto to = mt::run_cli("checkpoint convert --load " + (tmp / "ours").string() + " --save " +
                              (tmp / "mlm").string() +
                              " --save-format torch --transformer-impl local --target-tensor-parallel-size 2 2>&1");
  ASSERT_EQ(to.exit_code, 0) << to.output;
  EXPECT_NE(to.output.find("to TP=2 x PP=1"), std::string::npos) << to.output;
  EXPECT_NE(to.output.find("--ckpt-format torch"), std::string::npos) << to.output;
  EXPECT_TRUE(fs::exists(tmp / "mlm" / "iter_0000002" / "mp_rank_01" / kTorchCheckpointFile));
  const auto back = mt::run_cli("checkpoint convert --load " + (tmp / "mlm").string() + " --save " +
                                (tmp / "back").string() + " --load-format torch 2>&1");
  ASSERT_EQ(back.exit_code, 0) << back.output;
  EXPECT_NE(back.output.find("from TP=2 x PP=1"), std::string::npos) << back.output;
  expect_same(tmp / "back", tmp / "ours", "command line");
  const auto bad = mt::run_cli("checkpoint convert --load " + (tmp / "ours").string() + " --save " +
                               (tmp / "x").string() + " --save-format pickle 2>&1");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--save-format"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace megatron::training
