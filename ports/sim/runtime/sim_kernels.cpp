// Sim kernels. Memory, copies and views are implemented here; random ops draw from the sim
// generator; batch norm runs the CPU kernel on host aliases of sim memory; everything else runs
// through a boxed CPU fallback (inputs copied to the host, the CPU kernel run, results copied
// back), so the sim device computes bit for bit what the CPU does.

#include <ATen/EmptyTensor.h>
#include <ATen/core/op_registration/adaption.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>

#include <mutex>
#include <optional>
#include <string>

#include "sim_generator.hpp"
#include "sim_runtime.hpp"

namespace sim {
namespace {

constexpr c10::DispatchKeySet kSimKeys(c10::DispatchKey::PrivateUse1);

// A CPU tensor over the same bytes: sim memory is host memory, so no copy is needed.
at::Tensor host_alias(const at::Tensor& tensor) {
  return at::from_blob(tensor.data_ptr(), tensor.sizes(), tensor.strides(),
                       tensor.options().device(at::kCPU));
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "sim: only strided tensors are supported");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "sim: pinned memory is host-only");
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_generic(size, at::GetAllocator(c10::DeviceType::PrivateUse1), kSimKeys,
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "sim: only strided tensors are supported");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "sim: pinned memory is host-only");
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_strided_generic(size, stride,
                                           at::GetAllocator(c10::DeviceType::PrivateUse1), kSimKeys,
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  std::optional<int64_t> offset;
  if (storage_offset) offset = storage_offset->expect_int();
  return at::native::as_strided_tensorimpl(self, C10_AS_INTARRAYREF_SLOW(size),
                                           C10_AS_INTARRAYREF_SLOW(stride), offset);
}

const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size,
                         std::optional<c10::MemoryFormat> memory_format) {
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), memory_format);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size,
                         c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size),
                                    C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

// Copies between the host and sim devices, and between sim devices: all of them host memory.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  const at::Tensor source = self.is_cpu() ? self : host_alias(self);
  at::Tensor target = dst.is_cpu() ? dst : host_alias(dst);
  at::native::copy_(target, source, false);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  return at::native::_local_scalar_dense_cpu(host_alias(self));
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  return at::native::set_(self, std::move(source));
}

at::Tensor& set_source_storage_offset(at::Tensor& self, at::Storage source, int64_t offset,
                                      c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::set_storage_cpu_(self, std::move(source), offset, size, stride);
}

// The sim generator an op draws from: the one it was given, else its device's default.
SimGenerator* generator_for(const at::Tensor& self, const std::optional<at::Generator>& given) {
  const at::Generator& chosen =
      given.has_value() && given->defined() ? *given : default_generator(self.device().index());
  return at::check_generator<SimGenerator>(chosen);
}

// Runs `draw(host_alias(self), cpu_engine)` holding the sim generator's lock.
template <typename Draw>
at::Tensor& draw_into(at::Tensor& self, const std::optional<at::Generator>& given, Draw draw) {
  SimGenerator* generator = generator_for(self, given);
  std::lock_guard<std::mutex> lock(generator->mutex_);
  at::Tensor host = host_alias(self);
  draw(host, generator->engine());
  return self;
}

at::Tensor& bernoulli_float(at::Tensor& self, double p, std::optional<at::Generator> given) {
  return draw_into(self, given, [p](at::Tensor& host, const at::Generator& engine) {
    host.bernoulli_(p, engine);
  });
}

at::Tensor& uniform(at::Tensor& self, double from, double to, std::optional<at::Generator> given) {
  return draw_into(self, given, [=](at::Tensor& host, const at::Generator& engine) {
    host.uniform_(from, to, engine);
  });
}

at::Tensor& normal(at::Tensor& self, double mean, double std, std::optional<at::Generator> given) {
  return draw_into(self, given, [=](at::Tensor& host, const at::Generator& engine) {
    host.normal_(mean, std, engine);
  });
}

at::Tensor& random_from(at::Tensor& self, int64_t from, std::optional<int64_t> to,
                        std::optional<at::Generator> given) {
  return draw_into(self, given, [=](at::Tensor& host, const at::Generator& engine) {
    host.random_(from, to, engine);
  });
}

at::Tensor& random_to(at::Tensor& self, int64_t to, std::optional<at::Generator> given) {
  return draw_into(self, given, [=](at::Tensor& host, const at::Generator& engine) {
    host.random_(to, engine);
  });
}

at::Tensor& random_full(at::Tensor& self, std::optional<at::Generator> given) {
  return draw_into(self, given,
                   [](at::Tensor& host, const at::Generator& engine) { host.random_(engine); });
}

// Dropout's fused form (ATen picks it for every accelerator): the mask comes from the sim
// generator, the arithmetic is the CPU kernel's (input * mask * 1/(1-p)).
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p,
                                                  std::optional<bool> train) {
  if (input.numel() == 0 || (train.has_value() && !*train)) {
    at::Tensor mask = at::empty(input.sizes(), input.options().dtype(at::kBool)).fill_(true);
    return {input.clone(), mask};
  }
  const double keep = 1.0 - p;
  const double scale = keep == 0 ? 0.0 : 1.0 / keep;
  at::Tensor mask = at::empty(input.sizes(), input.options().dtype(at::kBool));
  bernoulli_float(mask, keep, std::nullopt);
  at::Tensor output = input.mul(mask).mul_(scale);
  return {output, mask};
}

// Whether `from`'s storage may replace `self`'s in place (Module::to uses set_data). ATen's own
// check knows only its built-in dense backends; host and sim tensors are both plain dense ones.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto plain_dense = [](const at::Tensor& tensor) {
    return tensor.layout() == c10::Layout::Strided && !tensor.is_quantized() &&
           (tensor.is_cpu() || tensor.is_privateuseone());
  };
  if (plain_dense(self) && plain_dense(from)) return true;
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

bool takes_a_generator(const c10::FunctionSchema& schema) {
  for (const auto& argument : schema.arguments()) {
    if (argument.type()->str().find("Generator") != std::string::npos) return true;
  }
  return false;
}

// Every other op runs on the CPU. A random op not implemented above is refused rather than run
// with the CPU's generator, which would make the sim device's random streams silently wrong.
void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  TORCH_CHECK(!takes_a_generator(op.schema()), "sim: random operator '",
              op.schema().operator_name(), "' is not implemented for the sim device");
  at::native::cpu_fallback(op, stack);
}

// Runs the CPU kernel on host aliases of the sim tensors, with no copies, so that whatever the
// kernel writes into its arguments lands in sim memory. For ops that update an argument their
// schema does not declare mutable (native_batch_norm's running statistics): the copying fallback
// copies back only declared mutations, and would drop those updates. The results, new CPU
// tensors, move to the device of the first sim argument.
void host_alias_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::size_t count = op.schema().arguments().size();
  std::optional<c10::Device> device;
  for (std::size_t i = stack->size() - count; i < stack->size(); ++i) {
    c10::IValue& argument = (*stack)[i];
    if (!argument.isTensor()) continue;
    const at::Tensor& tensor = argument.toTensor();
    if (!tensor.defined() || !tensor.is_privateuseone()) continue;
    if (!device) device = tensor.device();
    argument = host_alias(tensor);
  }
  TORCH_CHECK(device.has_value(), "sim: '", op.schema().operator_name(),
              "' was dispatched to the sim device without a sim tensor");
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  const std::size_t results = op.schema().returns().size();
  for (std::size_t i = stack->size() - results; i < stack->size(); ++i) {
    c10::IValue& result = (*stack)[i];
    if (result.isTensor() && result.toTensor().defined()) {
      result = result.toTensor().to(*device);
    }
  }
}

}  // namespace

// The batch-norm kernels that update the running statistics in place without declaring it.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_batch_norm", torch::CppFunction::makeFromBoxedFunction<&host_alias_kernel>());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("resize_", resize);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("view", view);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Storage_storage_offset", set_source_storage_offset);
  m.impl("bernoulli_.float", bernoulli_float);
  m.impl("uniform_", uniform);
  m.impl("normal_", normal);
  m.impl("random_.from", random_from);
  m.impl("random_.to", random_to);
  m.impl("random_", random_full);
  m.impl("native_dropout", native_dropout);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
}

// Ops whose generic (CompositeExplicitAutograd) kernel would pick a per-backend path the sim
// device lacks (convolution_overrideable): run the CPU's whole op instead, so the CPU chooses its
// algorithm exactly as it would for a CPU tensor.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name : {"convolution", "convolution_backward"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
  }
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
}

}  // namespace sim
