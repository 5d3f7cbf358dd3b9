// Non-finite weights are refused by every reader of other tools' checkpoints, with an error naming
// the file and the tensor: Megatron-LM rank files written by Debian's torch
// (tests/reference/megatron_checkpoint.py, then one value set to NaN or an infinity with torch)
// through `pretrain-gpt --load` (weights and optimizer state) and `checkpoint convert`, and
// Hugging Face folders through `checkpoint convert --load-format hf`. The same files without the
// bad value load, so the refusals are about the value alone. (Our own format:
// tests/training/checkpoint_integrity_test.cpp.)
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "core/safetensors.h"
#include "data/indexed_dataset.h"
#include "interop/hf_reference_util.h"
#include "test_util.h"

namespace megatron {
namespace {

namespace fs = std::filesystem;
namespace mt = megatron::testing;

// A one-rank fp32 Megatron-Core checkpoint ("clean", iteration 7) and copies of it with one value
// changed: a NaN in a weight, an infinity in an Adam moment.
const char* const kMakeTorchCheckpoints = R"(
import os, shutil, sys
out, ref = sys.argv[1], sys.argv[2]
sys.path.insert(0, ref)
import torch
import megatron_checkpoint as m
m.write_fake_modules(out)
m.make_variant(out, "clean", "core", 3, 1, 1, 1, "fp32")

def edited(name, edit):
    shutil.copytree(os.path.join(out, "clean", "megatron"), os.path.join(out, name))
    f = os.path.join(out, name, "iter_0000007", "mp_rank_00", "model_optim_rng.pt")
    sd = torch.load(f)
    edit(sd)
    torch.save(sd, f)

def nan_weight(sd):
    sd["model"]["decoder.layers.1.mlp.linear_fc1.weight"][5, 3] = float("nan")

def inf_moment(sd):
    state = sd["optimizer"]["state"]
    state[min(state)]["exp_avg_sq"].view(-1)[2] = float("inf")

edited("nan_weight", nan_weight)
edited("inf_moment", inf_moment)
)";

const fs::path& torch_checkpoints() {
  static mt::TempDir dir;
  static bool made = false;
  if (!made) {
    mt::write_file(dir / "make.py", kMakeTorchCheckpoints);
    const auto r = mt::run_command("/usr/bin/python3 " + (dir / "make.py").string() + " " + dir.path().string() +
                                   " " + (mt::source_dir() / "tests/reference").string() + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    made = true;
  }
  return dir.path();
}

// The reference script's model (4 layers, hidden 32, 4 heads, 32 positions, 60 tokens padded to 64).
const std::string kModel =
    " --num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 32"
    " --max-position-embeddings 32 --tokenizer-type NullTokenizer --vocab-size 60"
    " --make-vocab-size-divisible-by 16 ";

// A small corpus of token ids below 60 for the resumed runs.
const std::string& corpus() {
  static mt::TempDir dir;
  static const std::string prefix = [] {
    const std::string p = (dir / "corpus").string();
    data::IndexedDatasetBuilder b(p, data::IndexDType::U16);
    for (int d = 0; d < 40; ++d) {
      std::vector<int32_t> doc;
      for (int i = 0; i < 40; ++i) doc.push_back((d + i * 7) % 59);
      doc.push_back(59);
      b.add_item(doc);
      b.end_document();
    }
    b.finalize();
    return p;
  }();
  return prefix;
}

mt::CommandResult resume(const fs::path& ckpt) {
  return mt::run_cli("pretrain-gpt" + kModel + "--micro-batch-size 2 --global-batch-size 8 --lr 3e-3 "
                     "--train-iters 8 --data-path " + corpus() + " --split 1 --eval-iters 0 "
                     "--use-checkpoint-opt_param-scheduler --load " +
                     ckpt.string() + " 2>&1");
}

mt::CommandResult convert(const fs::path& ckpt, const fs::path& save, const std::string& extra = "") {
  return mt::run_cli("checkpoint convert --load " + ckpt.string() + " --save " + save.string() + " " + extra +
                     " 2>&1");
}

#define EXPECT_FAILS_WITH(result, ...)                                                               \
  do {                                                                                               \
    const auto& r_ = (result);                                                                       \
    EXPECT_EQ(r_.exit_code, 1) << r_.output;                                                         \
    for (const std::string& n_ : std::vector<std::string>{__VA_ARGS__})                              \
      EXPECT_NE(r_.output.find(n_), std::string::npos) << "missing '" << n_ << "' in\n" << r_.output; \
  } while (0)

TEST(NonFiniteWeights, MegatronRankFilesAreRefusedNamingTheTensor) {
  const fs::path& dir = torch_checkpoints();
  mt::TempDir out;
  // The unedited checkpoint resumes and converts.
  const auto good = resume(dir / "clean" / "megatron");
  EXPECT_EQ(good.exit_code, 0) << good.output;
  const auto good_convert = convert(dir / "clean" / "megatron", out / "clean");
  EXPECT_EQ(good_convert.exit_code, 0) << good_convert.output;

  const std::string nan_file = (dir / "nan_weight/iter_0000007/mp_rank_00/model_optim_rng.pt").string();
  // linear_fc1.weight is [128, 32]: element (5, 3) is the 163rd.
  const std::string nan_msg = "tensor 'decoder.layers.1.mlp.linear_fc1.weight' holds NaN (element 163 of 4096)";
  EXPECT_FAILS_WITH(resume(dir / "nan_weight"), nan_file, nan_msg);
  EXPECT_FAILS_WITH(convert(dir / "nan_weight", out / "nan"), nan_file, nan_msg);
  EXPECT_FAILS_WITH(convert(dir / "nan_weight", out / "nan_tp2", "--target-tensor-parallel-size 2"), nan_file,
                    nan_msg);
  EXPECT_FALSE(fs::exists(out / "nan"));

  // The optimizer state is read with the weights: an infinite moment is refused too.
  const std::string inf_file = (dir / "inf_moment/iter_0000007/mp_rank_00/model_optim_rng.pt").string();
  const std::string inf_msg = "(optimizer exp_avg_sq)' holds an infinity (element 2 of";
  EXPECT_FAILS_WITH(resume(dir / "inf_moment"), inf_file, inf_msg);
  EXPECT_FAILS_WITH(convert(dir / "inf_moment", out / "inf"), inf_file, inf_msg);
}

// The tests' hand-made transformers GPT-2 folder (1 layer, n_embd 8), its weights in `dtype`,
// element bad_element (if >= 0) of the first attention output projection -inf.
fs::path write_gpt2_folder(const fs::path& dir, DType dtype, int64_t bad_element) {
  auto tensors = training::hf_test::tiny_gpt2_tensors();
  for (auto& [name, t] : tensors) {
    if (name == "transformer.h.0.attn.c_proj.weight" && bad_element >= 0)
      t.data<float>()[bad_element] = -std::numeric_limits<float>::infinity();
    t = t.to(dtype);
  }
  return training::hf_test::write_folder(dir, training::hf_test::tiny_gpt2_config(), tensors);
}

TEST(NonFiniteWeights, HuggingFaceFoldersAreRefusedNamingTheTensor) {
  mt::TempDir tmp;
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    const std::string name = dtype_name(dtype);
    SCOPED_TRACE(name);
    const auto good = convert(write_gpt2_folder(tmp / ("good_" + name), dtype, -1), tmp / ("out_good_" + name),
                              "--load-format hf");
    EXPECT_EQ(good.exit_code, 0) << good.output;
    const fs::path bad = write_gpt2_folder(tmp / ("inf_" + name), dtype, 13);
    EXPECT_FAILS_WITH(convert(bad, tmp / ("out_inf_" + name), "--load-format hf"),
                      (bad / "model.safetensors").string(),
                      "tensor 'transformer.h.0.attn.c_proj.weight' holds an infinity (element 13 of 64)",
                      "save it again from a model whose weights are finite");
    EXPECT_FALSE(fs::exists(tmp / ("out_inf_" + name)));
  }
}

}  // namespace
}  // namespace megatron
