#include "collective_checks.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string_view>

#include "trainyard/api/error.hpp"
#include "trainyard/runtime/dtype_name.hpp"

namespace trainyard {

namespace {

// The operations a signature names by their index here.
constexpr std::array<std::string_view, 19> kOperations = {"broadcast",
                                                          "allreduce",
                                                          "allreduce_sparse",
                                                          "allreduce_coalesced",
                                                          "reduce",
                                                          "allgather",
                                                          "_allgather_base",
                                                          "allgather_coalesced",
                                                          "allgather_into_tensor_coalesced",
                                                          "gather",
                                                          "scatter",
                                                          "reduce_scatter",
                                                          "_reduce_scatter_base",
                                                          "reduce_scatter_tensor_coalesced",
                                                          "alltoall_base",
                                                          "alltoall",
                                                          "barrier",
                                                          "monitoredBarrier",
                                                          "other"};

// A signature: operation, dtype, tensor count, elements in all, then the first tensor's rank
// and up to kDims of its sizes.
constexpr std::int64_t kDims = 8;
constexpr std::int64_t kFields = 5 + kDims;

std::int64_t operation_code(const char* operation) {
  const auto found = std::find(kOperations.begin(), kOperations.end(), std::string_view(operation));
  return found == kOperations.end() ? static_cast<std::int64_t>(kOperations.size()) - 1
                                    : found - kOperations.begin();
}

std::vector<std::int64_t> signature(const char* operation, const std::vector<at::Tensor>& tensors) {
  std::vector<std::int64_t> fields(static_cast<std::size_t>(kFields), 0);
  fields[0] = operation_code(operation);
  fields[1] = -1;
  // Only the root of a scatter has inputs: the others' differ by design.
  if (tensors.empty() || std::strcmp(operation, "scatter") == 0) return fields;
  fields[1] = static_cast<std::int64_t>(tensors.front().scalar_type());
  fields[2] = static_cast<std::int64_t>(tensors.size());
  for (const auto& tensor : tensors) fields[3] += tensor.numel();
  const auto sizes = tensors.front().sizes();
  fields[4] = static_cast<std::int64_t>(sizes.size());
  for (std::int64_t d = 0; d < std::min<std::int64_t>(kDims, fields[4]); ++d) {
    fields[static_cast<std::size_t>(5 + d)] = sizes[static_cast<std::size_t>(d)];
  }
  return fields;
}

// "allreduce float32 [4, 3]", with the tensor count and elements when there are several.
std::string describe_signature(const std::int64_t* fields) {
  std::string out(kOperations.at(static_cast<std::size_t>(
      std::clamp<std::int64_t>(fields[0], 0, static_cast<std::int64_t>(kOperations.size()) - 1))));
  if (fields[1] < 0) return out;
  out.append(" ").append(dtype_name(static_cast<c10::ScalarType>(fields[1]))).append(" [");
  for (std::int64_t d = 0; d < std::min(kDims, fields[4]); ++d) {
    out += (d ? ", " : "") + std::to_string(fields[5 + d]);
  }
  out += fields[4] > kDims ? ", ...]" : "]";
  if (fields[2] > 1) {
    out += " and " + std::to_string(fields[2] - 1) + " more tensors (" + std::to_string(fields[3]) +
           " elements)";
  }
  return out;
}

}  // namespace

void check_same_collective(c10d::Backend& backend, const CollectiveGroup& group,
                           std::int64_t sequence, const char* operation,
                           const std::vector<at::Tensor>& tensors) {
  const int size = backend.getSize();
  const c10::Device device = tensors.empty() ? c10::Device(c10::kCPU) : tensors.front().device();
  const std::vector<std::int64_t> fields = signature(operation, tensors);
  std::vector<at::Tensor> mine = {at::tensor(fields, at::TensorOptions(at::kLong)).to(device)};
  std::vector<std::vector<at::Tensor>> all(1);
  for (int r = 0; r < size; ++r) all[0].push_back(at::empty({kFields}, mine[0].options()));
  backend.allgather(all, mine, c10d::AllgatherOptions())->wait();
  const at::Tensor gathered = at::stack(all[0]).cpu().contiguous();
  const std::int64_t* table = gathered.data_ptr<std::int64_t>();
  bool same = true;
  for (int r = 1; r < size && same; ++r) {
    same = std::equal(table, table + kFields, table + r * kFields);
  }
  if (same) return;
  std::string message = "collective mismatch on group " + group.name + " at #" +
                        std::to_string(sequence) + " (comm.debug = \"detail\"): ";
  for (int r = 0; r < size; ++r) {
    const int global =
        r < static_cast<int>(group.ranks.size()) ? group.ranks[static_cast<std::size_t>(r)] : r;
    message += (r ? "; rank " : "rank ") + std::to_string(global) + " " +
               describe_signature(table + r * kFields);
  }
  throw Error(message);
}

}  // namespace trainyard
