// Megatron's pipeline split rules (see pipeline_layout.h).
#include "model/pipeline_layout.h"

#include "core/error.h"

namespace megatron::model {

PipelineLayout PipelineLayout::make(int L, int P, int layers_per_virtual_stage) {
  MG_REQUIRE(L > 0, "--num-layers must be > 0 (got ", L, ")");
  MG_REQUIRE(P >= 1, "--pipeline-model-parallel-size must be >= 1 (got ", P, ")");
  MG_REQUIRE(L % P == 0, "--num-layers ", L, " is not divisible by --pipeline-model-parallel-size ",
             P, "; each pipeline stage holds num-layers / pipeline-model-parallel-size layers");
  PipelineLayout l;
  l.num_layers = L;
  l.pipeline_size = P;
  if (layers_per_virtual_stage > 0) {
    MG_REQUIRE(P > 1, "--num-layers-per-virtual-pipeline-stage needs "
               "--pipeline-model-parallel-size > 1 (the interleaved schedule)");
    const int per_stage = L / P;
    MG_REQUIRE(per_stage % layers_per_virtual_stage == 0, "the ", per_stage,
               " layers of each pipeline stage (--num-layers ", L,
               " / --pipeline-model-parallel-size ", P,
               ") are not divisible by --num-layers-per-virtual-pipeline-stage ",
               layers_per_virtual_stage);
    l.num_chunks = per_stage / layers_per_virtual_stage;
  } else {
    MG_REQUIRE(layers_per_virtual_stage == 0,
               "--num-layers-per-virtual-pipeline-stage must be > 0 (got ",
               layers_per_virtual_stage, ")");
  }
  l.validate();
  return l;
}

void PipelineLayout::validate() const {
  MG_REQUIRE(num_layers > 0 && pipeline_size >= 1 && num_chunks >= 1 &&
                 num_layers % (pipeline_size * num_chunks) == 0 &&
                 (num_chunks == 1 || pipeline_size > 1),
             "pipeline layout of ", num_layers, " layers over ", pipeline_size, " stages x ",
             num_chunks, " virtual stages: the layers must split evenly (and virtual stages need "
             "more than one pipeline stage)");
}

}  // namespace megatron::model
