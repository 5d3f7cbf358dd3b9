// The optimizers with parameters on the checking device (host code cannot touch their memory
// outside ops and explicit copies): AdamW and SGD, fp32 and bf16 parameters, clipping, loss-scale
// unscaling, the grad-stats group, the data-parallel buffer and the distributed optimizer all run
// through ops and the communicator, and the parameters after each step equal the same run on CPU
// tensors bit for bit. Mpi* tests: a world of one, and mpirun -np 2 / 4 (the data-parallel group).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "comm/communicator.h"
#include "core/rng.h"
#include "optim/distributed_optimizer.h"
#include "optim/grad_buffer.h"
#include "optim/optimizer.h"
#include "test_util.h"

namespace megatron::optim {
namespace {

using megatron::testing::checked_device;

struct DeviceParams {
  std::vector<std::unique_ptr<model::Parameter>> owned;
  model::ParameterList list;
  DeviceParams(DType dtype, Device device) {
    const std::vector<Shape> shapes = {{7, 5}, {5}, {33, 4}, {130}, {3, 3, 3}};
    for (size_t i = 0; i < shapes.size(); ++i) {
      auto p = std::make_unique<model::Parameter>();
      p->name = "p" + std::to_string(i);
      Tensor v = Tensor::empty(shapes[i], DType::F32);
      Philox(17, i).fill_normal(v.data<float>(), v.numel(), 0.0f, 0.5f);
      p->value = v.to(dtype).to(device);
      p->grad = Tensor::zeros(shapes[i], DType::F32, device);
      p->weight_decay = shapes[i].size() > 1;
      list.push_back(p.get());
      owned.push_back(std::move(p));
    }
  }
  // Rank- and step-dependent gradients, written with explicit copies.
  void set_grads(int rank, int step) {
    for (size_t i = 0; i < list.size(); ++i) {
      Tensor g = Tensor::empty(list[i]->grad.shape(), DType::F32);
      Philox(100 + uint64_t(step), i * 16 + uint64_t(rank)).fill_normal(g.data<float>(), g.numel(), 0.0f, 0.05f);
      list[i]->grad.copy_(g);
    }
  }
};

void expect_same_values(const DeviceParams& got, const DeviceParams& want, const std::string& what) {
  for (size_t i = 0; i < want.list.size(); ++i) {
    EXPECT_EQ(got.list[i]->value.device(), checked_device());
    const Tensor g = got.list[i]->value.to(Device::cpu()), w = want.list[i]->value;
    EXPECT_EQ(0, std::memcmp(g.raw_data(), w.raw_data(), w.nbytes())) << what << ": param " << i;
  }
}

void check_optimizer(OptimizerType type, DType dtype, double clip) {
  const std::string what = str(type == OptimizerType::Adam ? "adam" : "sgd", " ",
                               dtype_name(dtype), " clip ", clip);
  auto w = world_communicator();
  OptimizerConfig oc;
  oc.type = type;
  oc.clip_grad = clip;
  oc.sgd_momentum = 0.9;
  DeviceParams cpu(dtype, Device::cpu()), dev(dtype, checked_device());
  Optimizer a(cpu.list, oc), b(dev.list, oc);
  a.set_grad_stats_group(w.get(), 0);
  b.set_grad_stats_group(w.get(), 0);
  GradScaler sa = GradScaler::dynamic(64.0, 1.0, 1000, 1), sb = sa;
  for (int step = 0; step < 3; ++step) {
    cpu.set_grads(w->rank(), step);
    dev.set_grads(w->rank(), step);
    const StepResult ra = a.step(1e-2, 0.1, sa), rb = b.step(1e-2, 0.1, sb);
    EXPECT_EQ(ra.grad_norm, rb.grad_norm) << what;
    expect_same_values(dev, cpu, what + " step " + std::to_string(step));
  }
}

TEST(MpiCheckedOptim, OptimizerStepsEqualTheCpu) {
  check_optimizer(OptimizerType::Adam, DType::F32, 0.0);
  check_optimizer(OptimizerType::Adam, DType::BF16, 0.05);
  check_optimizer(OptimizerType::SGD, DType::F32, 0.05);
}

TEST(MpiCheckedOptim, DistributedOptimizerEqualsTheCpu) {
  auto w = world_communicator();
  for (bool overlap : {false, true}) {
    DeviceParams cpu(DType::BF16, Device::cpu()), dev(DType::BF16, checked_device());
    const GradBufferConfig bc{50, true, overlap};
    ParamAndGradBuffer ba(cpu.list, w, bc), bb(dev.list, w, bc);
    EXPECT_EQ(bb.param_data().device(), checked_device());
    DistributedOptimizer a(ba, OptimizerConfig{}, *w, 0), b(bb, OptimizerConfig{}, *w, 0);
    GradScaler sa = GradScaler::constant(1.0), sb = sa;
    for (int step = 0; step < 3; ++step) {
      for (auto [buf, params] : {std::pair{&ba, &cpu}, std::pair{&bb, &dev}}) {
        buf->zero_grad();
        params->set_grads(w->rank(), step);
        buf->finish_grad_sync();
      }
      const StepResult ra = a.step(1e-2, 0.1, sa), rb = b.step(1e-2, 0.1, sb);
      EXPECT_EQ(ra.grad_norm, rb.grad_norm);
      ba.finish_param_sync();
      bb.finish_param_sync();
      expect_same_values(dev, cpu, str("distributed, overlap ", overlap, ", step ", step));
    }
  }
}

}  // namespace
}  // namespace megatron::optim
