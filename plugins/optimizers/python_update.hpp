#pragma once
// The update paths of torch.optim (2.11) that the optimizer plugins reproduce operation for
// operation, and the choice among them. Python's optimizers have three: a for-loop over the
// parameters ("single", `foreach=False`), the multi-tensor `_foreach_*` ops ("foreach") and the
// fused kernels (`fused=True`). Each rounds differently, so a run matches Python's only when it
// takes the same path. With neither `foreach` nor `fused` given, Python takes foreach when every
// parameter is on a device with foreach kernels (cuda, xpu, mtia, a private backend) and the
// for-loop otherwise, cpu included (torch/optim/optimizer.py, _default_to_fused_or_foreach).

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "trainyard/api/config.hpp"

namespace trainyard::python_update {

enum class Path { kAuto, kSingle, kForeach, kFused };

inline OptionSpec implementation_option() {
  return option("implementation", "auto",
                "update path, as in torch.optim: \"single\" (the for-loop, foreach=False), "
                "\"foreach\" (_foreach_* ops), \"fused\" (fused=True kernels), or \"auto\" "
                "(Python's default: foreach when every parameter is on cuda, else single)")
      .one_of({"auto", "single", "foreach", "fused"});
}

inline Path parse_path(const Config& options) {
  const std::string name = options.get_string("implementation");
  if (name == "auto") return Path::kAuto;
  if (name == "single") return Path::kSingle;
  if (name == "foreach") return Path::kForeach;
  if (name == "fused") return Path::kFused;
  options.fail("implementation",
               "must be \"auto\", \"single\", \"foreach\" or \"fused\", got \"" + name + "\"");
}

inline const char* path_name(Path path) {
  switch (path) {
    case Path::kAuto:
      return "auto";
    case Path::kSingle:
      return "single";
    case Path::kForeach:
      return "foreach";
    case Path::kFused:
      return "fused";
  }
  return "auto";
}

inline bool has_foreach_kernels(const at::Tensor& tensor) {
  const auto type = tensor.device().type();
  return type == c10::DeviceType::CUDA || type == c10::DeviceType::XPU ||
         type == c10::DeviceType::MTIA || type == c10::DeviceType::PrivateUse1;
}

// What `auto` stands for with these parameters.
// Every parameter of an optimizer's groups, in order (what resolve() decides the path over).
inline std::vector<at::Tensor> all_parameters(
    const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  std::vector<at::Tensor> all;
  for (const auto& group : groups) {
    for (const auto& p : group.params()) all.push_back(p);
  }
  return all;
}

inline Path resolve(Path path, const std::vector<at::Tensor>& parameters) {
  if (path != Path::kAuto) return path;
  for (const auto& parameter : parameters) {
    if (!has_foreach_kernels(parameter)) return Path::kSingle;
  }
  return parameters.empty() ? Path::kSingle : Path::kForeach;
}

// Says which path a run's optimizer takes, once per process and only on rank 0 (RANK, as the
// launcher sets it; sharded strategies create one optimizer per shard group, all alike). Called
// at the first step, so that a run failing before it still says only why. `how` says more of how
// the path is computed, when there is more to say.
inline void announce(const char* optimizer, Path requested, Path taken,
                     const std::string& how = "") {
  static std::once_flag once;
  std::call_once(once, [&] {
    const char* rank = std::getenv("RANK");
    if (rank && std::string(rank) != "0") return;
    std::string line = std::string("trainyard: optimizer ") + optimizer + ": implementation " +
                       path_name(taken);
    if (requested == Path::kAuto) line += " (auto: torch.optim's default for these devices)";
    if (!how.empty()) line += "; " + how;
    std::cerr << line << std::endl;
  });
}

// Parameter indices grouped by (device, dtype), as torch.optim's
// _group_tensors_by_device_and_dtype does before each foreach or fused call.
inline std::vector<std::vector<std::size_t>> group_by_device_and_dtype(
    const std::vector<at::Tensor>& tensors) {
  std::map<std::pair<std::string, int>, std::size_t> slot;
  std::vector<std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto key =
        std::make_pair(tensors[i].device().str(), static_cast<int>(tensors[i].scalar_type()));
    auto [it, added] = slot.emplace(key, groups.size());
    if (added) groups.emplace_back();
    groups[it->second].push_back(i);
  }
  return groups;
}

template <typename T>
std::vector<T> pick(const std::vector<T>& values, const std::vector<std::size_t>& indices) {
  std::vector<T> out;
  out.reserve(indices.size());
  for (auto i : indices) out.push_back(values[i]);
  return out;
}

}  // namespace trainyard::python_update
