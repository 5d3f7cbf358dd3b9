// The mixture-of-experts block of a Mixtral layer, exported and imported (hf_checkpoint_internal.h
// has the names and layouts).
#include <string>

#include "core/error.h"
#include "training/hf_checkpoint_internal.h"

namespace megatron::training::hf_detail {

namespace {

std::string ours(int layer) { return "decoder.layers." + std::to_string(layer) + ".mlp."; }
std::string theirs(int layer) { return "layers." + std::to_string(layer) + ".block_sparse_moe."; }

}  // namespace

void export_mixtral_moe(const MoeExportIo& io, const model::TransformerConfig& c, int layer) {
  const std::string o = ours(layer), h = "model." + theirs(layer);
  const int64_t f = c.moe_ffn();
  io.add(h + "gate.weight", io.take(o + "router.weight"));
  // The grouped layout (--moe-grouped-gemm) holds the same matrices under other names.
  const bool grouped = io.has(o + "experts.linear_fc1.weight0");
  for (int e = 0; e < c.num_moe_experts; ++e) {
    const std::string x = std::to_string(e);
    const std::string fc1 = grouped ? o + "experts.linear_fc1.weight" + x
                                    : o + "experts.local_experts." + x + ".linear_fc1.weight";
    const std::string fc2 = grouped ? o + "experts.linear_fc2.weight" + x
                                    : o + "experts.local_experts." + x + ".linear_fc2.weight";
    const Tensor& w = io.take(fc1);
    MG_REQUIRE(w.dim() == 2 && w.size(0) == 2 * f, fc1, " has shape ", shape_str(w.shape()),
               ", not [gate; up] of ", f, " rows each (--moe-ffn-hidden-size)");
    const std::string he = h + "experts." + x + ".";
    io.add(he + "w1.weight", w.narrow(0, 0, f));
    io.add(he + "w2.weight", io.take(fc2));
    io.add(he + "w3.weight", w.narrow(0, f, f));
  }
}

void import_mixtral_moe(const std::function<Tensor(const std::string&, const Shape&)>& take,
                        const model::TransformerConfig& c, int layer, std::map<std::string, Tensor>& out) {
  const std::string o = ours(layer), h = theirs(layer);
  const int64_t f = c.moe_ffn(), hidden = c.hidden_size, E = c.num_moe_experts;
  out[o + "router.weight"] = take(h + "gate.weight", {E, hidden});
  for (int e = 0; e < c.num_moe_experts; ++e) {
    const std::string x = std::to_string(e), he = h + "experts." + x + ".";
    const std::string oe = o + "experts.local_experts." + x + ".";
    out[oe + "linear_fc1.weight"] = cat_rows({take(he + "w1.weight", {f, hidden}), take(he + "w3.weight", {f, hidden})});
    out[oe + "linear_fc2.weight"] = take(he + "w2.weight", {hidden, f});
  }
}

}  // namespace megatron::training::hf_detail
