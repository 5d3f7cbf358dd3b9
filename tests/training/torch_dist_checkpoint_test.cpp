// Megatron-LM's torch_dist checkpoints (tests/reference/write_torch_dist.py writes them as
// Megatron-Core's dist_checkpointing and PyTorch's distributed checkpoint lay them out, saved under
// TP2 x PP2): a GPT-2-style and a Llama-style model load under TP1, TP2 x PP1, TP1 x PP2 (and
// TP2 x PP2 at 4 ranks) with logits within 1e-5 of the float64 reference forward of the merged
// weights (tests/reference/gpt_reference.py); `checkpoint convert` takes them to our format, to
// Megatron's .pt and to Hugging Face; pretrain-gpt fine-tunes from one and resumes with its
// (distributed) optimizer state, which merges to the writer's values; `checkpoint convert
// --save-format torch_dist` writes what an independent Python reader reads
// (tests/reference/read_torch_dist.py); hostile files are refused with an error naming what is
// wrong, and nothing they carry runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/pickle.h"
#include "inference/model_loader.h"
#include "model/transformer_config.h"
#include "parallel_test_util.h"
#include "test_util.h"
#include "training/checkpoint.h"
#include "training/checkpoint_convert.h"

namespace megatron {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;
using json = nlohmann::json;

constexpr int kSeq = 12;
const char* const kTokenizer = " --tokenizer-type NullTokenizer --vocab-size 60";

std::vector<int32_t> prompt() {
  std::vector<int32_t> t;
  for (int i = 0; i < kSeq; ++i) t.push_back((7 * i + 3) % 60);
  return t;
}

// The fixtures and, per model, the reference logits [kSeq, V] of the merged weights.
struct Fixtures {
  fs::path dir;
  std::map<std::string, std::vector<double>> logits;
};

Fixtures make_fixtures(const fs::path& dir) {
  Fixtures f;
  f.dir = dir;
  const auto made = mt::run_command("/usr/bin/python3 " +
                                    (mt::source_dir() / "tests/reference/write_torch_dist.py").string() +
                                    " make " + dir.string() + " 2>&1");
  EXPECT_EQ(made.exit_code, 0) << made.output;
  for (const std::string name : {"gpt2", "llama", "llama_layers"}) {
    const fs::path ref = dir / (name + ".ref");
    std::ofstream batch(ref / "batch.bin", std::ios::binary);
    const std::vector<int32_t> tokens = prompt();
    std::vector<int32_t> ints;
    for (int k = 0; k < 5; ++k)
      for (int i = 0; i < kSeq; ++i)
        ints.push_back(k == 0 ? tokens[size_t(i)] : k == 1 ? i : k == 2 ? tokens[size_t((i + 1) % kSeq)] : k == 3 ? 0 : 1);
    batch.write(reinterpret_cast<const char*>(ints.data()), std::streamsize(ints.size() * 4));
    const std::vector<float> mask(kSeq, 1.0f);
    batch.write(reinterpret_cast<const char*>(mask.data()), std::streamsize(mask.size() * 4));
    batch.close();
    json cfg = json::parse(mt::read_file(ref / "config.json"));
    cfg["batch"] = 1;
    cfg["seq"] = kSeq;
    std::ofstream(ref / "config.json") << cfg.dump();
    const auto r = mt::run_command("/usr/bin/python3 " + (mt::source_dir() / "tests/reference/gpt_reference.py").string() +
                                   " " + ref.string() + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const int64_t V = cfg["model"]["padded_vocab_size"].get<int64_t>();
    std::ifstream out(ref / "out.bin", std::ios::binary);
    std::vector<double> v(size_t(2 + kSeq * V));
    out.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * 8));
    EXPECT_TRUE(out.good()) << name;
    f.logits[name].assign(v.begin() + 2, v.end());
  }
  return f;
}

const Fixtures& fixtures() {
  static mt::TempDir dir;
  static const Fixtures f = make_fixtures(dir.path());
  return f;
}

// Log-softmax of each row of [rows, V].
std::vector<double> log_probs(const std::vector<double>& logits, int64_t V) {
  std::vector<double> out(logits.size());
  for (size_t r = 0; r < logits.size() / size_t(V); ++r) {
    double m = -1e300, s = 0;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, logits[r * size_t(V) + size_t(j)]);
    for (int64_t j = 0; j < V; ++j) s += std::exp(logits[r * size_t(V) + size_t(j)] - m);
    for (int64_t j = 0; j < V; ++j) out[r * size_t(V) + size_t(j)] = logits[r * size_t(V) + size_t(j)] - m - std::log(s);
  }
  return out;
}

// Loads fixture `name` under TP x PP over `world` and returns the leader's logits (empty on others).
std::vector<double> load_and_run(const fs::path& folder, int tp, int pp, std::shared_ptr<Communicator> world) {
  const auto ckpt = training::find_checkpoint(folder, std::nullopt);
  EXPECT_TRUE(ckpt.has_value());
  EXPECT_EQ(ckpt->format, "torch_dist");
  inference::InferenceModelOptions o;
  o.load = folder.string();
  model::from_json(ckpt->state.args["model"], o.model);
  o.make_vocab_size_divisible_by = 16;
  o.tokenizer.type = "NullTokenizer";
  o.tokenizer.vocab_size = 60;
  o.tensor_model_parallel_size = tp;
  o.pipeline_model_parallel_size = pp;
  inference::InferenceModel m = inference::load_inference_model(o, world);
  if (!m.leader()) {
    m.follow();
    return {};
  }
  const std::vector<int32_t> tokens = prompt();
  m.model->start(1, kSeq);
  const Tensor logits = m.model->forward(tokens, kSeq, true).to(DType::F64).contiguous();
  m.finish();
  EXPECT_EQ(logits.numel(), kSeq * m.model->vocab_size());
  const double* p = logits.data<double>();
  return std::vector<double>(p, p + logits.numel());
}

void expect_matches_reference(const std::vector<double>& got, const std::string& name, const std::string& layout) {
  const std::vector<double>& want = fixtures().logits.at(name);
  ASSERT_EQ(got.size(), want.size()) << name << " " << layout;
  const int64_t V = int64_t(want.size()) / kSeq;
  const std::vector<double> a = log_probs(got, V), b = log_probs(want, V);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  EXPECT_LT(worst, 1e-5) << name << " under " << layout;
}

TEST(TorchDistCheckpoint, GptAndLlamaLoadOnOneRankWithTheReferenceLogProbs) {
  for (const std::string name : {"gpt2", "llama", "llama_layers"}) {
    const fs::path folder = fixtures().dir / name;
    const auto ckpt = training::find_checkpoint(folder, std::nullopt);
    ASSERT_TRUE(ckpt.has_value());
    EXPECT_EQ(ckpt->state.iteration, 7);
    EXPECT_EQ(ckpt->parallel.tensor_model_parallel_size, 2);  // as saved
    EXPECT_EQ(ckpt->parallel.pipeline_model_parallel_size, 2);
    const json& model = ckpt->state.args["model"];
    EXPECT_EQ(model["num_layers"], 4);
    EXPECT_EQ(model["padded_vocab_size"], 64);
    if (name != "gpt2") {
      EXPECT_EQ(model["normalization"], "RMSNorm");
      EXPECT_EQ(model["num_query_groups"], 2);
      EXPECT_EQ(model["untie_embeddings_and_output_weights"], true);
    }
    expect_matches_reference(load_and_run(folder, 1, 1, nullptr), name, "TP1");
  }
}

TEST(TorchDistCheckpoint, ConvertsToOursTorchAndHuggingFaceGeneratesAndEvaluates) {
  mt::TempDir out;
  const fs::path src = fixtures().dir / "llama";
  const std::string gen = " --prompt '1 2 3 4 5' --num-tokens-to-generate 4 --top_k 1 --return-log-probs"
                          " --output-format jsonl --use-checkpoint-args" + std::string(kTokenizer);
  auto results = [](const std::string& s) { return s.substr(std::min(s.find("\n{"), s.size())); };
  const auto direct = mt::run_cli("generate --load " + src.string() + gen + " 2>&1");
  ASSERT_EQ(direct.exit_code, 0) << direct.output;
  EXPECT_NE(results(direct.output).find("\"logprobs\""), std::string::npos) << direct.output;
  const auto ours = mt::run_cli("checkpoint convert --load " + src.string() + " --save " + (out / "ours").string() +
                                " --target-tensor-parallel-size 2" + kTokenizer + " 2>&1");
  ASSERT_EQ(ours.exit_code, 0) << ours.output;
  const auto via = mt::run_cli("generate --load " + (out / "ours").string() + gen + " 2>&1");
  ASSERT_EQ(via.exit_code, 0) << via.output;
  EXPECT_EQ(results(direct.output), results(via.output));
  const auto pt = mt::run_cli("checkpoint convert --load " + src.string() + " --load-format torch_dist --save " +
                              (out / "pt").string() + " --save-format torch --target-pipeline-parallel-size 2" +
                              kTokenizer + " 2>&1");
  ASSERT_EQ(pt.exit_code, 0) << pt.output;
  EXPECT_TRUE(fs::exists(out / "pt" / "iter_0000007" / "mp_rank_00_001" / "model_optim_rng.pt"));
  const auto via_pt = mt::run_cli("generate --load " + (out / "pt").string() + gen + " 2>&1");
  ASSERT_EQ(via_pt.exit_code, 0) << via_pt.output;
  EXPECT_EQ(results(direct.output), results(via_pt.output));
  std::ofstream(out / "lambada.jsonl") << "{\"text\": \"1 2 3 4 5 6 7\"}\n{\"text\": \"9 8 7 6 5 4\"}\n";
  const auto eval = mt::run_cli("evaluate --task LAMBADA --valid-data " + (out / "lambada.jsonl").string() +
                                " --load " + src.string() + " --use-checkpoint-args --micro-batch-size 1" +
                                kTokenizer + " 2>&1");
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_NE(eval.output.find("total examples: 2.0000E+00"), std::string::npos) << eval.output;
  const auto hf = mt::run_cli("checkpoint convert --load " + src.string() + " --save " + (out / "hf").string() +
                              " --save-format hf" + kTokenizer + " 2>&1");
  ASSERT_EQ(hf.exit_code, 0) << hf.output;
  const json config = json::parse(mt::read_file(out / "hf" / "config.json"));
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["num_key_value_heads"], 2);
}

void expect_writers_optimizer_state(const fs::path& folder);

// The fixture's optimizer state, merged: the writer's values under our names, bit for bit. Saved
// by TP2 x PP2 x DP2 in the distributed optimizer's fully_reshardable format (by DP rank 1), and
// in its default dp_reshardable format: each DP rank's part of each bucket's flat tensors, in
// Megatron's gradient-buffer layout. That fixture's layout tells the plausible alternatives apart:
// the parameters in reverse registration order with linear_proj before linear_qkv (sizes 512 and
// 1536 per rank here), norms and biases of 32 elements followed by gaps (each parameter starts at
// a multiple of 64) holding NaN, the tied embedding in a bucket of its own on both stages, DP
// boundaries inside parameters, and an unpadded bucket end that is not a multiple of 128 DP.
// With Transformer Engine's modules (dp_reshardable_te) the layer's norms sit after linear_proj
// in the buffer: the same bucket sizes, so only the values tell the orders apart. With 2 virtual
// pipeline stages (dp_reshardable_vpp) each rank's optimizer holds a buffer per model chunk
// (gbuf_idx_0: layers 0 and 1 of the two ranks' first chunks with the embedding on stage 0;
// gbuf_idx_1: layers 2 and 3, the final norm and the tied copy on stage 1); with
// --overlap-grad-reduce and 1024-element buckets (dp_reshardable_vpp_buckets) only chunk 0 of
// stage 0 is bucketed (5 buckets; the others one each: bucketing every chunk would not rebuild).
TEST(TorchDistCheckpoint, OptimizerStateMergesToTheWritersValues) {
  for (const std::string name :
       {"gpt2", "dp_reshardable", "dp_reshardable_te", "dp_reshardable_vpp", "dp_reshardable_vpp_buckets"}) {
    SCOPED_TRACE(name);
    expect_writers_optimizer_state(fixtures().dir / name);
  }
}

// Layouts of the dp_reshardable buckets this build cannot rebuild are refused, naming what differs.
TEST(TorchDistCheckpoint, DpReshardableLayoutsThisBuildCannotRebuildAreRefused) {
  for (const auto& [name, what] : std::vector<std::pair<std::string, std::string>>{
           {"dp_reshardable_overlap", "saved 2 buckets, but the model its args describe makes"}}) {
    const fs::path save = fixtures().dir / ("never_" + name);
    const auto r = mt::run_cli("checkpoint convert --load " + (fixtures().dir / name).string() + " --save " +
                               save.string() + kTokenizer + " 2>&1");
    EXPECT_EQ(r.exit_code, 1) << name << ": " << r.output;
    EXPECT_NE(r.output.find(what), std::string::npos) << name << ": " << r.output;
    EXPECT_NE(r.output.find("--dist-ckpt-optim-fully-reshardable"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("internal error"), std::string::npos) << name << ": " << r.output;
    EXPECT_FALSE(fs::exists(save)) << name;
  }
}

void expect_writers_optimizer_state(const fs::path& folder) {
  const fs::path ref = fixtures().dir / "gpt2.ref";
  const json cfg = json::parse(mt::read_file(ref / "config.json"));
  const json opt = json::parse(mt::read_file(ref / "optimizer.json"));
  const std::string raw = mt::read_file(ref / "optimizer.bin");
  const auto ckpt = training::find_checkpoint(folder, std::nullopt);
  ASSERT_TRUE(ckpt.has_value());
  EXPECT_EQ(ckpt->state.optimizer_type, "adam");
  EXPECT_TRUE(ckpt->parallel.distributed_optimizer);
  EXPECT_EQ(ckpt->parallel.data_parallel_size, 2);
  const training::MergedCheckpoint m = training::merge_checkpoint(*ckpt, true);
  EXPECT_EQ(m.optimizer_type, "adam");
  EXPECT_EQ(m.optimizer_step, opt["step"].get<int64_t>());
  EXPECT_EQ(m.optimizer.count("fp32_param"), 0u);  // an fp32 model's main weights are its weights
  size_t at = 0;
  for (const json& kind : opt["kinds"])
    for (const json& p : cfg["params"]) {
      const std::string name = p["name"], k = kind;
      int64_t n = 1;
      for (const json& d : p["shape"]) n *= d.get<int64_t>();
      const float* want = reinterpret_cast<const float*>(raw.data()) + at;
      at += size_t(n);
      const Tensor* got = nullptr;
      if (k == "param") {
        got = &m.model.at(name);
      } else {
        ASSERT_TRUE(m.optimizer.count(k) && m.optimizer.at(k).count(name)) << k << " " << name;
        got = &m.optimizer.at(k).at(name);
      }
      ASSERT_EQ(got->numel(), n) << k << " " << name;
      const Tensor c = got->contiguous();
      EXPECT_EQ(std::memcmp(c.data<float>(), want, size_t(n) * 4), 0) << k << " " << name;
    }
  EXPECT_EQ(at * 4, raw.size());
}

TEST(TorchDistCheckpoint, PretrainFineTunesAndResumesWithItsOptimizerState) {
  mt::TempDir out;
  training::parallel_test::write_corpus((out / "corpus").string());
  const std::string flags =
      " --num-layers 4 --hidden-size 32 --num-attention-heads 4 --max-position-embeddings 32"
      " --make-vocab-size-divisible-by 16 --data-path " + (out / "corpus").string() +
      " --split 100,0,0 --seq-length 32 --micro-batch-size 2 --global-batch-size 2 --eval-iters 0"
      " --log-interval 1 --tokenizer-type NullTokenizer --vocab-size 64";  // EOD 63
  const std::string src = (fixtures().dir / "gpt2").string();
  const std::string dp = (fixtures().dir / "dp_reshardable").string();  // the same, Megatron's default format
  const auto ft = mt::run_cli("pretrain-gpt --load " + src + flags + " --lr 1e-4 --finetune --train-iters 2"
                              " --save-interval 2 --save " + (out / "ft").string() + " 2>&1");
  ASSERT_EQ(ft.exit_code, 0) << ft.output;
  EXPECT_TRUE(fs::exists(out / "ft" / "iter_0000002" / "metadata.json")) << ft.output;
  // A full resume at iteration 7 (optimizer, step count, schedule) continues as a resume from the
  // same state in our format does, and differs from one whose optimizer starts fresh.
  // Under TP2 (two ranks) the state is cut for each rank as the weights are; under PP2 the last
  // stage's tied copy of the word embedding takes the embedding's state.
  for (const std::string layout : {"tensor", "pipeline"})
    for (const std::string n : {"1", "2"}) {
      if (layout == "pipeline" && n == "1") continue;
      const auto ours = mt::run_cli("checkpoint convert --load " + src + " --save " +
                                    (out / ("ours_" + layout + n)).string() + " --target-" + layout +
                                    "-parallel-size " + n + kTokenizer + " 2>&1");
      ASSERT_EQ(ours.exit_code, 0) << ours.output;
    }
  // And as this build writes it (torch_dist again, TP1 x PP2).
  const auto written = mt::run_cli("checkpoint convert --load " + src + " --save " + (out / "written").string() +
                                   " --save-format torch_dist --target-pipeline-parallel-size 2" + kTokenizer + " 2>&1");
  ASSERT_EQ(written.exit_code, 0) << written.output;
  const std::string resume = flags + " --use-checkpoint-opt_param-scheduler --train-iters 9 --save-interval 9";
  const std::string tp2 = " --tensor-model-parallel-size 2 --use-distributed-optimizer";
  const std::string pp2 = " --pipeline-model-parallel-size 2";
  std::map<std::string, training::MergedCheckpoint> after;
  for (const auto& [name, load, extra] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"torch_dist", src, ""}, {"ours", (out / "ours_tensor1").string(), ""},
           {"fresh", src, " --no-load-optim --lr 3e-3"}, {"torch_dist_tp2", src, tp2},
           {"ours_tp2", (out / "ours_tensor2").string(), tp2}, {"torch_dist_pp2", src, pp2},
           {"ours_pp2", (out / "ours_pipeline2").string(), pp2}, {"written", (out / "written").string(), ""},
           {"dp_reshardable", dp, ""}, {"dp_reshardable_tp2", dp, tp2}}) {
    const std::string launch = name.ends_with("2") ? "launch --nproc-per-node 2 -- " : "";
    const auto r = mt::run_cli(launch + "pretrain-gpt --load " + load + resume + extra + " --save " +
                               (out / name).string() + " 2>&1");
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.output;
    EXPECT_NE(r.output.find("iteration        9/"), std::string::npos) << r.output;
    const auto saved = training::find_checkpoint(out / name, std::nullopt);
    ASSERT_TRUE(saved.has_value()) << name;
    EXPECT_EQ(saved->state.iteration, 9);
    after.emplace(name, training::merge_checkpoint(*saved, true));
  }
  EXPECT_EQ(after.at("torch_dist").optimizer_step, 6 + 2);  // the fixture's 6 steps, then 2
  EXPECT_EQ(after.at("torch_dist_tp2").optimizer_step, 6 + 2);
  EXPECT_EQ(after.at("dp_reshardable").optimizer_step, 6 + 2);  // from its "optimizer" ShardedObject
  auto same = [](const Tensor& x, const Tensor& y) {
    const Tensor a = x.contiguous(), b = y.contiguous();
    return a.numel() == b.numel() && std::memcmp(a.data<float>(), b.data<float>(), size_t(a.numel()) * 4) == 0;
  };
  for (const auto& [name, t] : after.at("ours").model) {
    EXPECT_TRUE(same(after.at("torch_dist").model.at(name), t)) << name;
    EXPECT_TRUE(same(after.at("written").model.at(name), t)) << name;
    EXPECT_FALSE(same(after.at("fresh").model.at(name), t)) << name;
    EXPECT_TRUE(same(after.at("dp_reshardable").model.at(name), t)) << name;
    EXPECT_TRUE(same(after.at("dp_reshardable_tp2").model.at(name), after.at("torch_dist_tp2").model.at(name))) << name;
    for (const std::string k : {"exp_avg", "exp_avg_sq"}) {
      EXPECT_TRUE(same(after.at("dp_reshardable").optimizer.at(k).at(name), after.at("ours").optimizer.at(k).at(name)))
          << k << " " << name;
      EXPECT_TRUE(same(after.at("dp_reshardable_tp2").optimizer.at(k).at(name),
                       after.at("torch_dist_tp2").optimizer.at(k).at(name))) << k << " " << name;
    }
    for (const std::string l : {"tp2", "pp2"}) {
      const training::MergedCheckpoint &a = after.at("torch_dist_" + l), &b = after.at("ours_" + l);
      EXPECT_TRUE(same(a.model.at(name), b.model.at(name))) << l << " " << name;
      for (const std::string k : {"exp_avg", "exp_avg_sq"})
        EXPECT_TRUE(same(a.optimizer.at(k).at(name), b.optimizer.at(k).at(name))) << l << " " << k << " " << name;
    }
  }
}

// `checkpoint convert --save-format torch_dist` under other layouts than the fixtures' TP2 x PP2:
// read by the independent Python reader (tests/reference/read_torch_dist.py: the .metadata
// pickle's classes, globals and fields those PyTorch's classes give, every chunk at its file
// offset, the keys, shapes and values of the writer's model and optimizer state bit for bit), and
// read back here bit for bit, also after a second conversion to yet another layout.
TEST(TorchDistCheckpoint, WritesWhatAnIndependentReaderReadsAndReadsBackBitExactly) {
  mt::TempDir out;
  auto equal = [](const Tensor& x, const Tensor& y) {
    const Tensor a = x.contiguous(), b = y.contiguous();
    return a.dtype() == b.dtype() && a.shape() == b.shape() &&
           std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
  };
  auto same_checkpoint = [&](const training::MergedCheckpoint& a, const training::MergedCheckpoint& b,
                             const std::string& what) {
    EXPECT_EQ(a.model.size(), b.model.size()) << what;
    for (const auto& [name, t] : a.model) EXPECT_TRUE(b.model.count(name) && equal(t, b.model.at(name))) << what << " " << name;
    EXPECT_EQ(a.optimizer_type, b.optimizer_type) << what;
    EXPECT_EQ(a.optimizer_step, b.optimizer_step) << what;
    for (const auto& [kind, ts] : a.optimizer)
      for (const auto& [name, t] : ts)
        EXPECT_TRUE(b.optimizer.count(kind) && b.optimizer.at(kind).count(name) && equal(t, b.optimizer.at(kind).at(name)))
            << what << " " << kind << " " << name;
  };
  for (const auto& [name, layout, impl] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"gpt2", " --target-pipeline-parallel-size 2", "local"},
           {"llama", " --target-tensor-parallel-size 2", "transformer_engine"}}) {
    const fs::path src = fixtures().dir / name, dst = out / name;
    const auto r = mt::run_cli("checkpoint convert --load " + src.string() + " --save " + dst.string() +
                               " --save-format torch_dist --transformer-impl " + impl + layout + kTokenizer + " 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(mt::read_file(dst / "latest_checkpointed_iteration.txt"), "7");
    const auto py = mt::run_command("/usr/bin/python3 " + (mt::source_dir() / "tests/reference/read_torch_dist.py").string() +
                                    " check " + name + " " + (dst / "iter_0000007").string() + " " +
                                    (src / "iter_0000007").string() + (impl == "local" ? " --local" : "") + " 2>&1");
    EXPECT_EQ(py.exit_code, 0) << name << ": " << py.output;
    EXPECT_NE(py.output.find("ok: "), std::string::npos) << py.output;
    const auto original = training::find_checkpoint(src, std::nullopt), back = training::find_checkpoint(dst, std::nullopt);
    ASSERT_TRUE(original && back);
    EXPECT_EQ(back->format, "torch_dist");
    EXPECT_EQ(back->parallel.tensor_model_parallel_size, name == "llama" ? 2 : 1);
    EXPECT_EQ(back->parallel.pipeline_model_parallel_size, name == "gpt2" ? 2 : 1);
    same_checkpoint(training::merge_checkpoint(*original, true), training::merge_checkpoint(*back, true), name);
    // Once more, from what was written, to TP2 x PP2 with Transformer Engine's names.
    const fs::path again = out / (name + "_again");
    const auto r2 = mt::run_cli("checkpoint convert --load " + dst.string() + " --save " + again.string() +
                                " --save-format torch_dist --target-tensor-parallel-size 2"
                                " --target-pipeline-parallel-size 2" + kTokenizer + " 2>&1");
    ASSERT_EQ(r2.exit_code, 0) << r2.output;
    const auto twice = training::find_checkpoint(again, std::nullopt);
    ASSERT_TRUE(twice);
    same_checkpoint(training::merge_checkpoint(*original, true), training::merge_checkpoint(*twice, true), name + " again");
  }
}

TEST(TorchDistCheckpoint, HostileFilesAreRefusedAndNothingRuns) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"evil_system", "'posix.system'"},
      {"evil_eval", "'builtins.eval'"},
      {"evil_offset", "lies at bytes"},
      {"evil_shape", "impossible shape"},
      {"evil_overlap", "overlap"},
      {"evil_missing", "cover"},
      {"zarr", "zarr backend"},
  };
  for (const auto& [name, what] : cases) {
    const fs::path save = fixtures().dir / ("never_" + name);
    const auto r = mt::run_cli("checkpoint convert --load " + (fixtures().dir / name).string() + " --save " +
                               save.string() + kTokenizer + " 2>&1");
    EXPECT_EQ(r.exit_code, 1) << name << ": " << r.output;
    EXPECT_NE(r.output.find(what), std::string::npos) << name << ": " << r.output;
    EXPECT_EQ(r.output.find("internal error"), std::string::npos) << name << ": " << r.output;
    EXPECT_FALSE(fs::exists(save)) << name;
  }
  EXPECT_FALSE(fs::exists(fixtures().dir / "marker"));
}

// The private classes of the .metadata pickle are accepted only where that file is read.
TEST(TorchDistCheckpoint, DistcpClassesAreAllowedOnlyInTheMetadataReader) {
  const std::string bytes = mt::read_file(fixtures().dir / "llama" / "iter_0000007" / ".metadata");
  const std::span<const uint8_t> span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  try {
    pickle::unpickle(span, "a .pt file");
    ADD_FAILURE() << "a torch.save reader accepted torch.distributed.checkpoint's private classes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("refusing"), std::string::npos) << e.what();
  }
  const pickle::Document doc = pickle::unpickle_distcp_metadata(span, ".metadata");
  const pickle::Value* storage = doc.root->get("storage_data");
  ASSERT_NE(storage, nullptr);
  ASSERT_FALSE(storage->entries.empty());
  EXPECT_EQ(storage->entries[0].second->text, "torch.distributed.checkpoint.filesystem._StorageInfo");
  const pickle::Value* qkv = doc.root->get("state_dict_metadata")->get("decoder.layers.self_attention.linear_qkv.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->get("properties")->items.size(), 5u);  // TensorProperties' tuple state
  EXPECT_EQ(qkv->get("chunks")->items.size(), 4u * 2u);  // 4 layers x 2 TP ranks
}

// At 2 ranks TP2 x PP1 and TP1 x PP2; at 4, TP2 x PP2 as saved.
TEST(MpiTorchDistCheckpoint, LoadsUnderOtherLayoutsWithTheReferenceLogProbs) {
  const std::shared_ptr<Communicator> world = world_communicator();
  const int W = world->size();
  if (W != 2 && W != 4) GTEST_SKIP() << "runs at -np 2 and 4";
  // Rank 0 writes the fixtures (and computes the references) in a folder every rank sees.
  std::string dir = world->rank() == 0 ? fixtures().dir.string() : "";
  dir = all_gather_strings(*world, dir)[0];
  const std::vector<std::pair<int, int>> layouts =
      W == 2 ? std::vector<std::pair<int, int>>{{2, 1}, {1, 2}} : std::vector<std::pair<int, int>>{{2, 2}};
  for (const std::string name : {"gpt2", "llama", "llama_layers"})
    for (const auto& [tp, pp] : layouts) {
      const std::vector<double> got = load_and_run(fs::path(dir) / name, tp, pp, world);
      if (world->rank() == 0)  // the leader of the only model-parallel group
        expect_matches_reference(got, name, "TP" + std::to_string(tp) + " x PP" + std::to_string(pp));
      world->barrier();
    }
}

}  // namespace
}  // namespace megatron
