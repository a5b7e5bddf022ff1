#include "trainyard/models/deferred_parameters.hpp"

#include <ATen/ops/empty.h>

#include <string>

#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

std::string shape_text(at::IntArrayRef sizes) {
  std::string text = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(sizes[i]);
  }
  return text + "]";
}

// A float32 CPU tensor of `sizes` whose storage holds no bytes.
at::Tensor placeholder(at::IntArrayRef sizes) {
  at::Tensor tensor = at::empty({0}, at::TensorOptions().dtype(at::kFloat));
  tensor.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return tensor;
}

}  // namespace

at::Tensor DeferredParameters::defer(at::IntArrayRef sizes, Make make) {
  at::Tensor parameter = placeholder(sizes);
  makers_[parameter.unsafeGetTensorImpl()] = Entry{parameter, std::move(make)};
  return parameter;
}

void DeferredParameters::defer_existing(const at::Tensor& parameter, Make make) {
  // set_data keeps the parameter's identity (its module, autograd); its storage is freed.
  at::Tensor(parameter).set_data(placeholder(parameter.sizes()));
  makers_[parameter.unsafeGetTensorImpl()] = Entry{parameter, std::move(make)};
}

bool DeferredParameters::holds(const at::Tensor& parameter) const {
  return makers_.count(parameter.unsafeGetTensorImpl()) != 0;
}

at::Tensor DeferredParameters::make(const at::Tensor& parameter) const {
  auto it = makers_.find(parameter.unsafeGetTensorImpl());
  if (it == makers_.end()) {
    throw Error("a parameter of shape " + shape_text(parameter.sizes()) + " was not deferred");
  }
  at::Tensor values = it->second.make();
  if (values.sizes() != parameter.sizes()) {
    throw Error("a deferred parameter of shape " + shape_text(parameter.sizes()) +
                " was made with shape " + shape_text(values.sizes()));
  }
  return values.to(at::kFloat);
}

void DeferredParameters::materialize(const at::Tensor& parameter, c10::Device device) const {
  at::Tensor values = make(parameter).to(device);
  at::Tensor(parameter).set_data(values);
}

}  // namespace trainyard
