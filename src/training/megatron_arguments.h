// Every argument of Megatron-LM's shared parser (megatron/training/arguments.py's
// add_megatron_arguments, which pretrain_gpt.py, tasks/main.py and
// tools/run_text_generation_server.py all parse), with what it can change here:
//
//   Runtime   how a run is executed, logged, profiled, checkpointed or parallelised, or a feature
//             of another model family (vision, BERT, biencoder, retro, the MoE and MLA details
//             that matter only with --num-experts / --multi-latent-attention): never changes what
//             a GPT computes
//   Training  the training run (optimizer, schedule, data, regularisation, initialisation):
//             changes nothing in generation or evaluation
//   Model     what the model computes
//
// The commands take every flag of the table that they do not define themselves (cli/
// megatron_compat.h): Runtime ones, and Training ones in the inference commands, are ignored
// with one warning line; the others (Model, and Training in pretrain-gpt) are features this build
// does not have and stop with an error naming the flag. The same table reads a Megatron
// checkpoint's argument namespace: a Model argument this build does not implement with another
// value than Megatron's default is an error naming it, a name the table does not know a warning.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace megatron::training {

enum class ArgEffect : uint8_t { Runtime, Training, Model };
enum class ArgValues : uint8_t {
  None,    // a switch (store_true / store_false)
  One,     // one value
  Many,    // nargs '*' or '+'
  Toggle,  // argparse.BooleanOptionalAction: --x and --no-x
};

struct MegatronArgument {
  const char* flag;     // "--log-params-norm" (aliases after commas: "--a,--b")
  ArgValues values;
  ArgEffect effect;
  const char* dest;     // the Namespace attribute; "" = the first flag's name with '_' for '-'
  // Model arguments this build does not implement: Megatron's default as Python prints it
  // ("None", "False", "1", "'vanilla'"); a checkpoint recording another value is refused.
  // nullptr: implemented here, not a Model argument, or one whose recorded value does not stop
  // the weights from loading here (FP8 / FP4 training keeps high-precision weights; a layer
  // spec or rope type that differs shows in the tensor names).
  const char* neutral = nullptr;
};

const std::vector<MegatronArgument>& megatron_arguments();

// The Namespace attribute of an entry.
std::string argument_dest(const MegatronArgument& a);
// The entry whose Namespace attribute is `dest`, or nullptr.
const MegatronArgument* find_argument_by_dest(std::string_view dest);
// Attributes validate_args and the training loop add to the Namespace (rank, world_size,
// data_parallel_size, params_dtype, padded_vocab_size, consumed_train_samples, ...).
bool is_derived_argument(std::string_view dest);

}  // namespace megatron::training
