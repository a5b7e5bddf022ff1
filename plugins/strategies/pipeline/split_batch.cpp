#include "split_batch.hpp"

#include <string>

#include "trainyard/api/error.hpp"

namespace trainyard {

std::vector<Batch> split_batch(const Batch& batch, std::int64_t count) {
  if (batch.size < count) {
    throw Error("pipeline: a batch of " + std::to_string(batch.size) +
                " samples cannot be split into " + std::to_string(count) +
                " micro-batches; use batches of at least micro_batches samples");
  }
  std::vector<Batch> parts(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t begin = batch.size * i / count;
    const std::int64_t end = batch.size * (i + 1) / count;
    Batch& part = parts[static_cast<std::size_t>(i)];
    part.size = end - begin;
    for (const auto& [name, tensor] : batch.tensors) {
      part.tensors.emplace(name, tensor.narrow(0, begin, end - begin));
    }
  }
  return parts;
}

}  // namespace trainyard
