// --device, on the commands that run a model (pretrain-gpt, generate, serve, evaluate); resolved
// by cuda::select_device (kernels/cuda/device_select.h).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace megatron::cli {

CLI::Option* add_device_option(CLI::App& sub, std::string& device);

}  // namespace megatron::cli
