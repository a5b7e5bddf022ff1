#pragma once
// Parameters whose values are made when their holder needs them, so that a strategy sharding
// the model as it takes it (fsdp) never holds the whole model: not while drawing a fresh one,
// nor while reading published weights (pretrained_weights.hpp).
//
// The strategy hands the model builder a DeferredParameters in
// BuildContext::extensions[kDeferredParametersExtension] (a std::shared_ptr). A model that
// supports it gives each parameter a placeholder (a float32 CPU tensor of its shape without
// storage: nothing may read it) and records how to make its values; the strategy then makes one
// parameter at a time, keeps its part and drops the rest. A placeholder is a CPU tensor rather
// than a meta one because a parameter keeps its identity across set_data only between dense
// device types. A model that ignores the extension builds as always, and the strategy takes its
// parameters as they are: supporting it is a matter of memory, never of results.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <unordered_map>

namespace trainyard {

inline constexpr const char* kDeferredParametersExtension = "trainyard.deferred_parameters";

class DeferredParameters {
 public:
  // Makes a parameter's values: a float32 tensor of its shape, on any device. Called at most
  // once per parameter, in any order, so each must draw from its own stream (parameter_init.hpp)
  // or read its own bytes.
  using Make = std::function<at::Tensor()>;

  // A new placeholder of `sizes`, whose values `make` gives.
  at::Tensor defer(at::IntArrayRef sizes, Make make);
  // Makes the existing `parameter` (a module's own, registered already) a placeholder, freeing
  // its storage and keeping its identity, with its values from `make`.
  void defer_existing(const at::Tensor& parameter, Make make);

  bool holds(const at::Tensor& parameter) const;
  std::size_t size() const { return makers_.size(); }
  // The values of deferred `parameter`, made now (float32, its shape). Throws Error when the
  // parameter was not deferred or `make` gives another shape.
  at::Tensor make(const at::Tensor& parameter) const;
  // Gives placeholder `parameter` its values on `device`, keeping its identity.
  void materialize(const at::Tensor& parameter, c10::Device device) const;

 private:
  struct Entry {
    at::Tensor parameter;  // kept so that its identity (the key) is not reused
    Make make;
  };
  std::unordered_map<const void*, Entry> makers_;
};

}  // namespace trainyard
