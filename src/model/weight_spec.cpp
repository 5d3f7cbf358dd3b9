// Weight-spec names, records, whole-model specs and initial values (parameter.h, weight_spec.h).
#include "model/weight_spec.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "kernels/ops.h"
#include "model/model_family.h"

namespace megatron::model {

namespace {
constexpr const char* kInitNames[] = {"zeros", "ones", "normal", "scaled_normal"};
constexpr const char* kReductionNames[] = {"data_parallel"};
}  // namespace

const char* init_method_name(InitMethod m) { return kInitNames[size_t(m)]; }

std::optional<InitMethod> parse_init_method(std::string_view name) {
  for (size_t i = 0; i < std::size(kInitNames); ++i)
    if (name == kInitNames[i]) return InitMethod(i);
  return std::nullopt;
}

const char* grad_reduction_name(GradReduction r) { return kReductionNames[size_t(r)]; }

std::optional<GradReduction> parse_grad_reduction(std::string_view name) {
  for (size_t i = 0; i < std::size(kReductionNames); ++i)
    if (name == kReductionNames[i]) return GradReduction(i);
  return std::nullopt;
}

nlohmann::json weight_spec_to_json(const WeightSpec& w) {
  nlohmann::json j = {{"init", init_method_name(w.init)},
          {"weight_decay", w.weight_decay},
          {"partition_dim", w.partition_dim},
          {"partition_parts", w.partition_parts},
          {"padded_vocab", w.padded_vocab},
          {"sequence_parallel", w.sequence_parallel},
          {"shared", w.shared},
          {"grad_reduction", grad_reduction_name(w.grad_reduction)}};
  if (w.expert >= 0) j["expert"] = w.expert;
  return j;
}

WeightSpec weight_spec_from_json(const std::string& name, const nlohmann::json& r,
                                 const std::string& where) {
  MG_REQUIRE(r.is_object(), where, ": the weight record of '", name, "' is not an object");
  WeightSpec w;
  w.name = name;
  auto field = [&](const char* key, auto& out) {
    if (!r.contains(key)) return;
    const nlohmann::json& v = r.at(key);
    using T = std::decay_t<decltype(out)>;
    if constexpr (std::is_same_v<T, bool>) {
      MG_REQUIRE(v.is_boolean(), where, ": weight '", name, "': \"", key, "\" must be a boolean");
      out = v.get<bool>();
    } else {
      MG_REQUIRE(v.is_number_integer() && v.get<int64_t>() >= -1 && v.get<int64_t>() <= 64, where,
                 ": weight '", name, "': \"", key, "\" must be a small integer, got ", v.dump());
      out = v.get<int>();
    }
  };
  auto named = [&](const char* key, auto parse, auto& out) {
    if (!r.contains(key)) return;
    const nlohmann::json& v = r.at(key);
    MG_REQUIRE(v.is_string(), where, ": weight '", name, "': \"", key, "\" must be a string");
    const auto parsed = parse(v.get<std::string>());
    MG_REQUIRE(parsed.has_value(), where, ": weight '", name, "': unknown ", key, " '",
               v.get<std::string>(), "' (written by a newer version?)");
    out = *parsed;
  };
  named("init", parse_init_method, w.init);
  named("grad_reduction", parse_grad_reduction, w.grad_reduction);
  field("weight_decay", w.weight_decay);
  field("partition_dim", w.partition_dim);
  field("partition_parts", w.partition_parts);
  field("padded_vocab", w.padded_vocab);
  field("sequence_parallel", w.sequence_parallel);
  field("shared", w.shared);
  if (r.contains("expert")) {
    const nlohmann::json& v = r.at("expert");
    MG_REQUIRE(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < (1 << 20),
               where, ": weight '", name, "': \"expert\" must be an expert number, got ", v.dump());
    w.expert = v.get<int>();
  }
  MG_REQUIRE(w.partition_parts >= 1 && (w.partition_dim >= 0 || w.partition_parts == 1), where,
             ": weight '", name, "': partition_parts ", w.partition_parts, " with partition_dim ",
             w.partition_dim);
  return w;
}

std::map<std::string, WeightSpec> model_weight_specs(const TransformerConfig& cfg) {
  // The same structure (family, layer count, kinds, biases, tying, heads per query group) at the
  // smallest sizes the configuration's checks accept.
  TransformerConfig c = cfg;
  const int groups = cfg.query_groups(), per_group = cfg.num_attention_heads / std::max(groups, 1);
  c.num_query_groups = cfg.num_query_groups > 0 ? 1 : 0;
  c.num_attention_heads = cfg.num_query_groups > 0 ? per_group : 1;
  c.kv_channels = 2;
  c.hidden_size = 2;
  c.ffn_hidden_size = 2;
  c.padded_vocab_size = 1;
  c.rotary_percent = 1.0f;
  c.seq_length = 1;
  c.max_position_embeddings = 1;
  if (c.decoder_seq_length > 0) c.decoder_seq_length = 1;  // T5's: within the position table
  c.params_dtype = DType::F32;
  c.sequence_parallel = false;
  c.recompute_granularity.clear();
  c.recompute_method.clear();
  ModelOptions options;
  options.grad = false;
  options.init_weights = false;
  std::unique_ptr<ModelChunk> m =
      make_model_chunk(c, 0, TensorParallel::none(), ContextParallel::none(),
                       ChunkPlace{PipelineLayout{c.num_layers, 1, 1}, 0, 0}, options);
  std::map<std::string, WeightSpec> out;
  for (const Parameter* p : m->parameters()) out.emplace(p->name, static_cast<const WeightSpec&>(*p));
  return out;
}

InitScale InitScale::of(float init_method_std, int num_layers) {
  return {init_method_std, init_method_std / std::sqrt(2.0f * float(num_layers))};
}

void init_parameter(Parameter& p, uint64_t seed, uint64_t stream, const InitScale& scale,
                    const TensorParallel& tp) {
  Tensor v = Tensor::zeros(full_shape(p, tp.size()), DType::F32);
  switch (p.init) {
    case InitMethod::zeros:
      break;
    case InitMethod::ones:
      v.fill_(1.0);
      break;
    case InitMethod::normal:
    case InitMethod::scaled_normal:
      Philox(seed, stream).fill_normal(v.data<float>(), v.numel(), 0.0f,
                                       p.init == InitMethod::normal ? scale.std : scale.scaled_std);
      break;
  }
  ops::cast(p.value, shard_parameter(v, p, tp.rank(), tp.size()));
}

}  // namespace megatron::model
