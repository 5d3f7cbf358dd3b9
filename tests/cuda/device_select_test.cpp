// --device: resolution (cuda::select_device), the local rank from the launcher's environment, and
// the commands' errors when a GPU is asked for where there is none (this build without CUDA, or a
// machine without a GPU: CI). On a machine with a GPU the "none" cases skip and say so.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "kernels/cuda/device_select.h"
#include "test_util.h"

#ifdef MEGATRON_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace megatron {
namespace {

using testing::error_of;
using testing::run_cli;

bool gpu_present() {
#ifdef MEGATRON_HAVE_CUDA
  return cuda::available();
#else
  return false;
#endif
}

// Sets an environment variable for the test's scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(DeviceSelect, CpuAlwaysAndTheDefaultFollowsTheMachine) {
  EXPECT_EQ(cuda::select_device("cpu", 0), Device::cpu());
  EXPECT_EQ(cuda::describe_device(Device::cpu()), "cpu");
  const Device auto_device = cuda::select_device("", 0);
  EXPECT_EQ(auto_device.is_cuda(), gpu_present()) << auto_device.to_string();
}

TEST(DeviceSelect, ABadValueIsAnError) {
  EXPECT_NE(error_of([] { cuda::select_device("gpu", 0); }).find("--device gpu: expected cuda or cpu"),
            std::string::npos);
}

TEST(DeviceSelect, CudaWithoutAGpuSaysWhy) {
  if (gpu_present()) GTEST_SKIP() << "this machine has a GPU";
  const std::string e = error_of([] { cuda::select_device("cuda", 0); });
  const std::string why = cuda::compiled() ? "no CUDA device is visible" : "this build has no CUDA backend";
  EXPECT_NE(e.find("--device cuda: " + why), std::string::npos) << e;
  EXPECT_NE(e.find("--device cpu"), std::string::npos) << e;
}

TEST(DeviceSelect, LocalRankFromTheLauncher) {
  ScopedEnv local("LOCAL_RANK", nullptr), ompi("OMPI_COMM_WORLD_LOCAL_RANK", nullptr),
      mpich("MPI_LOCALRANKID", nullptr), slurm("SLURM_LOCALID", nullptr);
  EXPECT_EQ(cuda::local_rank_from_env(), -1);
  {
    ScopedEnv s("SLURM_LOCALID", "3");
    EXPECT_EQ(cuda::local_rank_from_env(), 3);
    ScopedEnv o("OMPI_COMM_WORLD_LOCAL_RANK", "1");  // torchrun's, then Open MPI's, come first
    EXPECT_EQ(cuda::local_rank_from_env(), 1);
  }
  ScopedEnv bad("LOCAL_RANK", "two");
  EXPECT_NE(error_of([] { cuda::local_rank_from_env(); })
                .find("LOCAL_RANK='two' is not a local rank"),
            std::string::npos);
}

// Every command that runs a model takes --device and refuses cuda where there is no GPU.
TEST(DeviceSelect, CommandsRefuseCudaWithoutAGpu) {
  if (gpu_present()) GTEST_SKIP() << "this machine has a GPU";
  const auto r = run_cli(
      "pretrain-gpt --device cuda --num-layers 1 --hidden-size 16 --num-attention-heads 2 "
      "--seq-length 16 --max-position-embeddings 16 --micro-batch-size 1 --train-iters 1 "
      "--lr 1e-3 --mock-data --tokenizer-type NullTokenizer --vocab-size 4096");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("error: --device cuda: "), std::string::npos) << r.output;
  for (const char* command : {"generate", "serve", "evaluate"}) {
    const auto help = run_cli(std::string(command) + " --help");
    EXPECT_NE(help.output.find("--device TEXT:{cuda,cpu}"), std::string::npos) << command;
  }
  const auto bad = run_cli("generate --device tpu --load x --tokenizer-type NullTokenizer");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--device: tpu not in {cuda,cpu}"), std::string::npos) << bad.output;
}

// Megatron's report_memory line; the numbers as Python's '{}'.format(bytes / 2**20) prints them
// (python3 -c "print('{}'.format(512 / 1048576))" -> 0.00048828125).
TEST(DeviceSelect, MemoryReportIsMegatronsLine) {
  EXPECT_EQ(cuda::python_float(0.0), "0.0");
  EXPECT_EQ(cuda::python_float(3072.0), "3072.0");
  EXPECT_EQ(cuda::python_float(1536.5), "1536.5");
  EXPECT_EQ(cuda::python_float(512.0 / 1048576.0), "0.00048828125");
  EXPECT_EQ(cuda::python_float(1234567.0 / 1048576.0), "1.1773748397827148");
  const cuda::MemoryCounters c{size_t(1536) * 1048576 + 524288, size_t(3) << 30, size_t(4) << 30,
                               (size_t(4) << 30) + 2097152};
  EXPECT_EQ(cuda::memory_report_line("(after 10 iterations)", 3, c),
            "[Rank 3] (after 10 iterations) memory (MB) | allocated: 1536.5 | max allocated: "
            "3072.0 | reserved: 4096.0 | max reserved: 4098.0");
  EXPECT_EQ(cuda::memory_report("(after 1 iterations)", 0, Device::cpu()),
            "[Rank 0] (after 1 iterations) memory (MB) | allocated: 0.0 | max allocated: 0.0 | "
            "reserved: 0.0 | max reserved: 0.0");
}

}  // namespace
}  // namespace megatron
