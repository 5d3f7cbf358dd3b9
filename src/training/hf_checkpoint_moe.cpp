// The mixture-of-experts block of a Mixtral or Qwen2-MoE layer, exported and imported
// (hf_checkpoint_internal.h has the names and layouts).
#include <string>

#include "core/error.h"
#include "training/hf_checkpoint_internal.h"

namespace megatron::training::hf_detail {

namespace {

std::string ours(int layer) { return "decoder.layers." + std::to_string(layer) + ".mlp."; }

// The names of one architecture's block.
struct Names {
  std::string block;             // "layers.L.block_sparse_moe." / "layers.L.mlp."
  const char *gate, *up, *down;  // an expert's (and the shared expert's) three matrices
};
Names names(int layer, model::HfArch arch) {
  const std::string l = "layers." + std::to_string(layer) + ".";
  if (arch == model::HfArch::mixtral) return {l + "block_sparse_moe.", "w1", "w3", "w2"};
  MG_CHECK(arch == model::HfArch::qwen2_moe, "no mixture-of-experts names for ", model::kHfArchNames[size_t(arch)]);
  return {l + "mlp.", "gate_proj", "up_proj", "down_proj"};
}

}  // namespace

void export_moe_block(const MoeExportIo& io, const model::TransformerConfig& c, int layer, model::HfArch arch) {
  const std::string o = ours(layer);
  const Names n = names(layer, arch);
  const std::string h = "model." + n.block;
  // An SwiGLU MLP: [gate; up] of f rows each, down.
  auto mlp = [&](const std::string& fc1, const std::string& fc2, const std::string& to, int64_t f,
                 const char* flag) {
    const Tensor& w = io.take(fc1);
    MG_REQUIRE(w.dim() == 2 && w.size(0) == 2 * f, fc1, " has shape ", shape_str(w.shape()),
               ", not [gate; up] of ", f, " rows each (", flag, ")");
    io.add(to + n.gate + ".weight", w.narrow(0, 0, f));
    io.add(to + n.up + ".weight", w.narrow(0, f, f));
    io.add(to + n.down + ".weight", io.take(fc2));
  };
  io.add(h + "gate.weight", io.take(o + "router.weight"));
  // The grouped layout (--moe-grouped-gemm) holds the same matrices under other names.
  const bool grouped = io.has(o + "experts.linear_fc1.weight0");
  for (int e = 0; e < c.num_moe_experts; ++e) {
    const std::string x = std::to_string(e);
    if (grouped)
      mlp(o + "experts.linear_fc1.weight" + x, o + "experts.linear_fc2.weight" + x, h + "experts." + x + ".",
          c.moe_ffn(), "--moe-ffn-hidden-size");
    else
      mlp(o + "experts.local_experts." + x + ".linear_fc1.weight",
          o + "experts.local_experts." + x + ".linear_fc2.weight", h + "experts." + x + ".", c.moe_ffn(),
          "--moe-ffn-hidden-size");
  }
  if (arch == model::HfArch::qwen2_moe) {
    mlp(o + "shared_experts.linear_fc1.weight", o + "shared_experts.linear_fc2.weight", h + "shared_expert.",
        c.moe_shared_expert_intermediate_size, "--moe-shared-expert-intermediate-size");
    io.add(h + "shared_expert_gate.weight", io.take(o + "shared_experts.gate_weight"));
  }
}

void import_moe_block(const std::function<Tensor(const std::string&, const Shape&)>& take,
                      const model::TransformerConfig& c, int layer, model::HfArch arch,
                      std::map<std::string, Tensor>& out) {
  const std::string o = ours(layer);
  const Names n = names(layer, arch);
  const int64_t hidden = c.hidden_size;
  auto mlp = [&](const std::string& from, const std::string& to, int64_t f) {
    out[to + "linear_fc1.weight"] = cat_rows({take(from + n.gate + ".weight", {f, hidden}),
                                              take(from + n.up + ".weight", {f, hidden})});
    out[to + "linear_fc2.weight"] = take(from + n.down + ".weight", {hidden, f});
  };
  out[o + "router.weight"] = take(n.block + "gate.weight", {c.num_moe_experts, hidden});
  for (int e = 0; e < c.num_moe_experts; ++e) {
    const std::string x = std::to_string(e);
    mlp(n.block + "experts." + x + ".", o + "experts.local_experts." + x + ".", c.moe_ffn());
  }
  if (arch == model::HfArch::qwen2_moe) {
    mlp(n.block + "shared_expert.", o + "shared_experts.", c.moe_shared_expert_intermediate_size);
    out[o + "shared_experts.gate_weight"] = take(n.block + "shared_expert_gate.weight", {1, hidden});
  }
}

}  // namespace megatron::training::hf_detail
