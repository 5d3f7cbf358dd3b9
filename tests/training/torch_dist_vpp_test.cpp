// The layout a torch_dist checkpoint records. Virtual pipeline stages: under mpirun -np 2, PP 2 x
// VP 2 (--num-layers-per-virtual-pipeline-stage 1 of 4 layers) writes every layer under its
// global number on the layer axis (the independent Python reader assembles each key from the
// items with no chunk overlapping or missing), the plain optimizer's state with it, and
// common.pt's args say 2 virtual stages; the run resumes on its curve bit for bit and the folder
// loads at PP 1 on one rank, ending at the same parameters. `checkpoint convert --save-format torch_dist
// --target-expert-model-parallel-size 2` (and virtual stages) records that layout as a Megatron-LM
// run of it would; an expert-parallel size the experts do not divide, or one for a dense model,
// is refused by name. The distributed optimizer with virtual stages: a gradient buffer per model
// chunk, written and read (dense GPT models; experts refused by name).
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "moe_test_util.h"
#include "training/checkpoint_convert.h"
#include "training/torch_dist_format.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

// common.pt's args of iteration folder `it` as /usr/bin/python3 (Debian's torch) loads them: the
// parallel sizes Megatron-LM's loader reads.
json common_args(const fs::path& it) {
  const fs::path script = it.parent_path() / "common_args.py";
  testing::write_file(script,
                      "import json, os, sys, torch\n"
                      "a = torch.load(os.path.join(sys.argv[1], 'common.pt'), weights_only=False)['args']\n"
                      "print(json.dumps({k: getattr(a, k, 'absent') for k in ['tensor_model_parallel_size',\n"
                      "    'pipeline_model_parallel_size', 'virtual_pipeline_model_parallel_size',\n"
                      "    'num_layers_per_virtual_pipeline_stage', 'expert_model_parallel_size',\n"
                      "    'expert_tensor_parallel_size', 'data_parallel_size', 'world_size', 'num_experts']}))\n");
  const auto r = testing::run_command("/usr/bin/python3 " + script.string() + " " + it.string() + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? json::parse(r.output) : json::object();
}

// The Python reader's keys and shapes of `it` (reader.read asserts every key's chunks cover it
// once).
json python_tensors(const fs::path& it) {
  const auto r = testing::run_command("/usr/bin/python3 " +
                                      (testing::source_dir() / "tests/reference/write_torch_dist_moe.py").string() +
                                      " summary " + it.string() + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? json::parse(r.output)["tensors"] : json::object();
}

TrainingArgs four_layers(const Fixture& f) {
  TrainingArgs a = f.args(4);
  a.model.num_layers = 4;
  a.ckpt_format = "torch_dist";
  return a;
}

// The folder `split` at iteration 2 on one rank at PP 1: its last 2 iterations end at the PP 2 x
// VP 2 run's parameters in `full` (within rounding: another pipeline's reduction order).
void expect_loads_at_one_stage(const Fixture& f, const std::string& split, const std::string& full) {
  TrainingSummary one;
  if (world()->rank() == 0) {
    TrainingArgs c = four_layers(f);
    c.load = split;
    c.ckpt_step = 2;
    c.save = f.dir / "pp1";
    c.save_interval = 1000;
    one = run_single(c);
  }
  world()->barrier();
  if (world()->rank() == 0) {
    ASSERT_EQ(one.start_iteration, 2);
    expect_same_params(f.dir / "pp1", full, 4, 1e-4);
  }
}

TEST(MpiTorchDistVpp, VirtualStagesWrittenResumedAndLoadedAtOneStage) {
  SKIP_ON_ONE_RANK();
  if (world()->size() != 2) GTEST_SKIP() << "runs at -np 2 (PP 2 x VP 2)";
  Fixture f;
  TrainingArgs a = four_layers(f);
  a.parallel.pipeline_model_parallel_size = 2;
  a.parallel.num_layers_per_virtual_pipeline_stage = 1;  // rank 0: layers 0 and 2, rank 1: 1 and 3
  const std::string full = f.dir / "full", split = f.dir / "split";
  ResumeExtras extras;
  extras.at_split = [&](const fs::path& it) {
    const json t = python_tensors(it);
    for (const char* k : {"decoder.layers.self_attention.linear_qkv.weight", "decoder.layers.mlp.linear_fc2.weight",
                          "optimizer.state.exp_avg.decoder.layers.mlp.linear_fc1.weight",
                          "optimizer.state.exp_avg_sq.decoder.layers.self_attention.linear_proj.weight"}) {
      ASSERT_TRUE(t.contains(k)) << k;
      EXPECT_EQ(t[k]["shape"][0], 4) << k;  // the layer axis: all 4 layers, by global number
    }
    // Against this build's merge of the same folder: every layer in its global place.
    const auto ckpt = find_checkpoint(split, 2);
    ASSERT_TRUE(ckpt.has_value());
    const MergedCheckpoint m = merge_checkpoint(*ckpt, false);
    double s = 0;
    for (int l = 0; l < 4; ++l)
      for (float x : m.model.at(str("decoder.layers.", l, ".mlp.linear_fc2.weight")).to_float_vector()) s += x;
    EXPECT_NEAR(t["decoder.layers.mlp.linear_fc2.weight"]["sum"].get<double>(), s, 1e-4 * (1 + std::abs(s)));
    const json args = common_args(it);
    EXPECT_EQ(args["pipeline_model_parallel_size"], 2);
    EXPECT_EQ(args["virtual_pipeline_model_parallel_size"], 2);
    EXPECT_EQ(args["num_layers_per_virtual_pipeline_stage"], 1);
  };
  expect_exact_resume(a, full, split, [](const TrainingArgs& x) { return pretrain(x); }, 2, extras);
  expect_loads_at_one_stage(f, split, full);
}

// The distributed optimizer's dp_reshardable state with virtual stages: a gradient buffer per
// model chunk (gbuf_idx_<v>) under one optimizer per rank, as Megatron-Core keeps it. Under
// mpirun -np 2 (PP 2 x VP 2) and -np 4 (PP 2 x VP 2 x DP 2, each data-parallel rank writing its
// pieces of every chunk's buckets) the run resumes on its curve bit for bit from the folder, and
// the folder loads at PP 1 on one rank (the buckets read back into model space for a layout with
// one chunk), ending at the same parameters. The fixture test (torch_dist_checkpoint_test.cpp,
// dp_reshardable_vpp) checks the reader against Megatron-Core's layout.
TEST(MpiTorchDistVpp, DistributedOptimizerBuffersPerChunkWrittenResumedAndLoadedAtOneStage) {
  SKIP_ON_ONE_RANK();
  if (world()->size() != 2 && world()->size() != 4) GTEST_SKIP() << "runs at -np 2 and 4 (PP 2 x VP 2 x DP 1, 2)";
  Fixture f;
  TrainingArgs a = four_layers(f);
  a.parallel.pipeline_model_parallel_size = 2;
  a.parallel.num_layers_per_virtual_pipeline_stage = 1;
  a.parallel.use_distributed_optimizer = true;
  const std::string full = f.dir / "full", split = f.dir / "split";
  ResumeExtras extras;
  extras.at_split = [&](const fs::path& it) {
    const DistcpFolder folder = DistcpFolder::open(it);
    std::set<std::string> buffers;  // "dp_group_idx_<g>.gbuf_idx_<v>"
    for (const auto& [key, e] : folder.entries()) {
      const size_t at = key.find(".gbuf_idx_");
      if (key.find(".bucket_idx_") != std::string::npos && at != std::string::npos)
        buffers.insert(key.substr(0, key.find('.', at + 1)));
    }
    EXPECT_EQ(buffers.size(), 4u);  // 2 pipeline ranks x 2 model chunks
    for (const char* g : {"optimizer.distributed.dp_group_idx_0.gbuf_idx_1", "optimizer.distributed.dp_group_idx_1.gbuf_idx_1"})
      EXPECT_TRUE(buffers.count(g)) << g;
  };
  expect_exact_resume(a, full, split, [](const TrainingArgs& x) { return pretrain(x); }, 2, extras);
  expect_loads_at_one_stage(f, split, full);
}

// What this build does not write with virtual stages and the distributed optimizer is refused
// before training, by name: experts, BERT and T5 models; --no-save-optim saves the weights.
TEST(TorchDistLayout, RefusesTheDistributedOptimizerWithVirtualStagesAndExperts) {
  Fixture f;
  TrainingArgs a = four_layers(f);
  a.parallel.pipeline_model_parallel_size = 2;
  a.parallel.num_layers_per_virtual_pipeline_stage = 1;
  a.parallel.use_distributed_optimizer = true;
  a.save = f.dir / "never";
  a.save_interval = 2;
  EXPECT_NO_THROW(validate_args(a));  // a dense GPT: a gradient buffer per model chunk
  a.model.num_moe_experts = 4;
  try {
    validate_args(a);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("virtual pipeline stages"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("experts"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--no-save-optim"), std::string::npos) << e.what();
  }
  a.no_save_optim = true;
  EXPECT_NO_THROW(validate_args(a));
}

// Converted to torch_dist for another layout: the same keys (the folder merges to the source's
// weights), common.pt's args that layout's.
TEST(TorchDistLayout, ConvertRecordsTheTargetLayout) {
  Fixture f;
  TrainingArgs moe = moe_args(f, 4);
  moe.save = f.dir / "moe";
  moe.save_interval = 1000;
  run_single(moe);
  ConvertOptions o;
  o.load = moe.save;
  o.save = f.dir / "moe_ep2";
  o.save_format = "torch_dist";
  o.target_ep = 2;
  const ConvertResult r = convert_checkpoint(o);
  EXPECT_EQ(r.to.expert_model_parallel_size, 2);
  const json args = common_args(r.dir);
  EXPECT_EQ(args["expert_model_parallel_size"], 2);
  EXPECT_EQ(args["expert_tensor_parallel_size"], 1);  // the experts split as the dense layers (TP 1)
  EXPECT_EQ(args["data_parallel_size"], 2);           // a run at EP 2 and ETP = TP 1 has DP >= 2
  EXPECT_EQ(args["world_size"], 2);
  EXPECT_EQ(args["num_experts"], 4);
  EXPECT_TRUE(args["virtual_pipeline_model_parallel_size"].is_null());
  expect_same_merged_model(o.save, moe.save, 4);
  // Expert-parallel sizes the layout cannot have: refused by name, nothing written.
  for (const auto& [ep, dense, what] : {std::tuple(3, false, "not a positive multiple of 3"),
                                        std::tuple(2, true, "0 experts per MoE layer")}) {
    ConvertOptions bad = o;
    bad.target_ep = ep;
    bad.save = f.dir / str("bad_", ep, dense);
    if (dense) {
      TrainingArgs d = four_layers(f);
      d.ckpt_format = "";
      d.save = f.dir / "dense";
      d.save_interval = 1000;
      run_single(d);
      bad.load = d.save;
    }
    try {
      convert_checkpoint(bad);
      ADD_FAILURE() << "converted for EP " << ep;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("--target-expert-model-parallel-size"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(bad.save / "latest_checkpointed_iteration.txt"));
  }
  // Virtual stages of a dense model: recorded, the keys unchanged.
  ConvertOptions v;
  v.load = f.dir / "dense";
  v.save = f.dir / "dense_vp2";
  v.save_format = "torch_dist";
  v.target_pp = 2;
  v.target_layers_per_virtual_stage = 1;
  const ConvertResult rv = convert_checkpoint(v);
  EXPECT_EQ(rv.to.virtual_pipeline_model_parallel_size, 2);
  const json vargs = common_args(rv.dir);
  EXPECT_EQ(vargs["pipeline_model_parallel_size"], 2);
  EXPECT_EQ(vargs["virtual_pipeline_model_parallel_size"], 2);
  EXPECT_EQ(vargs["num_layers_per_virtual_pipeline_stage"], 1);
  EXPECT_EQ(vargs["expert_model_parallel_size"], 1);
  expect_same_merged_model(v.save, v.load.string(), 4);
}

}  // namespace
}  // namespace megatron::training
