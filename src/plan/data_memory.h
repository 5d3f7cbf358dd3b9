// The host memory of a run's dataset indices (data/gpt_indices.h), which every rank builds or
// loads and keeps for the whole run: per split of every dataset of the blend, the shuffled
// document index (epochs x documents, int32), the sample index ((samples + 1) x 2, int64) and the
// shuffle index (samples, int64), where an epoch's samples are the split's tokens / sequence
// length (Megatron builds whole epochs, however few samples the run asks for), plus a blend's
// dataset and sample indices (10 bytes a sample) and each indexed dataset's .idx arrays. The
// numbers come from the datasets' .idx headers (only the sequence lengths are read) or from
// Megatron's synthetic documents; nothing is built.
#pragma once

#include "training/trainer.h"

namespace megatron::plan {

// Bytes; throws megatron::Error when a --data-path prefix cannot be opened (as the trainer would).
double dataset_index_bytes(const training::TrainingArgs& args, int64_t global_batch_size,
                           int64_t train_iters);

}  // namespace megatron::plan
