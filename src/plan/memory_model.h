// This build's own memory prediction for a training run, per pipeline stage (every rank of a
// stage holds the same), from what the trainer will allocate rather than from a rule of thumb:
//  - parameters: each chunk's weights with the shapes and shards the model creates them with
//    (embedding, per layer the norms, linear_qkv, optional q/k norms, linear_proj, linear_fc1,
//    linear_fc2 with the biases the configuration has, final norm, output layer or the last
//    stage's copy of a tied table; in a mixture-of-experts layer the router's gate, every
//    expert's MLP and the shared expert's, tensor-parallel as the dense MLP), in the parameter
//    dtype, plus their fp32 working copies under --bf16 / --fp16;
//  - gradients: fp32, in the data-parallel buffer's padded layout when there is one
//    (optim/grad_buffer.h, the same arithmetic);
//  - optimizer: fp32 main weights (none for an fp32 model's plain optimizer) and one (SGD) or two
//    (Adam) moments, all of them or this rank's DP x CP shard with the distributed optimizer,
//    which also keeps a gradient shard;
//  - activations of one micro-batch, from the tensors the layers declare as saved for backward
//    (model/module.h SavedTensor: layer input and residual, norm statistics, QKV, softmax
//    log-sum-exp and probabilities unless selective recomputation or the context-parallel ring
//    drops them, attention context, MLP input, fc1 output and activation; in an MoE layer the
//    gate's logits, the N x top-k rows dispatched to the experts (E x capacity when padded), the
//    experts' fc1 outputs and activations over them, their outputs, and the shared expert's;
//    block inputs under full recomputation; the last chunk's output gradient), times the
//    micro-batches the schedule keeps in flight (pipeline/schedules.h, walked pass by pass);
//  - the largest workspace: a layer's backward temporaries (or a recomputed block with them; an
//    MoE layer's row gradients and its first expert's), an MoE layer's forward temporaries, the
//    loss head's logits chunk and output gradients, and the point-to-point buffers;
//  - the micro-batches' input tensors (tokens, positions, labels, loss mask).
// The peak of the host allocator is the sum at the schedule's worst pass; the resident set adds
// the process's own memory (code, libraries, thread stacks, the tokenizer), which the caller
// measures (device.h) or states.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan_config.h"

namespace megatron::plan {

// The parameter element counts of chunk `chunk` of pipeline rank `pp_rank`, in the model's
// parameter order (model::LanguageModule::parameters()), this tensor-parallel rank's shards.
// With `sharded`, also whether each is split over the tensor-parallel ranks (its initialisation
// draws the whole tensor and copies this rank's slice out of it).
// `products_only` (optional): per parameter, whether it is only multiplied or looked up
// (Weight::read_as_stored).
std::vector<int64_t> chunk_parameter_numels(const PlanInput& in, int pp_rank, int chunk,
                                            std::vector<bool>* sharded = nullptr,
                                            std::vector<bool>* products_only = nullptr);

// Bytes one micro-batch leaves saved in a chunk between its forward and its backward.
struct ChunkActivations {
  double layers = 0;       // all of the chunk's layers (block inputs only where recomputed)
  double embedding = 0;    // first chunk: token and position ids
  double output_grad = 0;  // last chunk: the gradient of the decoder output
  // Full recomputation: the most held while a block's backward runs (the inputs of the blocks
  // before it and the block's layers' saved tensors), beside the embedding's.
  double recompute_live = 0;
  double total() const { return layers + embedding + output_grad; }
};

struct StageMemory {
  int pp_rank = 0;
  int64_t parameters = 0;  // elements held by this rank (all chunks)
  double weights = 0;      // parameter values (the flat buffer's, padding included, when sharded)
  double working_weights = 0;  // fp32 copies of bf16/fp16 weights
  double gradients = 0;        // fp32 main gradients
  double main_weights = 0;     // the optimizer's fp32 copy (or shard)
  double optimizer_moments = 0;
  double comm_buffers = 0;  // gradient shard, bf16 reduction copies, point-to-point buffers
  double inputs = 0;        // the iteration's micro-batch tensors
  double activations_per_microbatch = 0;  // one micro-batch through every chunk of the rank
  int max_in_flight = 0;                  // micro-batch passes held at once (summed over chunks)
  double activations = 0;                 // the most saved activations held at once
  double workspace = 0;                   // the largest transient beyond them (at the peak pass)
  double workspace_persistent = 0;        // kept between steps (the loss head's logits chunk)
  double peak = 0;                        // the allocator's high-water mark
  // Resident memory beyond the tensors and the program itself: the dataset indices, and
  // (estimated) the heap the step's freed temporaries leave behind (glibc keeps freed blocks below
  // its mapping threshold for reuse, tune_host_allocator in core/tensor.cpp, and they fragment): 40% of them.
  double resident_overhead = 0;
  double data_indices = 0;  // the dataset indices (in resident_overhead; data_memory.h)
  // Resident memory a collective after the backward adds while it runs (in resident_overhead):
  // MPI's own reduction buffer (a 1/n share of the message) and our flat copy of the
  // sequence-parallel gradients when it is large enough for its own mapping.
  double collective_extra = 0;
  double peak_resident(double process) const { return peak + resident_overhead + process; }
  double static_bytes() const {
    return weights + working_weights + gradients + main_weights + optimizer_moments;
  }
};

struct MemoryPrediction {
  std::vector<StageMemory> stages;  // one per pipeline rank
  int most_loaded = 0;              // index of the stage with the highest peak
  const StageMemory& worst() const { return stages.at(size_t(most_loaded)); }
};

MemoryPrediction predict_memory(const PlanInput& in);

// One micro-batch's saved activations in each chunk of pipeline rank `pp_rank` (tests compare
// them with model::LanguageModule::activation_bytes of a real forward).
std::vector<ChunkActivations> chunk_activations(const PlanInput& in, int pp_rank);

}  // namespace megatron::plan
