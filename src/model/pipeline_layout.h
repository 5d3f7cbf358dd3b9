// Megatron's split of the L decoder layers over P pipeline ranks, each holding v model chunks
// (virtual stages, --num-layers-per-virtual-pipeline-stage; v = 1 without it): chunk c of rank r
// is virtual stage c*P + r and holds the L/(P*v) consecutive layers starting at (c*P + r) *
// L/(P*v). Virtual stage 0 (rank 0, chunk 0) also holds the embedding (Megatron-Core's
// pre_process); the last one (rank P-1, chunk v-1) the final norm and the output layer with the
// loss (post_process). P = v = 1 is the whole model.
#pragma once

namespace megatron::model {

struct PipelineLayout {
  int num_layers = 1;     // --num-layers (the whole model)
  int pipeline_size = 1;  // --pipeline-model-parallel-size
  int num_chunks = 1;     // virtual stages per rank (1: no interleaving)

  // Validates Megatron's rules with errors naming the flags: L % P == 0; with
  // layers_per_virtual_stage > 0 (--num-layers-per-virtual-pipeline-stage): P > 1 and
  // (L / P) % layers_per_virtual_stage == 0, giving v = L / P / layers_per_virtual_stage.
  static PipelineLayout make(int num_layers, int pipeline_size, int layers_per_virtual_stage = 0);
  // Error unless the fields describe an even split (for layouts built by hand).
  void validate() const;

  int num_virtual_stages() const { return pipeline_size * num_chunks; }
  int layers_per_chunk() const { return num_layers / num_virtual_stages(); }
  int virtual_stage(int pp_rank, int chunk) const { return chunk * pipeline_size + pp_rank; }
  int first_layer(int pp_rank, int chunk) const {
    return virtual_stage(pp_rank, chunk) * layers_per_chunk();
  }
  bool has_embedding(int pp_rank, int chunk) const { return virtual_stage(pp_rank, chunk) == 0; }
  bool has_output(int pp_rank, int chunk) const {
    return virtual_stage(pp_rank, chunk) == num_virtual_stages() - 1;
  }
};

}  // namespace megatron::model
