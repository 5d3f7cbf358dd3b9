#include "cli/device_flag.h"

namespace megatron::cli {

CLI::Option* add_device_option(CLI::App& sub, std::string& device) {
  return sub
      .add_option("--device", device,
                  "cuda | cpu: where the model runs (default: a GPU when this build has CUDA and "
                  "one is visible, else the CPU); one GPU per rank, chosen by local rank")
      ->check(CLI::IsMember({"cuda", "cpu"}));
}

}  // namespace megatron::cli
