// The model families, one row each (as the norm and activation kinds): the kind row of
// layer_kinds.h (the id, and the name a configuration and its checkpoints record:
// TransformerConfig::model_family), the command that trains it, the
// family's own configuration checks and how a model chunk of it is built. The stage holder
// (stage_model.h), the trainer and every checkpoint reader build models through this table.
//
// Adding a family: its class on the shared machinery (language_module.h, e.g. bert_model.h) with
// its layer spec and loss head, its kind row in layer_kinds.h and its row here.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "model/context_parallel.h"
#include "model/model_chunk.h"
#include "model/tensor_parallel.h"
#include "model/transformer_config.h"

namespace megatron::model {

struct ModelFamily : ModelFamilyKind {
  const char* command;  // the megatron subcommand that trains it
  const char* block;    // its layer stack's name prefix ("decoder" in GPT, "encoder" in BERT)
  // The family's checks of a configuration (after TransformerConfig's own); megatron::Error
  // naming the flag.
  void (*validate)(const TransformerConfig& cfg);
  std::unique_ptr<ModelChunk> (*make)(const TransformerConfig& cfg, uint64_t seed,
                                      const TensorParallel& tp, const ContextParallel& cp,
                                      const ChunkPlace& place, const ModelOptions& options);
};

std::span<const ModelFamily> model_families();
// The row of cfg.model_family; an unknown name is an error listing the known ones.
const ModelFamily& model_family_of(const TransformerConfig& cfg);
// A chunk of cfg's family (ModelFamily::make).
std::unique_ptr<ModelChunk> make_model_chunk(const TransformerConfig& cfg, uint64_t seed,
                                             const TensorParallel& tp, const ContextParallel& cp,
                                             const ChunkPlace& place, const ModelOptions& options);

}  // namespace megatron::model
