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
    {"gpt", "pretrain-gpt", "decoder", validate_gpt, make_gpt},
    {"bert", "pretrain-bert", "encoder", BertModel::validate, make_bert},
    {"t5", "pretrain-t5", "encoder", T5Model::validate, make_t5},
};

}  // namespace

std::span<const ModelFamily> model_families() { return kFamilies; }

const ModelFamily& model_family_of(const TransformerConfig& cfg) {
  std::string known;
  for (const ModelFamily& f : model_families()) {
    if (cfg.model_family == f.name) return f;
    known += (known.empty() ? "" : ", ") + std::string(f.name);
  }
  MG_THROW("model family '", cfg.model_family, "' is not one of: ", known);
}

std::unique_ptr<ModelChunk> make_model_chunk(const TransformerConfig& cfg, uint64_t seed,
                                             const TensorParallel& tp, const ContextParallel& cp,
                                             const ChunkPlace& place, const ModelOptions& options) {
  return model_family_of(cfg).make(cfg, seed, tp, cp, place, options);
}

}  // namespace megatron::model
