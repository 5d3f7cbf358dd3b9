// `megatron checkpoint convert` (training/checkpoint_convert.h): the shard rules; round trips
// TP1 -> TP2 -> TP1, TP1 -> TP2xPP2 -> TP1 and TP2xPP2 -> TP1xPP2 -> TP1 bit-exact on every model
// and optimizer tensor (fp32 with the plain optimizer; bf16 with distributed-optimizer shards);
// TP2 shards equal to model::shard_along of the single-rank tensors; pipeline stages built by
// GPTModel chunks load the PP2 files; a converted checkpoint resumes the same loss curve bit for bit as
// the unconverted one (one process); --no-save-optim; errors naming the problem; the CLI.
// MpiCheckpointConvert (mpirun -np 2 / 4, label mpi): a TP1 checkpoint converted to TP2 resumes
// under TP2 (x DP2 at -np 4) on the single-rank resume's curve, and a TP2 checkpoint converted to
// TP1 resumes on one rank on the TP2 resume's curve (within 1e-5: only the reduction order differs);
// the same both ways between one rank and PP2 (TP2 x PP2 at -np 4) where pretrain-gpt has pipeline
// parallelism (it skips itself otherwise).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "data/indexed_dataset.h"
#include "inference/checkpoint_weights.h"
#include "model/gpt_model.h"
#include "model/stage_model.h"
#include "model/tensor_parallel.h"
#include "test_util.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"
#include "training/trainer.h"
#include "parallel_test_util.h"

namespace megatron::training {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using parallel_test::run_single;
using parallel_test::SharedDir;
using parallel_test::tiny_gpt_args;
using parallel_test::world;
using parallel_test::write_corpus;

// The parallel tests' tiny GPT, saving only when asked to (--exit-interval, the end).
TrainingArgs tiny_args(const fs::path& dir, int64_t iters) {
  TrainingArgs a = tiny_gpt_args(dir, iters);
  a.save_interval = 1000;
  return a;
}

ConvertResult convert(const fs::path& from, const fs::path& to, int tp, int pp,
                      bool drop_optimizer = false) {
  ConvertOptions o;
  o.load = from;
  o.save = to;
  o.target_tp = tp;
  o.target_pp = pp;
  o.drop_optimizer = drop_optimizer;
  return convert_checkpoint(o);
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

CheckpointOnDisk open(const fs::path& dir) {
  auto c = find_checkpoint(dir, std::nullopt);
  EXPECT_TRUE(c.has_value()) << dir;
  return *c;
}

// Every tensor of a checkpoint, merged to single-rank tensors: "model/<name>", "<kind>/<name>"
// for the optimizer state, and "step".
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

void expect_bit_equal(const std::map<std::string, Tensor>& got,
                      const std::map<std::string, Tensor>& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (const auto& [n, t] : ref) {
    auto it = got.find(n);
    ASSERT_NE(it, got.end()) << what << ": " << n;
    EXPECT_TRUE(bit_equal(it->second, t)) << what << ": " << n;
  }
}

// The tensors of one safetensors file of an iteration folder.
std::map<std::string, Tensor> file_tensors(const fs::path& iter_dir, const std::string& rel) {
  return read_safetensors(iter_dir / rel).tensors;
}

// ---------------------------------------------------------------------------------------------

TEST(CheckpointConvert, ShardRulesSplitAndMerge) {
  std::vector<float> v(8 * 6);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  const Tensor full = Tensor::from_vector(v, {8, 6});
  for (int dim : {0, 1}) {
    ShardRule r;
    r.dim = dim;
    std::vector<Tensor> shards;
    for (int k = 0; k < 2; ++k) {
      shards.push_back(split_shard(full, r, k, 2));
      EXPECT_TRUE(bit_equal(shards.back(), model::shard_along(full, dim, k, 2)));
    }
    EXPECT_TRUE(bit_equal(merge_shards(shards, r), full)) << dim;
  }
  // SwiGLU fc1: rows [gate 0..3; up 4..7]; TP rank 1 of 2 holds gate rows 2, 3 and up rows 6, 7.
  model::TransformerConfig swiglu;
  swiglu.num_layers = 1;
  swiglu.activation = "swiglu";
  const auto specs = config_weight_specs(swiglu);
  ShardRule sw = shard_rule(specs.at("decoder.layers.0.mlp.linear_fc1.weight"));
  EXPECT_EQ(sw.dim, 0);
  EXPECT_EQ(sw.parts, 2);
  const Tensor s1 = split_shard(full, sw, 1, 2);
  ASSERT_EQ(s1.shape(), (Shape{4, 6}));
  EXPECT_EQ(s1.narrow(0, 0, 1).to_float_vector(), full.narrow(0, 2, 1).to_float_vector());
  EXPECT_EQ(s1.narrow(0, 2, 1).to_float_vector(), full.narrow(0, 6, 1).to_float_vector());
  EXPECT_TRUE(bit_equal(merge_shards({split_shard(full, sw, 0, 2), s1}, sw), full));
  // Replicated: rank 0's.
  EXPECT_TRUE(bit_equal(merge_shards({full, Tensor::zeros({8, 6}, DType::F32)}, ShardRule{}), full));
  // The model's specs when a checkpoint records none (format 2, Megatron's and HF files).
  model::TransformerConfig gpt;
  gpt.num_layers = 4;
  const auto g = config_weight_specs(gpt);
  EXPECT_EQ(shard_rule(g.at("decoder.layers.3.self_attention.linear_qkv.weight")).dim, 0);
  EXPECT_EQ(shard_rule(g.at("decoder.layers.3.self_attention.linear_proj.weight")).dim, 1);
  EXPECT_EQ(shard_rule(g.at("decoder.layers.3.self_attention.linear_proj.bias")).dim, -1);
  EXPECT_EQ(shard_rule(g.at("decoder.layers.3.input_layernorm.weight")).dim, -1);
  EXPECT_TRUE(shard_rule(g.at("embedding.word_embeddings.weight")).vocab);
  EXPECT_FALSE(shard_rule(g.at("embedding.position_embeddings.weight")).vocab);
  EXPECT_EQ(shard_rule(g.at("decoder.layers.0.mlp.linear_fc1.weight")).parts, 1);
  // Re-padding: cut, repeat the last row, or zeros.
  const Tensor longer = repad_rows(full, 10, false), zeros = repad_rows(full, 10, true);
  ASSERT_EQ(longer.size(0), 10);
  EXPECT_EQ(longer.narrow(0, 9, 1).to_float_vector(), full.narrow(0, 7, 1).to_float_vector());
  EXPECT_EQ(zeros.narrow(0, 8, 2).to_float_vector(), std::vector<float>(12, 0.0f));
  EXPECT_TRUE(bit_equal(repad_rows(longer, 8, false), full));
}

struct Source {
  std::string name;
  bool bf16, distributed;
};

TEST(CheckpointConvert, RoundTripsAreBitExactOnEveryTensor) {
  for (const Source& s : {Source{"fp32_adam", false, false}, Source{"bf16_distopt", true, true}}) {
    SCOPED_TRACE(s.name);
    megatron::testing::TempDir tmp;
    write_corpus((tmp / "corpus").string());
    TrainingArgs a = tiny_args(tmp.path(), 4);
    a.bf16 = s.bf16;
    a.parallel.use_distributed_optimizer = s.distributed;
    a.save = (tmp / "src").string();
    run_single(a);
    const fs::path src_iter = tmp / "src" / "iter_0000004";
    const CheckpointOnDisk src = open(tmp / "src");
    EXPECT_EQ(src.parallel.distributed_optimizer, s.distributed);
    const auto ref = everything(tmp / "src");
    EXPECT_EQ(ref.count("fp32_param/decoder.final_layernorm.weight"), s.bf16 ? 1u : 0u);

    // TP1 -> TP2 -> TP1.
    const ConvertResult r2 = convert(tmp / "src", tmp / "tp2", 2, 1);
    EXPECT_TRUE(r2.optimizer);
    EXPECT_EQ(r2.iteration, 4);
    EXPECT_EQ(r2.num_files, 4u);  // 2 x (model + optimizer)
    convert(tmp / "tp2", tmp / "tp2_tp1", 1, 1);
    expect_bit_equal(everything(tmp / "tp2_tp1"), ref, "TP1 -> TP2 -> TP1");
    expect_bit_equal(file_tensors(tmp / "tp2_tp1" / "iter_0000004", "mp_rank_00/model.safetensors"),
                     file_tensors(src_iter, "mp_rank_00/model.safetensors"), "model file");
    if (!s.distributed)  // the plain optimizer file itself, tensor for tensor
      expect_bit_equal(file_tensors(tmp / "tp2_tp1" / "iter_0000004", "mp_rank_00/optimizer.safetensors"),
                       file_tensors(src_iter, "mp_rank_00/optimizer.safetensors"), "optimizer file");
    // The TP2 shards are the trainer's layout: chunk r along the parameter's partition dim.
    const json weights = json::parse(megatron::testing::read_file(src_iter / "metadata.json"))["weights"];
    const auto src_model = file_tensors(src_iter, "mp_rank_00/model.safetensors");
    for (int r = 0; r < 2; ++r) {
      const std::string rd = r == 0 ? "mp_rank_00" : "mp_rank_01";
      const auto shard = file_tensors(tmp / "tp2" / "iter_0000004", rd + "/model.safetensors");
      ASSERT_EQ(shard.size(), src_model.size());
      for (const auto& [n, t] : src_model)
        EXPECT_TRUE(bit_equal(shard.at(n), model::shard_along(t, weights.at(n).at("partition_dim").get<int>(), r, 2))) << rd << " " << n;
      const auto opt = file_tensors(tmp / "tp2" / "iter_0000004", rd + "/optimizer.safetensors");
      for (const auto& [n, t] : src_model)
        EXPECT_TRUE(bit_equal(opt.at("optimizer.state.exp_avg." + n),
                              model::shard_along(ref.at("exp_avg/" + n), weights.at(n).at("partition_dim").get<int>(), r, 2)))
            << rd << " exp_avg " << n;
    }

    // TP1 -> TP2 x PP2 -> TP1, and TP2 x PP2 -> TP1 x PP2 -> TP1.
    convert(tmp / "src", tmp / "tp2pp2", 2, 2);
    for (const char* rd : {"mp_rank_00_000", "mp_rank_01_000", "mp_rank_00_001", "mp_rank_01_001"})
      EXPECT_TRUE(fs::exists(tmp / "tp2pp2" / "iter_0000004" / rd / "optimizer.safetensors")) << rd;
    convert(tmp / "tp2pp2", tmp / "tp2pp2_tp1", 1, 1);
    expect_bit_equal(everything(tmp / "tp2pp2_tp1"), ref, "TP1 -> TP2xPP2 -> TP1");
    convert(tmp / "tp2pp2", tmp / "tp1pp2", 1, 2);
    expect_bit_equal(everything(tmp / "tp1pp2"), ref, "TP2xPP2 -> TP1xPP2 (merged)");
    convert(tmp / "tp1pp2", tmp / "tp1pp2_tp1", 1, 1);
    expect_bit_equal(everything(tmp / "tp1pp2_tp1"), ref, "TP2xPP2 -> TP1xPP2 -> TP1");
    // Stage contents: the first stage has the embedding and layer 0, the last layer 1 and the
    // final LayerNorm; layers keep their global names.
    const auto st0 = file_tensors(tmp / "tp1pp2" / "iter_0000004", "mp_rank_00_000/model.safetensors");
    const auto st1 = file_tensors(tmp / "tp1pp2" / "iter_0000004", "mp_rank_00_001/model.safetensors");
    EXPECT_TRUE(st0.count("embedding.word_embeddings.weight"));
    EXPECT_TRUE(st0.count("decoder.layers.0.self_attention.linear_qkv.weight"));
    EXPECT_FALSE(st0.count("decoder.layers.1.self_attention.linear_qkv.weight"));
    EXPECT_FALSE(st0.count("decoder.final_layernorm.weight"));
    EXPECT_TRUE(st1.count("decoder.layers.1.mlp.linear_fc2.weight"));
    EXPECT_TRUE(st1.count("decoder.final_layernorm.weight"));
    EXPECT_FALSE(st1.count("embedding.word_embeddings.weight"));
    EXPECT_FALSE(st1.count("output_layer.weight"));
    // The last stage's optimizer file has the tied copy's state (the trainer's optimizer there
    // holds output_layer.weight): the word embedding's.
    const auto o1 = file_tensors(tmp / "tp1pp2" / "iter_0000004", "mp_rank_00_001/optimizer.safetensors");
    ASSERT_TRUE(o1.count("optimizer.state.exp_avg.output_layer.weight"));
    EXPECT_TRUE(bit_equal(o1.at("optimizer.state.exp_avg.output_layer.weight"),
                          ref.at("exp_avg/embedding.word_embeddings.weight")));
    EXPECT_EQ(o1.count("optimizer.state.fp32_param.output_layer.weight"), s.bf16 ? 1u : 0u);

    // Metadata: the state is the source's, the layout the target's; files 0640, folders 0750.
    const CheckpointOnDisk c = open(tmp / "tp2pp2");
    EXPECT_EQ(c.parallel.tensor_model_parallel_size, 2);
    EXPECT_EQ(c.parallel.pipeline_model_parallel_size, 2);
    EXPECT_FALSE(c.parallel.distributed_optimizer);
    EXPECT_EQ(c.state.iteration, src.state.iteration);
    EXPECT_EQ(c.state.consumed_train_samples, src.state.consumed_train_samples);
    EXPECT_EQ(c.state.consumed_valid_samples, src.state.consumed_valid_samples);
    EXPECT_EQ(c.state.scheduler_num_steps, src.state.scheduler_num_steps);
    EXPECT_EQ(c.state.scheduler.max_lr, src.state.scheduler.max_lr);
    EXPECT_EQ(c.state.grad_scaler.scale, src.state.grad_scaler.scale);
    ASSERT_TRUE(c.state.rng && src.state.rng);
    EXPECT_EQ(c.state.rng->dropout_offset, src.state.rng->dropout_offset);
    EXPECT_EQ(c.state.optimizer_type, "adam");
    EXPECT_EQ(c.state.args["parallel"]["tensor_model_parallel_size"], 2);
    EXPECT_EQ(c.state.args["parallel"]["pipeline_model_parallel_size"], 2);
    EXPECT_EQ(c.state.args["lr"], src.state.args["lr"]);
    const json meta = json::parse(megatron::testing::read_file(c.dir / "metadata.json"));
    EXPECT_EQ(meta["converted_from"]["parallel"]["tensor_model_parallel_size"], 1);
    EXPECT_EQ(meta["converted_from"]["optimizer_state"], "resharded");
    EXPECT_EQ(meta["files"].size(), 8u);
    EXPECT_EQ(megatron::testing::read_file(tmp / "tp2pp2" / "latest_checkpointed_iteration.txt"), "4");
    auto mode = [](const fs::path& p) {
      struct stat st {};
      EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
      return st.st_mode & 0777;
    };
    EXPECT_EQ(mode(c.dir), 0750u);
    EXPECT_EQ(mode(c.dir / "mp_rank_01_001"), 0750u);
    EXPECT_EQ(mode(c.dir / "mp_rank_01_001" / "model.safetensors"), 0640u);
    EXPECT_EQ(mode(c.dir / "metadata.json"), 0640u);
    EXPECT_FALSE(fs::exists(tmp / "tp2pp2" / ".tmp_iter_0000004"));
  }
}

// A converted checkpoint resumes exactly where the unconverted one does (one process): the same
// losses bit for bit, with the distributed optimizer reading the converted plain optimizer file.
TEST(CheckpointConvert, AConvertedCheckpointResumesTheSameCurve) {
  megatron::testing::TempDir tmp;
  write_corpus((tmp / "corpus").string());
  TrainingArgs a = tiny_args(tmp.path(), 12);
  a.parallel.use_distributed_optimizer = true;
  a.save = (tmp / "split").string();
  a.exit_interval = 6;
  EXPECT_EQ(run_single(a).iterations, 6);
  TrainingArgs resume = a;
  resume.exit_interval = 0;
  resume.save = "";
  resume.load = (tmp / "split").string();
  const TrainingSummary ref = run_single(resume);
  ASSERT_EQ(ref.losses.size(), 6u);

  convert(tmp / "split", tmp / "tp2pp2", 2, 2);
  convert(tmp / "tp2pp2", tmp / "back", 1, 1);
  resume.load = (tmp / "back").string();
  const TrainingSummary got = run_single(resume);
  EXPECT_EQ(got.start_iteration, 6);
  EXPECT_EQ(got.consumed_samples, ref.consumed_samples);
  ASSERT_EQ(got.losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(got.losses[i], ref.losses[i]) << "iteration " << i + 7;

  // Without optimizer state: a resume must say --no-load-optim, and with it runs.
  const ConvertResult r = convert(tmp / "split", tmp / "noopt", 1, 1, /*drop_optimizer=*/true);
  EXPECT_FALSE(r.optimizer);
  const json meta = json::parse(megatron::testing::read_file(r.dir / "metadata.json"));
  EXPECT_TRUE(meta["optimizer"].is_null());
  EXPECT_NE(meta["converted_from"]["optimizer_state"].get<std::string>().find("--no-save-optim"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(r.dir / "mp_rank_00" / "optimizer.safetensors"));
  resume.load = (tmp / "noopt").string();
  {
    const std::string m = megatron::testing::error_of([&] { run_single(resume); });
    EXPECT_NE(m.find("--no-load-optim"), std::string::npos) << m;
  }
  resume.no_load_optim = true;
  const TrainingSummary fresh = run_single(resume);
  EXPECT_EQ(fresh.start_iteration, 6);
  EXPECT_EQ(fresh.losses.size(), 6u);
  EXPECT_EQ(fresh.losses[0], ref.losses[0]);  // same weights, same batch: same first loss
}

// The PP2 files load into the pipeline stages (GPTModel chunks of rank 0 and 1) through the trainer's
// load_model_weights and equal the single-rank model's parameters.
TEST(CheckpointConvert, PipelineStagesLoadTheConvertedFiles) {
  megatron::testing::TempDir tmp;
  write_corpus((tmp / "corpus").string());
  TrainingArgs a = tiny_args(tmp.path(), 4);
  a.save = (tmp / "src").string();
  run_single(a);
  convert(tmp / "src", tmp / "pp2", 1, 2);
  const CheckpointOnDisk src = open(tmp / "src"), pp2 = open(tmp / "pp2");
  const model::TransformerConfig cfg = training_args_from_json(src.state.args).model;
  model::GPTModel ref(cfg, 5);
  load_model_weights(src, ref.parameters(), false);
  std::map<std::string, model::Parameter*> by_name;
  for (model::Parameter* p : ref.parameters()) by_name[p->name] = p;
  const model::PipelineLayout layout = model::PipelineLayout::make(2, 2);
  size_t loaded = 0;
  for (int r = 0; r < 2; ++r) {
    model::GPTModel chunk(cfg, 99, model::TensorParallel::none(), model::ContextParallel::none(), model::ChunkPlace{layout, r, 0});
    model::ParameterList params;
    for (model::Parameter* p : chunk.parameters())
      if (!p->shared) params.push_back(p);  // the tied copy is not in checkpoints
    CheckpointRank rank;
    rank.pp_size = 2;
    rank.pp_rank = r;
    load_model_weights(pp2, params, false, rank);
    for (model::Parameter* p : params) {
      ASSERT_TRUE(by_name.count(p->name)) << p->name;
      EXPECT_TRUE(bit_equal(p->value, by_name[p->name]->value)) << p->name;
      ++loaded;
    }
  }
  EXPECT_EQ(loaded, by_name.size());
  // Loading it under another layout says how to convert.
  {
    const std::string m = megatron::testing::error_of([&] { load_model_weights(pp2, ref.parameters(), false); });
    EXPECT_NE(m.find("megatron checkpoint convert"), std::string::npos) << m;
  }
}

// Interleaved target (4 layers, PP2, one layer per virtual stage): pipeline rank r holds virtual
// stages r and 2 + r, i.e. layers r and 2 + r, which its two model chunks load.
TEST(CheckpointConvert, VirtualStagesHoldTheirChunksLayers) {
  megatron::testing::TempDir tmp;
  write_corpus((tmp / "corpus").string());
  TrainingArgs a = tiny_args(tmp.path(), 4);
  a.model.num_layers = 4;
  a.save = (tmp / "src").string();
  run_single(a);
  ConvertOptions o;
  o.load = tmp / "src";
  o.save = tmp / "vp";
  o.target_pp = 2;
  o.target_layers_per_virtual_stage = 1;
  convert_checkpoint(o);
  const fs::path it = tmp / "vp" / "iter_0000004";
  const auto st0 = file_tensors(it, "mp_rank_00_000/model.safetensors");
  const auto st1 = file_tensors(it, "mp_rank_00_001/model.safetensors");
  for (int layer = 0; layer < 4; ++layer) {
    const std::string n = "decoder.layers." + std::to_string(layer) + ".mlp.linear_fc1.weight";
    EXPECT_EQ(st0.count(n), layer % 2 == 0 ? 1u : 0u) << n;
    EXPECT_EQ(st1.count(n), layer % 2 == 1 ? 1u : 0u) << n;
  }
  EXPECT_TRUE(st0.count("embedding.word_embeddings.weight"));
  EXPECT_TRUE(st1.count("decoder.final_layernorm.weight"));
  const json meta = json::parse(megatron::testing::read_file(it / "metadata.json"));
  EXPECT_EQ(meta["parallel"]["virtual_pipeline_model_parallel_size"], 2);
  EXPECT_EQ(meta["args"]["parallel"]["num_layers_per_virtual_pipeline_stage"], 1);
  convert(tmp / "vp", tmp / "back", 1, 1);
  expect_bit_equal(everything(tmp / "back"), everything(tmp / "src"), "TP1 -> PP2 (v2) -> TP1");

  const CheckpointOnDisk src = open(tmp / "src"), vp = open(tmp / "vp");
  const model::TransformerConfig cfg = training_args_from_json(src.state.args).model;
  model::GPTModel ref(cfg, 5);
  load_model_weights(src, ref.parameters(), false);
  std::map<std::string, model::Parameter*> by_name;
  for (model::Parameter* p : ref.parameters()) by_name[p->name] = p;
  const model::PipelineLayout layout = model::PipelineLayout::make(4, 2, 1);
  size_t loaded = 0;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::unique_ptr<model::GPTModel>> chunks;
    model::ParameterList params;
    for (int c = 0; c < 2; ++c) {
      chunks.push_back(std::make_unique<model::GPTModel>(cfg, 99, model::TensorParallel::none(), model::ContextParallel::none(), model::ChunkPlace{layout, r, c}));
      for (model::Parameter* p : chunks.back()->parameters())
        if (!p->shared) params.push_back(p);
    }
    CheckpointRank rank;
    rank.pp_size = 2;
    rank.pp_rank = r;
    rank.vp_size = 2;
    load_model_weights(vp, params, false, rank);
    for (model::Parameter* p : params) {
      EXPECT_TRUE(bit_equal(p->value, by_name.at(p->name)->value)) << p->name;
      ++loaded;
    }
  }
  EXPECT_EQ(loaded, by_name.size());
}

TEST(CheckpointConvert, ErrorsNameTheProblem) {
  megatron::testing::TempDir tmp;
  write_corpus((tmp / "corpus").string());
  TrainingArgs a = tiny_args(tmp.path(), 4);
  a.save = (tmp / "src").string();
  run_single(a);
  auto expect_error = [&](const std::function<void()>& f, std::vector<std::string> needles) {
    const std::string m = megatron::testing::error_of(f);
    for (const std::string& n : needles) EXPECT_NE(m.find(n), std::string::npos) << m;
  };
  fs::create_directories(tmp / "busy");
  megatron::testing::write_file(tmp / "busy" / "x", "x");
  expect_error([&] { convert(tmp / "src", tmp / "busy", 2, 1); }, {"is not empty"});
  expect_error([&] { convert(tmp / "src", tmp / "t3", 3, 1); }, {"3"});
  EXPECT_FALSE(fs::exists(tmp / "t3" / "latest_checkpointed_iteration.txt"));
  expect_error([&] { convert(tmp / "src", tmp / "p3", 1, 3); }, {"--target-pipeline-parallel-size 3", "2 layers"});
  expect_error([&] { convert(tmp / "nothing", tmp / "n", 2, 1); }, {"nothing"});
  expect_error([&] { convert(tmp / "src", tmp / "s", 0, 1); }, {"--target-tensor-parallel-size"});
  expect_error([&] {
    ConvertOptions o;
    o.load = tmp / "src";
    o.save = tmp / "v";
    o.target_pp = 2;
    o.target_layers_per_virtual_stage = 2;  // 1 layer per stage
    convert_checkpoint(o);
  }, {"--target-num-layers-per-virtual-pipeline-stage 2"});

  // A corrupted shard, and a missing stage, are named.
  convert(tmp / "src", tmp / "tp2pp2", 2, 2);
  fs::copy(tmp / "tp2pp2", tmp / "corrupt", fs::copy_options::recursive);
  const fs::path shard = tmp / "corrupt" / "iter_0000004" / "mp_rank_01_000" / "model.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  expect_error([&] { convert(tmp / "corrupt", tmp / "c1", 1, 1); }, {shard.string(), "SHA-256"});
  fs::remove_all(tmp / "tp2pp2" / "iter_0000004" / "mp_rank_01_001");
  expect_error([&] { convert(tmp / "tp2pp2", tmp / "c2", 1, 1); }, {"mp_rank_01_001"});
  expect_error([&] { convert(tmp / "tp2pp2", tmp / "c3", 1, 1); }, {"missing"});
}

// The padded vocabulary depends on TP: without a buildable tokenizer the unpadded size is asked
// for when it matters (TP2 -> TP1 with 64 rows padded by 16 x 2: 33..64 tokens pad to 48 or 64
// under TP1), and --true-vocab-size decides it (40 tokens: 48 rows, the extra rows cut off).
TEST(CheckpointConvert, TheVocabularyIsRepaddedFromTheTrueVocabularySize) {
  megatron::testing::TempDir tmp;
  write_corpus((tmp / "corpus").string());
  TrainingArgs a = tiny_args(tmp.path(), 4);
  a.save = (tmp / "src").string();
  run_single(a);
  convert(tmp / "src", tmp / "tp2", 2, 1);
  const fs::path meta = tmp / "tp2" / "iter_0000004" / "metadata.json";
  json j = json::parse(megatron::testing::read_file(meta));
  j["args"]["tokenizer"] = {{"type", "GPT2BPETokenizer"}, {"vocab_file", (tmp / "gone.json").string()},
                            {"merge_file", (tmp / "gone.txt").string()}};
  megatron::testing::write_file(meta, j.dump());
  megatron::testing::write_file(meta.string() + ".sha256", sha256_file(meta) + "  metadata.json\n");
  {
    const std::string m = megatron::testing::error_of([&] { convert(tmp / "tp2", tmp / "tp1", 1, 1); });
    EXPECT_NE(m.find("--true-vocab-size"), std::string::npos) << m;
  }
  ConvertOptions o;
  o.load = tmp / "tp2";
  o.save = tmp / "tp1";
  o.true_vocab_size = 40;
  const ConvertResult r = convert_checkpoint(o);
  EXPECT_EQ(r.padded_vocab_from, 64);
  EXPECT_EQ(r.padded_vocab_to, 48);
  const auto got = everything(tmp / "tp1"), ref = everything(tmp / "src");
  const Tensor emb = got.at("model/embedding.word_embeddings.weight");
  ASSERT_EQ(emb.size(0), 48);
  EXPECT_TRUE(bit_equal(emb, ref.at("model/embedding.word_embeddings.weight").narrow(0, 0, 48).contiguous()));
  EXPECT_EQ(got.at("exp_avg/embedding.word_embeddings.weight").size(0), 48);
  EXPECT_EQ(open(tmp / "tp1").state.args["model"]["padded_vocab_size"], 48);
  // --ckpt-step picks the iteration; a missing one is named.
  o.save = tmp / "step4";
  o.ckpt_step = 4;
  EXPECT_EQ(convert_checkpoint(o).iteration, 4);
  o.save = tmp / "step3";
  o.ckpt_step = 3;
  {
    const std::string m = megatron::testing::error_of([&] { convert_checkpoint(o); });
    EXPECT_NE(m.find("--ckpt-step 3"), std::string::npos) << m;
  }
}

TEST(CheckpointConvertCli, ConvertsAndSaysWhatItDid) {
  megatron::testing::TempDir tmp;
  write_corpus((tmp / "corpus").string());
  TrainingArgs a = tiny_args(tmp.path(), 4);
  a.save = (tmp / "src").string();
  run_single(a);
  const std::string src = (tmp / "src").string();
  auto ok = megatron::testing::run_cli("checkpoint convert --load " + src + " --save " +
                                       (tmp / "tp2").string() +
                                       " --target-tensor-parallel-size 2 2>&1");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("converted iteration 4 from TP=1 x PP=1 x DP=1 to TP=2 x PP=1"),
            std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("optimizer state: resharded"), std::string::npos) << ok.output;
  auto noopt = megatron::testing::run_cli("checkpoint convert --load " + (tmp / "tp2").string() +
                                          " --save " + (tmp / "pp2").string() +
                                          " --target-pipeline-parallel-size 2 --no-save-optim 2>&1");
  EXPECT_EQ(noopt.exit_code, 0) << noopt.output;
  EXPECT_NE(noopt.output.find("optimizer state: NONE"), std::string::npos) << noopt.output;
  EXPECT_NE(noopt.output.find("--no-load-optim"), std::string::npos) << noopt.output;
  // generate reads the TP2 and the TP2 -> PP2 checkpoints directly and says what it generates
  // from the TP1 one.
  auto gen = [&](const std::string& dir) {
    return megatron::testing::run_cli("generate --load " + dir + " --use-checkpoint-args "
                                      "--tokenizer-type NullTokenizer --vocab-size 64 --prompt '1 2 3' "
                                      "--prompt '7 9' --num-tokens-to-generate 6 --output-format jsonl "
                                      "--return-log-probs 2>/dev/null");
  };
  auto results = [](const std::string& out) {  // the JSON lines (the log says where it loaded from)
    std::string r, line;
    std::istringstream in(out);
    while (std::getline(in, line))
      if (line.starts_with("{")) r += line + "\n";
    return r;
  };
  const auto g1 = gen(src), g2 = gen((tmp / "tp2").string()), g3 = gen((tmp / "pp2").string());
  EXPECT_EQ(g1.exit_code, 0) << g1.output;
  EXPECT_EQ(g2.exit_code, 0) << g2.output;
  EXPECT_EQ(g3.exit_code, 0) << g3.output;
  EXPECT_NE(results(g1.output).find("\"tokens\""), std::string::npos) << g1.output;
  EXPECT_EQ(results(g2.output), results(g1.output));
  EXPECT_EQ(results(g3.output), results(g1.output));
  EXPECT_NE(g2.output.find("merging the TP=2 x PP=1"), std::string::npos) << g2.output;
  auto bad = megatron::testing::run_cli("checkpoint convert --load " + src + " --save " +
                                        (tmp / "tp2").string() + " 2>&1");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("error: --save"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("is not empty"), std::string::npos) << bad.output;
}

// ---------------------------------------------------------------------------------------------
// Under mpirun.


void expect_close(const TrainingSummary& got, const TrainingSummary& ref, const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i])) << what << " " << i;
}

TEST(MpiCheckpointConvert, ConvertedCheckpointsResumeUnderAnotherTensorParallelSize) {
  if (world()->size() == 1) GTEST_SKIP() << "needs mpirun -np 2 or 4 (label mpi)";
  SharedDir dir;
  const bool root = world()->rank() == 0;
  if (root) write_corpus(dir / "corpus");
  world()->barrier();
  TrainingArgs base = tiny_args(dir.path(), 12);

  // TP1 (one rank) -> TP2 (x DP2 at -np 4).
  TrainingSummary ref1;
  if (root) {
    TrainingArgs a = base;
    a.save = dir / "tp1";
    a.exit_interval = 6;
    run_single(a);
    a.exit_interval = 0;
    a.save = "";
    a.load = dir / "tp1";
    ref1 = run_single(a);
    convert(dir / "tp1", dir / "tp1_as_tp2", 2, 1);
  }
  world()->barrier();
  TrainingArgs b = base;
  b.parallel.tensor_model_parallel_size = 2;
  b.load = dir / "tp1_as_tp2";
  const TrainingSummary got1 = pretrain(b);
  EXPECT_EQ(got1.start_iteration, 6);
  if (root) expect_close(got1, ref1, "TP1 checkpoint converted to TP2");

  // TP2 (distributed optimizer) -> TP1 (one rank).
  TrainingArgs c = base;
  c.parallel.tensor_model_parallel_size = 2;
  c.parallel.use_distributed_optimizer = world()->size() == 4;
  c.save = dir / "tp2";
  c.exit_interval = 6;
  pretrain(c);
  c.exit_interval = 0;
  c.save = "";
  c.load = dir / "tp2";
  const TrainingSummary ref2 = pretrain(c);
  if (root) {
    convert(dir / "tp2", dir / "tp2_as_tp1", 1, 1);
    TrainingArgs d = base;
    d.load = dir / "tp2_as_tp1";
    const TrainingSummary got2 = run_single(d);
    EXPECT_EQ(got2.start_iteration, 6);
    expect_close(got2, ref2, "TP2 checkpoint converted to TP1");
  }
  world()->barrier();
}

// Pipeline-parallel training checkpoints: PP2 (TP2 x PP2 at -np 4) saved by the trainer,
// converted to TP1, resumes on one rank on the pipeline resume's curve (at -np 4 also converted to
// TP1 x PP2 and resumed under PP2 x DP2); a TP1 checkpoint converted
// to PP2 (TP2 x PP2) resumes under the pipeline on the single-rank resume's curve.
std::vector<double> from_rank0(const std::vector<double>& v) {
  return json::parse(all_gather_strings(*world(), json(v).dump())[0]).get<std::vector<double>>();
}

TEST(MpiCheckpointConvert, PipelineCheckpointsConvertBothWays) {
  if (world()->size() == 1) GTEST_SKIP() << "needs mpirun -np 2 or 4 (label mpi)";
  SharedDir dir;
  const int W = world()->size();
  const bool root = world()->rank() == 0, last = world()->rank() == W - 1;
  if (root) write_corpus(dir / "corpus");
  world()->barrier();
  const TrainingArgs base = tiny_args(dir.path(), 12);
  TrainingArgs pp = base;
  pp.parallel.pipeline_model_parallel_size = 2;
  pp.parallel.tensor_model_parallel_size = W / 2;
  pp.parallel.use_distributed_optimizer = true;

  // The trainer's PP checkpoint -> TP1.
  TrainingArgs c = pp;
  c.save = dir / "pp";
  c.exit_interval = 6;
  pretrain(c);
  c.exit_interval = 0;
  c.save = "";
  c.load = dir / "pp";
  const TrainingSummary ref_pp = pretrain(c);
  std::vector<double> got_tp1;
  if (root) {
    convert(dir / "pp", dir / "pp_as_tp1", 1, 1);
    TrainingArgs d = base;
    d.load = dir / "pp_as_tp1";
    const TrainingSummary s = run_single(d);
    EXPECT_EQ(s.start_iteration, 6);
    got_tp1 = s.losses;
  }
  if (root) {  // generation reads the trainer's PP checkpoint as the converted TP1 one
    const auto merged = inference::CheckpointWeights::open(dir / "pp");
    const auto single = inference::CheckpointWeights::open(dir / "pp_as_tp1");
    EXPECT_EQ(merged.names(), single.names());
    for (const std::string& n : single.names())
      EXPECT_TRUE(bit_equal(merged.get(n), single.get(n))) << n;
  }
  got_tp1 = from_rank0(got_tp1);
  if (last) {
    ASSERT_EQ(got_tp1.size(), ref_pp.losses.size());
    for (size_t i = 0; i < got_tp1.size(); ++i)
      EXPECT_NEAR(got_tp1[i], ref_pp.losses[i], 1e-5 * ref_pp.losses[i]) << "PP -> TP1, " << i;
  }
  if (W == 4) {  // TP2 x PP2 -> TP1 x PP2, resumed under PP2 x DP2
    if (root) convert(dir / "pp", dir / "pp_as_tp1_pp2", 1, 2);
    world()->barrier();
    TrainingArgs e = pp;
    e.parallel.tensor_model_parallel_size = 1;
    e.load = dir / "pp_as_tp1_pp2";
    const TrainingSummary s = pretrain(e);
    EXPECT_EQ(s.start_iteration, 6);
    if (last) {
      ASSERT_EQ(s.losses.size(), ref_pp.losses.size());
      for (size_t i = 0; i < s.losses.size(); ++i)
        EXPECT_NEAR(s.losses[i], ref_pp.losses[i], 1e-5 * ref_pp.losses[i]) << "TP2 x PP2 -> TP1 x PP2, " << i;
    }
  }

  // A TP1 checkpoint -> the PP layout.
  std::vector<double> ref_tp1;
  if (root) {
    TrainingArgs a = base;
    a.save = dir / "tp1";
    a.exit_interval = 6;
    run_single(a);
    a.exit_interval = 0;
    a.save = "";
    a.load = dir / "tp1";
    ref_tp1 = run_single(a).losses;
    convert(dir / "tp1", dir / "tp1_as_pp", W / 2, 2);
  }
  ref_tp1 = from_rank0(ref_tp1);
  TrainingArgs b = pp;
  b.load = dir / "tp1_as_pp";
  const TrainingSummary got_pp = pretrain(b);
  EXPECT_EQ(got_pp.start_iteration, 6);
  if (last) {
    ASSERT_EQ(got_pp.losses.size(), ref_tp1.size());
    for (size_t i = 0; i < ref_tp1.size(); ++i)
      EXPECT_NEAR(got_pp.losses[i], ref_tp1[i], 1e-5 * ref_tp1[i]) << "TP1 -> PP, " << i;
  }

  // Interleaved: 4 layers, one per virtual stage (--num-layers-per-virtual-pipeline-stage 1, set
  // through the JSON codec), the trainer's checkpoint -> TP1, and TP1 -> interleaved.
  TrainingArgs four = base;
  four.model.num_layers = 4;
  json vj = training_args_to_json(pp);
  vj["model"]["num_layers"] = 4;
  vj["parallel"]["num_layers_per_virtual_pipeline_stage"] = 1;
  TrainingArgs v = training_args_from_json(vj);
  v.save = dir / "vp";
  v.exit_interval = 6;
  pretrain(v);
  v.exit_interval = 0;
  v.save = "";
  v.load = dir / "vp";
  const TrainingSummary ref_vp = pretrain(v);
  std::vector<double> got_vp_tp1, ref_four;
  if (root) {
    convert(dir / "vp", dir / "vp_as_tp1", 1, 1);
    TrainingArgs d = four;
    d.load = dir / "vp_as_tp1";
    got_vp_tp1 = run_single(d).losses;
    TrainingArgs a = four;
    a.save = dir / "four";
    a.exit_interval = 6;
    run_single(a);
    a.exit_interval = 0;
    a.save = "";
    a.load = dir / "four";
    ref_four = run_single(a).losses;
    ConvertOptions o;
    o.load = dir / "four";
    o.save = dir / "four_as_vp";
    o.target_tp = W / 2;
    o.target_pp = 2;
    o.target_layers_per_virtual_stage = 1;
    convert_checkpoint(o);
  }
  got_vp_tp1 = from_rank0(got_vp_tp1);
  ref_four = from_rank0(ref_four);
  v.load = dir / "four_as_vp";
  const TrainingSummary got_vp = pretrain(v);
  EXPECT_EQ(got_vp.start_iteration, 6);
  if (last) {
    ASSERT_EQ(got_vp_tp1.size(), ref_vp.losses.size());
    ASSERT_EQ(got_vp.losses.size(), ref_four.size());
    for (size_t i = 0; i < ref_four.size(); ++i) {
      EXPECT_NEAR(got_vp_tp1[i], ref_vp.losses[i], 1e-5 * ref_vp.losses[i]) << "interleaved -> TP1, " << i;
      EXPECT_NEAR(got_vp.losses[i], ref_four[i], 1e-5 * ref_four[i]) << "TP1 -> interleaved, " << i;
    }
  }
  world()->barrier();
}

}  // namespace
}  // namespace megatron::training
