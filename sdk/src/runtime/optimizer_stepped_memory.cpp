#include "trainyard/runtime/optimizer_stepped_memory.hpp"

namespace trainyard {

OptimizerSteppedMemory::OptimizerSteppedMemory(const std::vector<at::Tensor>& tensors) {
  for (const auto& tensor : tensors) {
    if (tensor.defined() && tensor.has_storage()) {
      storages_.insert(tensor.storage().unsafeGetStorageImpl());
    }
  }
}

bool OptimizerSteppedMemory::holds(const at::Tensor& tensor) const {
  return tensor.defined() && tensor.has_storage() &&
         storages_.count(tensor.storage().unsafeGetStorageImpl()) != 0;
}

}  // namespace trainyard
