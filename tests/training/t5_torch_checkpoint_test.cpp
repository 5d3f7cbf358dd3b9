// T5 checkpoints in Megatron-LM's torch format and resharded: folders written by Debian's torch
// in the structure of Megatron-Core's T5Model (tests/reference/megatron_t5_checkpoint.py: TP2,
// the local layer spec with the relative position bias and Adam state, and the Transformer Engine
// spec with learned absolute positions and an untied output layer) are read bit for bit and give
// the loss of the float64 reference (tests/reference/t5_reference.py) on the merged weights; the
// TP2 -> TP1 and TP1 -> TP2 conversions move the cross-attention weights (column-parallel
// linear_q and linear_kv, row-parallel linear_proj) and keep the relative bias whole on every
// rank, with the same loss; our .pt files load into that script's module trees (strict state
// dicts, Adam over Megatron's parameter groups) and equal Megatron's files tensor for tensor;
// pretrain-t5 --load trains on from them as from the same weights in our format; what is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "interop/checkpoint_test_util.h"
#include "model/t5_model.h"
#include "parallel_test_util.h"
#include "test_util.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"
#include "training/hf_checkpoint.h"
#include "training/torch_checkpoint.h"

namespace megatron::training {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using interop_testing::bit_equal;
using interop_testing::everything;
using interop_testing::expect_bit_equal;

const char* const kVariants[] = {"t5_local_relative", "t5_te_absolute_untied"};

std::string reference(const std::string& args) {
  const auto r = mt::run_command("/usr/bin/python3 " +
                                 (mt::source_dir() / "tests/reference/megatron_t5_checkpoint.py").string() +
                                 " " + args + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

const fs::path& variants() {
  static mt::TempDir dir;
  static bool made = false;
  if (!made) {
    reference("make " + dir.path().string());
    made = true;
  }
  return dir.path();
}

ConvertResult convert(const fs::path& from, const fs::path& to, int tp, const std::string& format,
                      const std::string& impl = "transformer_engine", int pp = 1) {
  // 60 tokens and the null tokenizer's EOD: 64 rows under TP 1 and 2.
  return interop_testing::convert_to(from, to, tp, pp, format, impl, 61);
}

template <typename T>
std::vector<T> read_values(std::ifstream& f, int64_t n) {
  std::vector<T> v(static_cast<size_t>(n), T{});
  f.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * int64_t(sizeof(T))));
  return v;
}

// The loss sum of `weights` (single-rank tensors under our names) in the checkpoint's model on
// the variant's batch (loss/batch.bin); *ref gets t5_reference.py's float64 sum (loss/out.bin).
double loss_of(const model::TransformerConfig& cfg, const std::map<std::string, Tensor>& weights,
               const fs::path& variant, double* ref) {
  const int64_t b = 2, se = cfg.seq_length, sd = cfg.decoder_seq_length;
  std::ifstream f(variant / "loss" / "batch.bin", std::ios::binary);
  model::Batch in;
  in.encoder_tokens = Tensor::from_vector(read_values<int32_t>(f, b * se), {b, se});
  in.encoder_padding_mask = Tensor::from_vector(read_values<int32_t>(f, b * se), {b, se});
  in.tokens = Tensor::from_vector(read_values<int32_t>(f, b * sd), {b, sd});
  in.labels = Tensor::from_vector(read_values<int32_t>(f, b * sd), {b, sd});
  in.loss_mask = Tensor::from_vector(read_values<float>(f, b * sd), {b, sd});
  EXPECT_TRUE(f.good());
  std::ifstream o(variant / "loss" / "out.bin", std::ios::binary);
  const std::vector<double> out = read_values<double>(o, 2);
  *ref = out[0];
  model::T5Model m(cfg, 1, model::TensorParallel::none());
  size_t used = 0;
  for (model::Parameter* p : m.parameters()) {
    auto it = weights.find(p->name);
    EXPECT_NE(it, weights.end()) << p->name;
    if (it == weights.end()) return 0;
    p->value.copy_(it->second);
    ++used;
  }
  EXPECT_EQ(used, weights.size());
  const model::LossResult r = m.forward_backward(in, 1.0f, 0);
  EXPECT_EQ(r.num_tokens, out[1]);
  return r.loss_sum;
}

model::TransformerConfig config_of(const CheckpointOnDisk& c) {
  return training_args_from_json(c.state.args).model;
}

TEST(T5TorchCheckpoint, MegatronCoresFilesReadBitForBitWithTheReferenceLoss) {
  for (const std::string name : kVariants) {
    SCOPED_TRACE(name);
    const fs::path dir = variants() / name;
    const CheckpointOnDisk c = find_checkpoint(dir / "megatron", std::nullopt).value();
    EXPECT_EQ(c.format, "torch");
    EXPECT_EQ(c.state.iteration, 10);
    EXPECT_EQ(c.parallel.tensor_model_parallel_size, 2);
    const TrainingArgs a = training_args_from_json(c.state.args);
    EXPECT_EQ(a.model.model_family, "t5");
    EXPECT_EQ(a.model.num_layers, 2);
    EXPECT_EQ(a.model.decoder_layers(), 3);
    EXPECT_EQ(a.model.seq_length, 12);
    EXPECT_EQ(a.model.decoder_seq_length, 8);
    EXPECT_EQ(a.tokenizer.vocab_extra_ids, 10);
    const bool relative = name == "t5_local_relative";
    EXPECT_EQ(a.model.position_embedding_type, relative ? "relative" : "learned_absolute");
    if (relative) {
      EXPECT_EQ(a.model.relative_attention_num_buckets, 8);
      EXPECT_EQ(a.model.relative_attention_max_distance, 6);
    }
    EXPECT_EQ(c.state.optimizer_type, relative ? "adam" : "");
    const MergedCheckpoint m = merge_checkpoint(c, true);
    expect_bit_equal(everything(m), read_safetensors(dir / "reference.safetensors").tensors, name);
    double ref = 0;
    const double got = loss_of(a.model, m.model, dir, &ref);
    EXPECT_NEAR(got, ref, 1e-5 * std::abs(ref));
  }
}

// TP2 (Megatron's files) -> TP2 in our format -> TP1 -> TP2 again.
TEST(T5TorchCheckpoint, TensorParallelConversionMovesCrossAttentionAndRelativeBias) {
  for (const std::string name : kVariants) {
    SCOPED_TRACE(name);
    mt::TempDir tmp;
    const fs::path dir = variants() / name;
    const auto ref = read_safetensors(dir / "reference.safetensors").tensors;
    convert(dir / "megatron", tmp / "tp2", 2, "safetensors");
    // Each rank holds its heads' rows of the cross-attention's query and key/value projections,
    // its columns of the output projection, and the whole relative bias.
    for (int t = 0; t < 2; ++t) {
      const auto shard = read_safetensors(tmp / "tp2" / "iter_0000010" / str("mp_rank_0", t) / "model.safetensors").tensors;
      const std::string x = "decoder.layers.2.cross_attention.";
      const Tensor& kv = ref.at("model/" + x + "linear_kv.weight");
      EXPECT_TRUE(bit_equal(shard.at(x + "linear_kv.weight"), kv.narrow(0, t * 32, 32).contiguous()));
      const Tensor& q = ref.at("model/" + x + "linear_q.bias");
      EXPECT_TRUE(bit_equal(shard.at(x + "linear_q.bias"), q.narrow(0, t * 16, 16).contiguous()));
      const Tensor& proj = ref.at("model/" + x + "linear_proj.weight");
      EXPECT_TRUE(bit_equal(shard.at(x + "linear_proj.weight"), proj.narrow(1, t * 16, 16).contiguous()));
      if (name == "t5_local_relative")
        for (const char* side : {"encoder", "decoder"}) {
          const std::string rb = std::string(side) + "_relative_pos_emb.relative_attention_bias.weight";
          EXPECT_TRUE(bit_equal(shard.at(rb), ref.at("model/" + rb))) << rb;
        }
    }
    convert(tmp / "tp2", tmp / "tp1", 1, "safetensors");
    const CheckpointOnDisk tp1 = find_checkpoint(tmp / "tp1", std::nullopt).value();
    EXPECT_EQ(tp1.parallel.tensor_model_parallel_size, 1);
    model::T5Model m(config_of(tp1), 1, model::TensorParallel::none());
    load_model_weights(tp1, m.parameters(), false);
    std::map<std::string, Tensor> loaded;
    for (model::Parameter* p : m.parameters()) loaded[p->name] = p->value;
    double want = 0;
    const double got = loss_of(config_of(tp1), loaded, dir, &want);
    EXPECT_NEAR(got, want, 1e-5 * std::abs(want));
    // TP1 -> TP2: the shards merge back to Megatron's tensors.
    convert(tmp / "tp1", tmp / "tp2_again", 2, "safetensors");
    const CheckpointOnDisk again = find_checkpoint(tmp / "tp2_again", std::nullopt).value();
    EXPECT_EQ(again.parallel.tensor_model_parallel_size, 2);
    expect_bit_equal(everything(merge_checkpoint(again, true)), ref, name + " TP1 -> TP2");
  }
}

TEST(T5TorchCheckpoint, WrittenFilesLoadIntoMegatronCoresT5ModelAsMegatronsOwn) {
  for (const std::string name : kVariants) {
    SCOPED_TRACE(name);
    mt::TempDir tmp;
    const fs::path dir = variants() / name;
    const std::string impl = name == "t5_local_relative" ? "local" : "transformer_engine";
    convert(dir / "megatron", tmp / "ours", 1, "safetensors");
    convert(tmp / "ours", tmp / "pt", 2, "torch", impl);
    const std::string out = reference("check " + (tmp / "pt").string() + " 10 " + dir.string());
    std::istringstream lines(out);
    int ranks = 0;
    for (std::string line; std::getline(lines, line);) {
      if (line.empty() || line[0] != '{') continue;
      const auto j = nlohmann::json::parse(line);
      EXPECT_TRUE(j.at("problems").empty()) << line;
      EXPECT_GT(j.at("tensors").get<int>(), 80) << line;
      ++ranks;
    }
    EXPECT_EQ(ranks, 2) << out;
    // And they read back bit for bit.
    const CheckpointOnDisk pt = find_checkpoint(tmp / "pt", std::nullopt).value();
    expect_bit_equal(everything(merge_checkpoint(pt, true)),
                     read_safetensors(dir / "reference.safetensors").tensors, name + " written");
  }
}

// pretrain-t5 on --mock-data resuming from `load` (the fixture's run: iteration 10 of 20, its
// schedule and Adam state).
TrainingArgs resume_args(const fs::path& load) {
  const CheckpointOnDisk c = find_checkpoint(load, std::nullopt).value();
  TrainingArgs a = training_args_from_json(c.state.args);
  a.load = load.string();
  a.use_checkpoint_opt_param_scheduler = true;
  a.no_load_rng = true;  // the fixture has no rng_state (dropout is off)
  a.save.clear();
  a.mock_data = true;
  a.data.data_path.clear();
  a.log_interval = 1000;
  a.eval_interval = 1000;
  a.eval_iters = 1;
  a.tokenizer.type = "NullTokenizer";
  a.tokenizer.vocab_size = 60;
  return a;
}

// pretrain-t5 --load of Megatron's .pt files (here one rank's, written from the fixture's weights)
// trains exactly as --load of the same weights and optimizer state in our format.
TEST(T5TorchCheckpoint, PretrainT5ResumesFromThemAsFromOurOwn) {
  mt::TempDir tmp;
  const fs::path dir = variants() / "t5_local_relative";
  convert(dir / "megatron", tmp / "ours", 1, "safetensors");
  convert(tmp / "ours", tmp / "pt", 1, "torch", "local");
  TrainingArgs a = resume_args(tmp / "pt");
  a.train_iters = 13;
  const TrainingSummary from_pt = parallel_test::run_single(a);
  a.load = (tmp / "ours").string();
  const TrainingSummary from_ours = parallel_test::run_single(a);
  ASSERT_EQ(from_pt.losses.size(), 3u);
  EXPECT_EQ(from_pt.start_iteration, 10);
  EXPECT_EQ(from_pt.losses, from_ours.losses);
}

// pretrain-t5 --ckpt-format torch: saved as Megatron's files, --load of them continues the
// uninterrupted run bit for bit (dropout on: its RNG state travels in the files).
TEST(T5TorchCheckpoint, PretrainT5SavesMegatronFilesAndResumesExactly) {
  mt::TempDir tmp;
  TrainingArgs a = parallel_test::tiny_gpt_args(tmp.path(), 8);
  a.data.data_path.clear();
  a.mock_data = true;
  a.model.model_family = "t5";
  a.model.num_layers = 1;
  a.model.decoder_num_layers = 2;
  a.model.seq_length = 16;
  a.model.decoder_seq_length = 8;
  a.model.max_position_embeddings = 16;
  a.model.untie_embeddings_and_output_weights = true;
  a.model.hidden_dropout = 0.1f;
  a.tokenizer.vocab_size = 120;
  a.tokenizer.vocab_extra_ids = 20;
  a.ckpt_format = "torch";
  a.save_interval = 4;
  TrainingArgs full = a, first = a, second = a;
  full.save = (tmp / "full").string();
  first.save = second.load = second.save = (tmp / "resume").string();
  first.exit_interval = 4;
  const TrainingSummary whole = parallel_test::run_single(full);
  parallel_test::run_single(first);
  EXPECT_TRUE(fs::exists(tmp / "resume" / "iter_0000004" / "mp_rank_00" / "model_optim_rng.pt"));
  const TrainingSummary rest = parallel_test::run_single(second);
  EXPECT_EQ(rest.start_iteration, 4);
  ASSERT_EQ(whole.losses.size(), 8u);
  EXPECT_EQ(rest.losses, std::vector<double>(whole.losses.begin() + 4, whole.losses.end()));
  const auto end_of = [&](const char* run) {
    return everything(merge_checkpoint(find_checkpoint(tmp / run, 8).value(), true));
  };
  expect_bit_equal(end_of("resume"), end_of("full"), "final parameters and optimizer state");
}

// Megatron's TP2 files, loaded by a TP2 run (x DP2 on 4 ranks) with their Adam state, follow the
// single-rank run resumed from the same checkpoint converted to TP1.
TEST(MpiT5TorchCheckpoint, MegatronsTensorParallelFilesResumeOnTheSingleRankCurve) {
  using namespace parallel_test;
  SKIP_ON_ONE_RANK();
  SharedDir shared;
  const fs::path dir = shared.path() / "t5_local_relative";
  if (world()->rank() == 0) {
    reference("make " + shared.path().string());
    convert(dir / "megatron", shared.path() / "tp1", 1, "safetensors");
  }
  world()->barrier();
  TrainingArgs ref_args = resume_args(shared.path() / "tp1");
  ref_args.train_iters = 16;
  TrainingSummary ref;
  std::string text;
  if (world()->rank() == 0) {
    ref = run_single(ref_args);
    text = nlohmann::json({{"losses", ref.losses}, {"grad_norms", ref.grad_norms},
                           {"valid_losses", ref.valid_losses}}).dump();
  }
  const auto j = nlohmann::json::parse(all_gather_strings(*world(), text)[0]);
  ref.losses = j["losses"].get<std::vector<double>>();
  ref.grad_norms.clear();
  for (const auto& g : j["grad_norms"]) ref.grad_norms.push_back(g.is_number() ? g.get<double>() : std::nan(""));
  ref.valid_losses = j["valid_losses"].get<std::vector<double>>();
  ASSERT_EQ(ref.losses.size(), 6u);
  TrainingArgs par = resume_args(dir / "megatron");
  par.train_iters = 16;
  par.parallel.tensor_model_parallel_size = 2;
  const TrainingSummary got = pretrain(par);
  EXPECT_EQ(got.start_iteration, 10);
  expect_same_curve(got, ref, 1e-5, str("TP2 on ", world()->size(), " ranks"));
}

TEST(T5TorchCheckpoint, RefusesWhatHasNoMegatronForm) {
  mt::TempDir tmp;
  const fs::path dir = variants() / "t5_local_relative";
  convert(dir / "megatron", tmp / "ours", 1, "safetensors");
  const std::string pp = mt::error_of([&] { convert(tmp / "ours", tmp / "pp2", 1, "torch", "local", 2); });
  EXPECT_NE(pp.find("T5"), std::string::npos) << pp;
  EXPECT_NE(pp.find("--target-pipeline-parallel-size 1"), std::string::npos) << pp;
  const std::string hf = mt::error_of([&] { convert(tmp / "ours", tmp / "hf", 1, "hf"); });
  EXPECT_NE(hf.find("RMSNorm without bias"), std::string::npos) << hf;
  EXPECT_NE(hf.find("no configuration maps exactly"), std::string::npos) << hf;
  fs::create_directories(tmp / "hf_t5");
  mt::write_file(tmp / "hf_t5" / "config.json", R"({"model_type": "t5", "d_model": 32})");
  ConvertOptions o;
  o.load = tmp / "hf_t5";
  o.save = tmp / "from_hf";
  o.load_format = "hf";
  const std::string imp = mt::error_of([&] { convert_checkpoint(o); });
  EXPECT_NE(imp.find("cannot import transformers' T5"), std::string::npos) << imp;
}

}  // namespace
}  // namespace megatron::training
