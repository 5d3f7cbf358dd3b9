// LayerContext dropout streams and Weight storage (see layer_base.h).
#include "model/layer_base.h"

namespace megatron::model {

ops::DropoutSpec LayerContext::dropout(float p, int layer, int site,
                                       uint64_t element_offset) const {
  ops::DropoutSpec d;
  d.p = training ? p : 0.0f;
  d.seed = seed;
  d.stream = (dropout_offset << 24) | (uint64_t(layer + 1) << 4) | uint64_t(site);
  d.element_offset = element_offset;
  return d;
}

size_t bytes_of(const Tensor& t) { return t.defined() ? t.nbytes() : 0; }

void Weight::init(const std::string& name, const Shape& shape, DType dtype, bool decay, int pdim,
                  bool sp) {
  param.name = name;
  param.value = Tensor::zeros(shape, dtype);
  param.grad = Tensor::zeros(shape, DType::F32);
  param.weight_decay = decay;
  param.partition_dim = pdim;
  param.sequence_parallel = sp;
  f32 = dtype == DType::F32 ? param.value : Tensor::zeros(shape, DType::F32);
}

void Weight::refresh() {
  if (param.value.dtype() == DType::F32) {
    f32 = param.value;
  } else {
    if (!f32.defined() || f32.shape() != param.value.shape())
      f32 = Tensor::empty(param.value.shape(), DType::F32);
    ops::cast(f32, param.value);
  }
}

}  // namespace megatron::model
