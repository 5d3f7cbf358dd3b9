// Helpers of the multi-rank training parity tests (parallel_test.cpp, pipeline_training_test.cpp,
// llama_*_test.cpp): a folder every rank sees, the tiny corpus and GPT they train, the single-rank
// reference run, and comparisons of loss curves (training, grad norm, validation), of checkpointed
// parameters gathered over TP and PP and of checkpointed optimizer state.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/safetensors.h"
#include "data/indexed_dataset.h"
#include "model/weight_spec.h"
#include "test_util.h"
#include "training/checkpoint_convert.h"
#include "training/trainer.h"

namespace megatron::training::parallel_test {

namespace fs = std::filesystem;
using json = nlohmann::json;

inline std::shared_ptr<Communicator> world() { return world_communicator(); }

// A folder every rank sees: rank 0 creates (and removes) it and tells the others its name.
class SharedDir {
 public:
  SharedDir() {
    if (world()->rank() == 0) owned_ = std::make_unique<testing::TempDir>();
    path_ = all_gather_strings(*world(), owned_ ? owned_->path().string() : "")[0];
  }
  ~SharedDir() { world()->barrier(); }  // nobody still reads when rank 0 removes it
  const fs::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::unique_ptr<testing::TempDir> owned_;
  fs::path path_;
};

inline void write_corpus(const std::string& prefix) {
  data::IndexedDatasetBuilder b(prefix, data::IndexDType::U16);
  for (int d = 0; d < 200; ++d) {  // arithmetic sequences mod 60, EOD = 63
    std::vector<int32_t> doc;
    const int step = 1 + d % 5;
    for (int i = 0; i < 40; ++i) doc.push_back((d + i * step) % 60);
    doc.push_back(63);
    b.add_item(doc);
    b.end_document();
  }
  b.finalize();
}

// The tiny model and schedule the training tests share: 2 layers, hidden 32, 4 heads, sequence
// `seq` (and as many positions), dropout 0, data `data_path` split 90,10,0 with its index cache
// in `cache`, micro-batch 2, global batch 8, `iters` iterations of cosine LR 3e-3 -> 3e-4 after 3
// warm-up iterations, logging off, one evaluation iteration every 1000.
inline TrainingArgs tiny_training_args(int seq, const fs::path& data_path, const fs::path& cache,
                                       int64_t iters) {
  TrainingArgs a;
  a.model.num_layers = 2;
  a.model.hidden_size = 32;
  a.model.num_attention_heads = 4;
  a.model.seq_length = seq;
  a.model.max_position_embeddings = seq;
  a.model.hidden_dropout = 0.0f;
  a.model.attention_dropout = 0.0f;
  a.data.data_path = {data_path.string()};
  a.data.split = "90,10,0";
  a.data.data_cache_path = cache.string();
  a.micro_batch_size = 2;
  a.global_batch_size = 8;
  a.train_iters = iters;
  a.lr = 3e-3;
  a.min_lr = 3e-4;
  a.lr_decay_style = "cosine";
  a.lr_warmup_iters = 3;
  a.log_interval = 1000;
  a.eval_interval = 1000;
  a.eval_iters = 1;
  return a;
}

// The tiny GPT the training tests train on write_corpus's data in `dir` ("corpus", index cache
// in "cache"): tiny_training_args with sequence 16 and vocabulary 64 (padded to 64 under TP 1, 2
// and 4).
inline TrainingArgs tiny_gpt_args(const fs::path& dir, int64_t iters) {
  TrainingArgs a = tiny_training_args(16, dir / "corpus", dir / "cache", iters);
  a.make_vocab_size_divisible_by = 16;
  a.tokenizer.type = "NullTokenizer";
  a.tokenizer.vocab_size = 64;
  return a;
}

struct Fixture {
  SharedDir dir;
  std::string prefix = dir / "corpus";
  Fixture() {
    if (world()->rank() == 0) write_corpus(prefix);
    world()->barrier();
  }
  TrainingArgs args(int64_t iters = 20) const {
    TrainingArgs a = tiny_gpt_args(dir.path(), iters);
    a.eval_interval = 10;
    return a;
  }
};

inline TrainingSummary run_single(TrainingArgs a) { return pretrain(std::move(a), make_self_communicator("world")); }

// Rank 0 trains `a` alone (saving to `save`); every rank gets its loss and grad-norm curve.
inline TrainingSummary reference_curve(TrainingArgs a, const std::string& save) {
  TrainingSummary r;
  std::string text;
  if (world()->rank() == 0) {
    a.save = save;
    a.save_interval = 1000;
    r = run_single(a);
    text = json({{"losses", r.losses}, {"more_losses", r.more_losses}, {"grad_norms", r.grad_norms},
                 {"valid_losses", r.valid_losses}, {"consumed", r.consumed_samples}}).dump();
  }
  const json j = json::parse(all_gather_strings(*world(), text)[0]);
  r.losses = j["losses"].get<std::vector<double>>();
  r.more_losses = j["more_losses"].get<std::vector<std::vector<double>>>();
  r.grad_norms.clear();
  for (const json& g : j["grad_norms"]) r.grad_norms.push_back(g.is_number() ? g.get<double>() : std::nan(""));
  r.valid_losses = j["valid_losses"].get<std::vector<double>>();
  r.consumed_samples = j["consumed"].get<int64_t>();
  return r;
}

// The checkpoint's model tensors with every tensor-parallel shard put back together and every
// pipeline stage's tensors merged (their names are global: "decoder.layers.<i>...").
inline std::map<std::string, std::vector<float>> gathered_model(const std::string& save, int64_t it) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", (long long)it);
  const fs::path dir = fs::path(save) / name;
  const json meta = json::parse(testing::read_file(dir / "metadata.json"));
  const bool has_parallel = meta.contains("parallel");
  if (meta.contains("sharded_backend") ||
      (has_parallel && meta["parallel"].contains("expert_tensor_parallel_size"))) {
    // Megatron's torch_dist (global keys), or experts sharded otherwise than the dense layers
    // (parallel folding): through the merge.
    const auto ckpt = find_checkpoint(save, it);
    EXPECT_TRUE(ckpt.has_value()) << save;
    std::map<std::string, std::vector<float>> out;
    if (ckpt)
      for (const auto& [n, t] : merge_checkpoint(*ckpt, false).model) out[n] = t.to_float_vector();
    return out;
  }
  const int tp = has_parallel ? meta["parallel"]["tensor_model_parallel_size"].get<int>() : 1;
  const int pp = has_parallel ? meta["parallel"]["pipeline_model_parallel_size"].get<int>() : 1;
  const int ep = has_parallel ? meta["parallel"].value("expert_model_parallel_size", 1) : 1;
  std::map<std::string, std::vector<float>> out;
  for (int stage = 0; stage < pp; ++stage) {
    std::vector<SafetensorsContents> shards;
    for (int r = 0; r < tp; ++r) {
      // Under expert parallelism (mp_rank_TT[_PPP]_EEE) each folder holds the dense tensors and
      // its own experts: their union, the dense ones equal in every folder.
      SafetensorsContents all;
      for (int e = 0; e < ep; ++e) {
        const std::string rd = checkpoint_rank_dir(r, pp, stage, ep, e);
        for (auto& [n, t] : read_safetensors(dir / rd / "model.safetensors").tensors) {
          auto [it, fresh] = all.tensors.emplace(n, t);
          if (!fresh) {
            EXPECT_TRUE(n.find(".mlp.experts.") == std::string::npos) << n << " is in two EP folders";
            EXPECT_EQ(it->second.to_float_vector(), t.to_float_vector()) << n << " differs in " << rd;
          }
        }
      }
      shards.push_back(std::move(all));
    }
    for (const auto& [n, t0] : shards[0].tensors) {
      EXPECT_FALSE(out.count(n)) << n << " is saved by two pipeline stages";
      const model::WeightSpec spec = model::weight_spec_from_json(n, meta["weights"][n], "metadata");
      const int pdim = tp > 1 ? spec.partition_dim : -1;
      std::vector<Tensor> parts;
      for (int r = 0; r < tp; ++r) parts.push_back(shards[size_t(r)].tensors.at(n));
      if (pdim < 0) {
        for (int r = 1; r < tp; ++r)  // replicated: every rank saved the same values
          EXPECT_EQ(parts[size_t(r)].to_float_vector(), parts[0].to_float_vector()) << n;
      }
      out[n] = merge_shards(parts, shard_rule(spec)).to_float_vector();
    }
  }
  return out;
}

// Each tensor's largest difference relative to its largest |value|. The key part of the QKV bias
// is compared loosely: it gets no gradient at all (it adds a constant per query to every
// attention score, which the softmax ignores), so its "gradient" is rounding noise that Adam
// normalises into steps of up to lr, different in every summation order. It never changes the
// model's output. Key rows: [d, 2d) of every 3d-row query group (interleaved layout, no GQA).
inline void expect_same_params(const std::string& got_save, const std::string& ref_save, int64_t it,
                        double tol, int64_t head_dim = 8) {
  const auto got = gathered_model(got_save, it), ref = gathered_model(ref_save, it);
  ASSERT_EQ(got.size(), ref.size());
  for (const auto& [n, r] : ref) {
    const auto& g = got.at(n);
    ASSERT_EQ(g.size(), r.size()) << n;
    // A key bias has no gradient (it shifts every score of a query alike), so Adam moves it by
    // rounding noise: self-attention's [q; k; v] rows per head, cross-attention's [k; v].
    const bool qkv_bias = n.ends_with("linear_qkv.bias"), kv_bias = n.ends_with("linear_kv.bias");
    double scale = 1e-30, worst = 0, worst_key = 0;
    for (float v : r) scale = std::max(scale, double(std::abs(v)));
    for (size_t i = 0; i < r.size(); ++i) {
      const double d = std::abs(double(g[i]) - r[i]);
      const int64_t row = int64_t(i) % ((kv_bias ? 2 : 3) * head_dim);
      if ((qkv_bias && row >= head_dim && row < 2 * head_dim) || (kv_bias && row < head_dim))
        worst_key = std::max(worst_key, d);
      else
        worst = std::max(worst, d);
    }
    EXPECT_LE(worst / scale, tol) << n;
    EXPECT_LE(worst_key, 1e-4) << n << " (key bias)";
    if (std::getenv("MG_PRINT_PARAM_DIFF"))  // the numbers behind the tolerances
      std::printf("param diff %-55s %.3g (key bias %.3g)\n", n.c_str(), worst / scale, worst_key);
  }
}

// The checkpoint's optimizer state merged into single-rank tensors (merge_checkpoint: any TP x PP
// layout, plain optimizer or distributed-optimizer shards under any DP size) against the
// reference's: the step counts equal, and each tensor's largest difference relative to its
// largest |value| is within main_tol for the fp32 main weights ("fp32_param", kept for bf16/fp16
// models; the checkpoint's model tensors are those rounded to the parameter dtype, which hides
// differences below half an ulp of it) and within moment_tol for the Adam moments.
inline void expect_same_optimizer_state(const std::string& got_save, const std::string& ref_save,
                                        int64_t it, double main_tol, double moment_tol) {
  const MergedCheckpoint got = merge_checkpoint(find_checkpoint(got_save, it).value(), true);
  const MergedCheckpoint ref = merge_checkpoint(find_checkpoint(ref_save, it).value(), true);
  EXPECT_EQ(got.optimizer_step, ref.optimizer_step);
  ASSERT_EQ(got.optimizer.size(), ref.optimizer.size());
  for (const auto& [kind, tensors] : ref.optimizer) {
    const double tol = kind == "fp32_param" ? main_tol : moment_tol;
    ASSERT_EQ(got.optimizer.at(kind).size(), tensors.size()) << kind;
    for (const auto& [n, t] : tensors) {
      const std::vector<float> r = t.to_float_vector();
      const std::vector<float> g = got.optimizer.at(kind).at(n).to_float_vector();
      ASSERT_EQ(g.size(), r.size()) << kind << " " << n;
      double scale = 1e-30, worst = 0;
      for (float v : r) scale = std::max(scale, double(std::abs(v)));
      for (size_t i = 0; i < r.size(); ++i) worst = std::max(worst, std::abs(double(g[i]) - r[i]));
      EXPECT_LE(worst / scale, tol) << kind << " " << n;
      if (std::getenv("MG_PRINT_PARAM_DIFF"))
        std::printf("optimizer diff %-10s %-55s %.3g\n", kind.c_str(), n.c_str(), worst / scale);
    }
  }
}

inline void expect_same_curve(const TrainingSummary& got, const TrainingSummary& ref, double tol,
                       const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], ref.losses[i], tol * std::abs(ref.losses[i]))
        << what << ": iteration " << i + 1;
    if (std::isfinite(ref.grad_norms[i])) {
      EXPECT_NEAR(got.grad_norms[i], ref.grad_norms[i], 10 * tol * ref.grad_norms[i])
          << what << ": grad norm, iteration " << i + 1;
    }
  }
  ASSERT_EQ(got.valid_losses.size(), ref.valid_losses.size()) << what;
  for (size_t i = 0; i < ref.valid_losses.size(); ++i)
    EXPECT_NEAR(got.valid_losses[i], ref.valid_losses[i], tol * std::abs(ref.valid_losses[i]))
        << what << ": validation loss " << i + 1;
}

#define SKIP_ON_ONE_RANK() \
  if (world()->size() == 1) GTEST_SKIP() << "needs mpirun -np 2 or 4 (label mpi)"

// Bit-equal doubles, a NaN equal to a NaN (the grad norm of a skipped iteration).
inline bool same_bits(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// `rest`, loaded at iteration `split`, continues `whole` (the uninterrupted run) bit for bit:
// consumed samples, losses, grad norms and the family's further (MoE, BERT) losses.
inline void expect_resumed_curve(const TrainingSummary& rest, const TrainingSummary& whole, int64_t split,
                                 const std::string& what = "") {
  ASSERT_EQ(rest.start_iteration, split) << what;
  ASSERT_EQ(rest.losses.size() + size_t(split), whole.losses.size()) << what;
  EXPECT_EQ(rest.consumed_samples, whole.consumed_samples) << what;
  ASSERT_EQ(rest.more_losses.size(), rest.losses.size()) << what;
  for (size_t i = 0; i < rest.losses.size(); ++i) {
    const size_t w = size_t(split) + i;
    EXPECT_EQ(rest.losses[i], whole.losses[w]) << what << ": iteration " << w + 1;
    EXPECT_TRUE(same_bits(rest.grad_norms[i], whole.grad_norms[w]))
        << what << ": grad norm, iteration " << w + 1 << ": " << rest.grad_norms[i] << " vs " << whole.grad_norms[w];
    EXPECT_EQ(rest.more_losses[i], whole.more_losses[w]) << what << ": further losses, iteration " << w + 1;
  }
}

// `folder`, saved under another layout, loaded at iteration `split` by `under` (its layout, in
// `format`): the resumed losses follow `uninterrupted`'s curve (trained from scratch in one go)
// within 1e-5 relative. Both runs save to fresh folders under `dir`.
inline void expect_curve_resumed_under(TrainingArgs under, const std::string& format, const std::string& folder,
                                       int64_t split, TrainingArgs uninterrupted, const SharedDir& dir) {
  under.ckpt_format = format;
  under.load = folder;
  under.ckpt_step = split;
  under.save = dir / "resumed_under_another_layout";
  under.save_interval = 1000;
  const TrainingSummary r = pretrain(under);
  ASSERT_EQ(r.start_iteration, split);
  uninterrupted.save = dir / "uninterrupted_again";
  uninterrupted.save_interval = 1000;
  const TrainingSummary whole = pretrain(uninterrupted);
  ASSERT_EQ(r.losses.size() + size_t(split), whole.losses.size());
  for (size_t i = 0; i < r.losses.size(); ++i)
    EXPECT_NEAR(r.losses[i], whole.losses[size_t(split) + i], 1e-5 * whole.losses[size_t(split) + i])
        << "iteration " << split + int64_t(i) + 1;
}

// What expect_exact_resume checks beyond the curve and the final parameters.
struct ResumeExtras {
  bool optimizer = false;  // the final optimizer state too, bit for bit (rank 0)
  std::function<void(const fs::path&)> at_split;  // rank 0, on the split iteration's folder
};

// Exact resume: `args` trained by `run` in one go, saved to full_dir, and in two parts (saved
// and stopped at iteration `split` in resume_dir, then loaded from it): the resumed iterations
// continue the uninterrupted curve bit for bit (expect_resumed_curve), and the final parameters
// are the same.
template <class Run>
void expect_exact_resume(const TrainingArgs& args, const std::string& full_dir,
                         const std::string& resume_dir, Run run, int64_t split = 10,
                         const ResumeExtras& extras = {}) {
  TrainingArgs full = args;
  full.save = full_dir;
  full.save_interval = 1000;
  const TrainingSummary whole = run(full);
  TrainingArgs first = args;
  first.save = resume_dir;
  first.save_interval = split;
  first.exit_interval = split;
  run(first);
  if (extras.at_split && world()->rank() == 0) {
    char it[32];
    std::snprintf(it, sizeof it, "iter_%07lld", (long long)split);
    extras.at_split(fs::path(resume_dir) / it);
  }
  TrainingArgs second = first;
  second.load = first.save;
  second.exit_interval = 0;
  second.save_interval = 1000;
  const TrainingSummary rest = run(second);
  expect_resumed_curve(rest, whole, split, resume_dir);
  if (world()->rank() == 0) {
    expect_same_params(second.save, full.save, args.train_iters, 0.0);
    if (extras.optimizer) expect_same_optimizer_state(second.save, full.save, args.train_iters, 0.0, 0.0);
  }
  world()->barrier();
}

// A run in another checkpoint format resumed on the curve of this build's format.
struct FormatResume {
  TrainingArgs saved;      // the run that wrote the other format (its save folder)
  TrainingSummary whole;   // the uninterrupted run in this build's format (saved at 2 and 4)
};

// `a` trains 4 iterations uninterrupted in this build's format (saved at 2 and 4 in
// dir/NAME_full), then 2 with --ckpt-format `format` in dir/NAME_SUFFIX; `saved` runs on rank 0
// on that folder's iteration 2; a resume from it for the last 2 continues the uninterrupted curve
// bit for bit.
template <class Saved>
FormatResume save_in_format_and_resume(const SharedDir& dir, TrainingArgs a, const std::string& name,
                                       const std::string& format, const std::string& suffix, Saved saved) {
  a.save = dir / (name + "_full");
  a.save_interval = 2;
  FormatResume out;
  out.whole = pretrain(a);
  EXPECT_EQ(out.whole.losses.size(), 4u);
  TrainingArgs b = a;
  b.ckpt_format = format;
  b.save = dir / (name + "_" + suffix);
  b.save_interval = 1000;
  b.exit_interval = 2;
  EXPECT_EQ(pretrain(b).iterations, 2);
  if (world()->rank() == 0) saved(fs::path(b.save) / "iter_0000002");
  b.exit_interval = 0;
  b.load = b.save;
  expect_resumed_curve(pretrain(b), out.whole, 2, name);
  out.saved = b;
  return out;
}

// Rank 0: the checkpoint in `other_save` (any format) at iteration `it` holds the same model
// tensors, bit for bit, as this build's checkpoint of the same iteration in `our_save`.
inline void expect_same_merged_model(const std::string& other_save, const std::string& our_save, int64_t it) {
  const auto ckpt = find_checkpoint(other_save, std::nullopt);
  ASSERT_TRUE(ckpt.has_value()) << other_save;
  EXPECT_EQ(ckpt->state.iteration, it) << other_save;
  const MergedCheckpoint m = merge_checkpoint(*ckpt, false);
  const auto ref = gathered_model(our_save, it);
  EXPECT_EQ(m.model.size(), ref.size());
  for (const auto& [n, v] : ref) EXPECT_TRUE(m.model.count(n) && m.model.at(n).to_float_vector() == v) << n;
}

// The same for one rank, in dir/full and dir/resume.
inline void expect_exact_resume(const TrainingArgs& base, const fs::path& dir, int64_t split) {
  expect_exact_resume(base, (dir / "full").string(), (dir / "resume").string(),
                      [](const TrainingArgs& a) { return run_single(a); }, split);
}

}  // namespace megatron::training::parallel_test
