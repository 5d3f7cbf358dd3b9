// --ckpt-format torch_dist with --expert-tensor-parallel-size other than the tensor-parallel size
// (Megatron's parallel folding): the experts are keyed by their expert-tensor shards (Megatron's
// expert_dist_ckpt_decorator: the expert tensor-parallel rank and size in place of TP's) and
// written once, by expert data-parallel rank 0 (replica id (PP, expert TP, expert DP rank)).
// Under mpirun -np 2 (TP 2 x ETP 1, TP 1 x ETP 2) and -np 4 (TP 2 x ETP 1 x EP 2): the independent
// Python reader assembles every key from the items with no chunk overlapping or missing, the
// experts' chunks split as ETP says; a resume continues the uninterrupted curve bit for bit; the
// folder converted to one rank holds the single-rank run's parameters; and the ETP 1 folder
// resumes under ETP 2 on the same curve.
#include <gtest/gtest.h>

#include "moe_test_util.h"
#include "training/checkpoint_convert.h"
#include "training/torch_dist_moe.h"

namespace megatron::training {
namespace {

using namespace parallel_test;

struct Folding {
  int tp, etp, ep;
  std::string name() const { return str("tp", tp, "_etp", etp, "_ep", ep); }
};

TrainingArgs folded_args(const Fixture& f, const Folding& k) {
  TrainingArgs a = moe_args(f, 4);
  a.parallel.tensor_model_parallel_size = k.tp;
  a.parallel.expert_tensor_parallel_size = k.etp;
  a.parallel.expert_model_parallel_size = k.ep;
  a.model.sequence_parallel = k.tp > 1;
  a.ckpt_format = "torch_dist";
  return a;
}

// The Python reader's view of `it` (reader.read asserts every key's chunks cover it once): every
// weight of our merge of the folder under Megatron's key with the same sum; the experts' keys
// [E, ...] of the MoE layer, fc1 in 2 x ETP chunks along its rows per expert (SwiGLU's gate and
// up, each split over ETP), fc2 in ETP chunks along its columns.
void expect_python_reads(const fs::path& it, const TrainingArgs& a, int etp) {
  const auto r = testing::run_command("/usr/bin/python3 " +
                                      (testing::source_dir() / "tests/reference/write_torch_dist_moe.py").string() +
                                      " summary " + it.string() + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json got = json::parse(r.output)["tensors"];
  const auto ckpt = find_checkpoint(it.parent_path().string(), std::nullopt);
  ASSERT_TRUE(ckpt.has_value());
  const torch_dist_moe::MoeLayout moe = torch_dist_moe::moe_layout(a);
  std::map<std::string, double> want;
  for (const auto& [name, t] : merge_checkpoint(*ckpt, false).model) {
    double s = 0;
    for (float x : t.to_float_vector()) s += x;
    want[torch_dist_moe::sharded_key(name, a.transformer_impl == "transformer_engine", moe).key] += s;
  }
  for (const auto& [key, s] : want) {
    ASSERT_TRUE(got.contains(key)) << key;
    EXPECT_NEAR(got[key]["sum"].get<double>(), s, 1e-4 * (1 + std::abs(s))) << key;
  }
  const std::string fc = "decoder.layers.1.mlp.experts.experts.linear_fc";
  EXPECT_EQ(got[fc + "1.weight"]["shape"].get<std::vector<int64_t>>(), (std::vector<int64_t>{4, 48, 32}));
  EXPECT_EQ(got[fc + "2.weight"]["shape"].get<std::vector<int64_t>>(), (std::vector<int64_t>{4, 32, 24}));
  // The chunks of the experts' weights as .metadata lists them: (offsets, sizes) per chunk.
  const fs::path script = it.parent_path() / "chunks.py";
  testing::write_file(script,
                      "import json, os, sys\n"
                      "sys.path.insert(0, " + json((testing::source_dir() / "tests/reference").string()).dump() + ")\n"
                      "import read_torch_dist as r\n"
                      "meta, _ = r.load_metadata(os.path.join(sys.argv[1], '.metadata'))\n"
                      "print(json.dumps({k: sorted([list(c.offsets), list(c.sizes)] for c in md.chunks)\n"
                      "                  for k, md in meta.state_dict_metadata.items() if hasattr(md, 'chunks')}))\n");
  const auto c = testing::run_command("/usr/bin/python3 " + script.string() + " " + it.string() + " 2>&1");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  const json chunks = json::parse(c.output);
  std::set<std::vector<int64_t>> fc1, fc2;  // (expert, row offset, rows) / (expert, column offset, columns)
  for (const json& ch : chunks[fc + "1.weight"]) {
    const auto o = ch[0].get<std::vector<int64_t>>(), s = ch[1].get<std::vector<int64_t>>();
    EXPECT_EQ(s, (std::vector<int64_t>{1, 24 / etp, 32}));
    fc1.insert({o[0], o[1], s[1]});
  }
  for (const json& ch : chunks[fc + "2.weight"]) {
    const auto o = ch[0].get<std::vector<int64_t>>(), s = ch[1].get<std::vector<int64_t>>();
    EXPECT_EQ(s, (std::vector<int64_t>{1, 32, 24 / etp}));
    fc2.insert({o[0], o[2], s[2]});
  }
  EXPECT_EQ(fc1.size(), size_t(4 * 2 * etp));
  EXPECT_EQ(fc2.size(), size_t(4 * etp));
}

TEST(MpiTorchDistEtp, FoldedExpertsWrittenOnceResumedAndReadUnderAnyLayout) {
  SKIP_ON_ONE_RANK();
  const int n = world()->size();
  if (n != 2 && n != 4) GTEST_SKIP() << "runs at -np 2 (EP 1) and 4 (EP 2)";
  Fixture f;
  // The single-rank run: its parameters and loss curve (every rank gets it).
  const TrainingSummary single = reference_curve(moe_args(f, 4), f.dir / "reference");
  // Saved: at np 2 TP 2 x ETP 1 and TP 1 x ETP 2; at np 4 TP 2 x ETP 1 x EP 2 (the other folding
  // there only read, below, to keep the run short).
  const int ep = n / 2;
  const Folding etp1{2, 1, ep}, etp2{1, 2, ep};
  const std::vector<Folding> saved = n == 2 ? std::vector<Folding>{etp1, etp2} : std::vector<Folding>{etp1};
  for (const Folding& k : saved) {
    SCOPED_TRACE(k.name());
    const TrainingArgs a = folded_args(f, k);
    const std::string full = f.dir / (k.name() + "_full"), split = f.dir / (k.name() + "_split");
    ResumeExtras extras;
    extras.at_split = [&](const fs::path& it) { expect_python_reads(it, a, k.etp); };
    expect_exact_resume(a, full, split, [](const TrainingArgs& x) { return pretrain(x); }, 2, extras);
    if (world()->rank() == 0) {  // at one rank: the single-rank run's parameters
      ConvertOptions o;
      o.load = full;
      o.save = f.dir / (k.name() + "_single");
      const ConvertResult r = convert_checkpoint(o);
      EXPECT_EQ(r.to.tensor_model_parallel_size, 1);
      EXPECT_EQ(r.to.expert_model_parallel_size, 1);
      expect_same_params(o.save, f.dir / "reference", 4, 1e-4);
    }
    world()->barrier();
  }
  // The whole experts of ETP 1 at iteration 2 resumed as ETP 2 chunks (the other way is the
  // conversion's merge above): the single-rank run's curve within 1e-5.
  {
    const Folding& from = etp1;
    const Folding& to = etp2;
    SCOPED_TRACE(from.name() + " -> " + to.name());
    TrainingArgs c = folded_args(f, to);
    c.load = f.dir / (from.name() + "_split");
    c.ckpt_step = 2;
    c.save = f.dir / (from.name() + "_as_" + to.name());
    c.save_interval = 1000;
    const TrainingSummary r = pretrain(c);
    ASSERT_EQ(r.start_iteration, 2);
    ASSERT_EQ(r.losses.size(), 2u);
    for (size_t j = 0; j < 2; ++j)
      EXPECT_NEAR(r.losses[j], single.losses[2 + j], 1e-5 * single.losses[2 + j]) << "iteration " << j + 3;
  }
}

}  // namespace
}  // namespace megatron::training
