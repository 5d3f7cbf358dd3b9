// LayerContext dropout streams, Weight storage and the Module bookkeeping (see module.h).
#include "model/module.h"

#include <unordered_set>

namespace megatron::model {

ops::DropoutSpec LayerContext::dropout(float p, int layer, int site,
                                       uint64_t element_offset) const {
  ops::DropoutSpec d;
  d.p = training ? p : 0.0f;
  d.seed = seed;
  d.stream = (dropout_offset << 24) | (uint64_t(layer + layer_offset + 1) << 4) | uint64_t(site);
  d.element_offset = element_offset;
  return d;
}

size_t bytes_of(const Tensor& t) { return t.defined() ? t.nbytes() : 0; }

void Weight::init(WeightSpec spec, const Shape& shape, DType dtype, bool grad) {
  static_cast<WeightSpec&>(param) = std::move(spec);
  param.value = Tensor::zeros(shape, dtype);
  param.grad = grad ? Tensor::zeros(shape, DType::F32) : Tensor();
  // Without gradients (inference) the fp32 copy of a half-precision weight is made by refresh()
  // when a module runs (see release()).
  f32 = dtype == DType::F32 && offset == 0.0f ? param.value
        : grad                                ? Tensor::zeros(shape, DType::F32)
                                              : Tensor();
}

namespace {
// A half-precision weight gemm multiplies as stored (ops::gemm_computes_in).
bool multiplied_as_stored(const Weight& w) {
  const Tensor& v = w.param.value;
  return w.offset == 0.0f && v.dtype() != DType::F32 && ops::gemm_computes_in(v.dtype(), v.device());
}
}  // namespace

const Tensor& Weight::operand() const {
  if (multiplied_as_stored(*this)) return param.value;
  MG_CHECK(f32.defined(), "weight ", param.name, " has no fp32 working copy (refresh it first)");
  return f32;
}

void Weight::refresh() {
  if (param.value.dtype() == DType::F32 && offset == 0.0f) {
    f32 = param.value;
    return;
  }
  if (read_as_stored && multiplied_as_stored(*this)) {
    f32 = Tensor();
    return;
  }
  if (!f32.defined() || f32.shape() != param.value.shape() ||
      f32.device() != param.value.device() || f32.storage() == param.value.storage())
    f32 = Tensor::empty(param.value.shape(), DType::F32, param.value.device());
  ops::cast(f32, param.value);
  if (offset != 0.0f) {
    const Tensor add = Tensor::full(f32.shape(), double(offset), DType::F32, f32.device());
    ops::add(f32, f32, add);
  }
}

void Weight::release() {
  f32 = param.value.dtype() == DType::F32 && offset == 0.0f ? param.value : Tensor();
}

SavedTensor::SavedTensor(Module* owner, const char* n, const char* s) : name(n), shape(s) {
  owner->saved_.push_back(this);
}

Weight& Module::register_weight(Weight& w) {
  if (w.defined()) weights_.push_back(&w);
  return w;
}

void Module::register_child(Module& m) { children_.push_back(&m); }

void Module::parameters(ParameterList& out) {
  for (Weight* w : weights_) out.push_back(&w->param);
  for (Module* c : children_) c->parameters(out);
}

ParameterList Module::parameters() {
  ParameterList out;
  parameters(out);
  return out;
}

void Module::refresh_working_weights() {
  for (Weight* w : weights_) w->refresh();
  for (Module* c : children_) c->refresh_working_weights();
}

void Module::release_working_weights() {
  for (Weight* w : weights_) w->release();
  for (Module* c : children_) c->release_working_weights();
}

void Module::weight_tensors(std::vector<Tensor>& out) const {
  for (const Weight* w : weights_) {
    out.push_back(w->param.value);
    out.push_back(w->f32);
  }
  for (const Module* c : children_) c->weight_tensors(out);
}

void Module::for_each_saved(const std::function<void(const SavedTensor&)>& fn) const {
  for (const SavedTensor* s : saved_) fn(*s);
  for (const Module* c : children_) c->for_each_saved(fn);
}

ActivationStash Module::take_saved() {
  ActivationStash out;
  std::function<void(Module&)> take = [&](Module& m) {
    for (SavedTensor* s : m.saved_) out.push_back(std::exchange(s->value, Tensor()));
    for (Module* c : m.children_) take(*c);
  };
  take(*this);
  return out;
}

void Module::restore_saved(ActivationStash&& stash) {
  size_t i = 0;
  std::function<void(Module&)> put = [&](Module& m) {
    for (SavedTensor* s : m.saved_) {
      MG_CHECK(i < stash.size(), "restore_saved: the stash holds fewer activations than declared");
      s->value = std::move(stash[i++]);
    }
    for (Module* c : m.children_) put(*c);
  };
  put(*this);
  MG_CHECK(i == stash.size(), "restore_saved: the stash holds ", stash.size(),
           " activations, the module declares ", i);
  stash.clear();
}

size_t held_bytes(const std::vector<const Module*>& modules, const std::vector<Tensor>& tensors) {
  std::unordered_set<const void*> seen;
  size_t total = 0;
  auto add = [&](const Tensor& t) {
    if (t.defined() && seen.insert(t.storage().get()).second) total += t.storage()->bytes();
  };
  for (const Tensor& t : tensors) add(t);
  for (const Module* m : modules) m->for_each_saved([&](const SavedTensor& s) { add(s.value); });
  return total;
}

}  // namespace megatron::model
