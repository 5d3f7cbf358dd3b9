// The table of model families (model_family.h).
#include "model/model_family.h"

#include "core/error.h"
#include "model/bert_model.h"
#include "model/gpt_model.h"
#include "model/t5_model.h"

namespace megatron::model {

namespace {

void validate_gpt(const TransformerConfig&) {}

std::unique_ptr<ModelChunk> make_gpt(const TransformerConfig& cfg, uint64_t seed,
                                     const TensorParallel& tp, const ContextParallel& cp,
                                     const ChunkPlace& place, const ModelOptions& options) {
  return std::make_unique<GPTModel>(cfg, seed, tp, cp, place, options);
}

std::unique_ptr<ModelChunk> make_bert(const TransformerConfig& cfg, uint64_t seed,
                                      const TensorParallel& tp, const ContextParallel& cp,
                                      const ChunkPlace& place, const ModelOptions& options) {
  return std::make_unique<BertModel>(cfg, seed, tp, cp, place, options);
}

std::unique_ptr<ModelChunk> make_t5(const TransformerConfig& cfg, uint64_t seed,
                                    const TensorParallel& tp, const ContextParallel& cp,
                                    const ChunkPlace& place, const ModelOptions& options) {
  return std::make_unique<T5Model>(cfg, seed, tp, cp, place, options);
}

constexpr ModelFamily kFamilies[] = {
    {kModelFamilyKinds[size_t(ModelFamilyId::gpt)], "pretrain-gpt", "decoder", validate_gpt, make_gpt},
    {kModelFamilyKinds[size_t(ModelFamilyId::bert)], "pretrain-bert", "encoder",
     BertModel::validate, make_bert},
    {kModelFamilyKinds[size_t(ModelFamilyId::t5)], "pretrain-t5", "encoder", T5Model::validate,
     make_t5},
};
static_assert(std::size(kFamilies) == std::size(kModelFamilyKinds) &&
                  ops::rows_in_id_order(kFamilies),
              "kFamilies: one row for every family of layer_kinds.h, row i the family with id i");

}  // namespace

std::span<const ModelFamily> model_families() { return kFamilies; }

// An unknown name is an Error listing the known ones (TransformerConfig::family_id).
const ModelFamily& model_family_of(const TransformerConfig& cfg) {
  return kFamilies[size_t(cfg.family_id())];
}

std::unique_ptr<ModelChunk> make_model_chunk(const TransformerConfig& cfg, uint64_t seed,
                                             const TensorParallel& tp, const ContextParallel& cp,
                                             const ChunkPlace& place, const ModelOptions& options) {
  return model_family_of(cfg).make(cfg, seed, tp, cp, place, options);
}

}  // namespace megatron::model
