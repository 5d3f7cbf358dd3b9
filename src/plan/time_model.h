// The step time of a layout on a device, estimated from first principles: each pipeline stage's
// model FLOPs (Megatron's formula, training/metrics.h, split by stage: the output layer on the
// last, recomputation's extra forward where asked; an MoE layer's active experts only, plus its
// router) at the device's attainable rate, the
// element-wise traffic of norms, residuals, dropouts and softmax at its memory bandwidth, the
// pipeline's fill and drain ((PP - 1) / VP stage passes), the tensor-parallel collectives of
// every layer (all-reduce, or reduce-scatter and all-gather under sequence parallelism, plus the
// backward's re-gather), the context-parallel ring's key/value exchange, the point-to-point
// activations between stages, the data-parallel gradient reduction (and the distributed
// optimizer's parameter all-gather), and the optimizer step itself. Collectives cost
// latency + bytes x (n-1)/n / bandwidth per hop (ring algorithms); none is assumed overlapped
// except the gradient reduction with --overlap-grad-reduce, which hides behind the backward
// up to its length.
#pragma once

#include <string>

#include "plan/device.h"
#include "plan/plan_config.h"

namespace megatron::plan {

struct StepTime {
  double compute = 0;      // the slowest stage's passes (products and element-wise work)
  double bubble = 0;       // pipeline fill and drain
  double tp_comm = 0;      // tensor-parallel collectives on the critical path
  double cp_comm = 0;      // context-parallel key/value exchange
  double pp_comm = 0;      // point-to-point between stages
  double dp_comm = 0;      // exposed data-parallel gradient (and parameter) traffic
  double optimizer = 0;    // the optimizer step
  double total = 0;        // seconds per iteration
  double model_flops = 0;  // Megatron's FLOPs of one iteration (the whole model)
  double tokens_per_second = 0;
  double tflops_per_device = 0;  // model FLOPs / time / world / 1e12
  double mfu = 0;                // against the device's peak
};

StepTime estimate_step_time(const PlanInput& in, const DeviceSpec& device);

}  // namespace megatron::plan
