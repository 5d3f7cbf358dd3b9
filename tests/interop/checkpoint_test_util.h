// Helpers of the checkpoint interop tests: bit-for-bit tensor comparison, a merged checkpoint as
// the reference files of tests/reference/megatron_checkpoint.py hold it, and the script itself.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>

#include "core/tensor.h"
#include "test_util.h"
#include "training/checkpoint_convert.h"

namespace megatron::training::interop_testing {

// Same dtype, shape and bytes.
inline bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
}

// "model/<name>", "<kind>/<name>", "step" (with an optimizer), as reference.safetensors holds them.
inline std::map<std::string, Tensor> everything(const MergedCheckpoint& m) {
  std::map<std::string, Tensor> out;
  for (const auto& [n, t] : m.model) out["model/" + n] = t;
  for (const auto& [kind, ts] : m.optimizer)
    for (const auto& [n, t] : ts) out[kind + "/" + n] = t;
  if (!m.optimizer_type.empty()) {
    Tensor step = Tensor::empty({}, DType::I64);
    *step.data<int64_t>() = m.optimizer_step;
    out["step"] = step;
  }
  return out;
}

// Every tensor of `ref` is in `got`, bit for bit, and nothing else.
inline void expect_bit_equal(const std::map<std::string, Tensor>& got,
                             const std::map<std::string, Tensor>& ref, const std::string& what) {
  EXPECT_EQ(got.size(), ref.size()) << what;
  for (const auto& [n, t] : ref) {
    auto it = got.find(n);
    ASSERT_NE(it, got.end()) << what << ": " << n;
    EXPECT_TRUE(bit_equal(it->second, t)) << what << ": " << n;
  }
}

// checkpoint convert of `from` into `to` for TP = tp x PP = pp in `format` (Megatron's
// --transformer-impl `impl` for "torch"), the unpadded vocabulary `true_vocab` tokens.
inline ConvertResult convert_to(const std::filesystem::path& from, const std::filesystem::path& to,
                                int tp, int pp, const std::string& format, const std::string& impl,
                                int64_t true_vocab) {
  ConvertOptions o;
  o.load = from;
  o.save = to;
  o.target_tp = tp;
  o.target_pp = pp;
  o.save_format = format;
  o.transformer_impl = impl;
  o.true_vocab_size = true_vocab;
  return convert_checkpoint(o);
}

// tests/reference/megatron_checkpoint.py with `args`; its output (a failure is a test failure).
inline std::string megatron_reference(const std::string& args) {
  const auto r = megatron::testing::run_command(
      "/usr/bin/python3 " +
      (megatron::testing::source_dir() / "tests/reference/megatron_checkpoint.py").string() + " " +
      args + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

}  // namespace megatron::training::interop_testing
