#pragma once
// What a factory may know about the run when it builds a component.

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <any>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace trainyard {

class Communicator;
class DeviceBackend;
class ProcessMesh;

// A contiguous range of a model's blocks, [begin, end) in forward order (end -1: to the last).
struct BlockRange {
  std::int64_t begin = 0;
  std::int64_t end = -1;
};

// Shapes a dataset promises, so a model can size itself (input channels, classes, vocabulary).
struct DatasetInfo {
  std::vector<std::int64_t> input_shape;  // of one sample, without the batch dimension
  std::int64_t num_classes = 0;           // classification; 0 when not applicable
  std::int64_t vocab_size = 0;            // language modelling; 0 when not applicable
  std::int64_t sequence_length = 0;       // language modelling; 0 when not applicable
};

// BuildContext::extensions[kComputeDtypeExtension]: the c10::ScalarType the run's precision
// computes matrix products in (autocast's dtype), present when the precision autocasts. A model
// may keep weights that only matrix products read and that take no gradient (a frozen base
// under adapters) in it: autocast would cast them to it for every product anyway, so the results
// are the same and the weights take half the memory.
inline constexpr const char* kComputeDtypeExtension = "trainyard.compute_dtype";

struct BuildContext {
  c10::Device device = c10::Device(c10::kCPU);
  // The backend driving `device` (what a precision asks which dtypes the device computes
  // natively); null outside a run and in tests that build a component alone.
  std::shared_ptr<DeviceBackend> device_backend;
  std::uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
  DatasetInfo data;
  // Relative paths in a recipe resolve against the folder of the recipe that wrote them.
  std::filesystem::path recipe_dir;
  // The run's output folder, where components may write files of their own (a pipeline's
  // measured timeline). Empty outside a run.
  std::filesystem::path output_dir;
  // Null in a single-process run.
  std::shared_ptr<Communicator> communicator;
  // Where this rank sits in the run's parallel layout, with the group of each dimension
  // (process_mesh.hpp). The engine always sets it: a single process has a mesh of one rank.
  std::shared_ptr<ProcessMesh> mesh;
  // The blocks to build (a pipeline stage): a model allocates only these; all when unset.
  std::optional<BlockRange> blocks;
  // Named extras a strategy hands to the components it builds; consumers any_cast what they
  // understand and ignore the rest.
  std::map<std::string, std::any> extensions;
};

// The compute dtype a build's extensions carry (kComputeDtypeExtension), if any.
inline std::optional<c10::ScalarType> compute_dtype(const BuildContext& build) {
  auto it = build.extensions.find(kComputeDtypeExtension);
  if (it == build.extensions.end()) return std::nullopt;
  const auto* dtype = std::any_cast<c10::ScalarType>(&it->second);
  return dtype ? std::optional<c10::ScalarType>(*dtype) : std::nullopt;
}

}  // namespace trainyard
