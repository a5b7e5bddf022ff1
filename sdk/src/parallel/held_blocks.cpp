#include "trainyard/parallel/held_blocks.hpp"

#include <memory>
#include <utility>

#include "trainyard/api/component.hpp"

namespace trainyard {
namespace {

// A block's forward that holds the library its code lives in. Members are destroyed in reverse
// order: the plugin's closure first, then the reference to its library.
struct LibraryHeldForward {
  std::shared_ptr<void> library;
  std::function<Activations(const Activations&)> forward;

  Activations operator()(const Activations& input) const { return forward(input); }
};

}  // namespace

std::vector<Block> held_blocks(Model& model) {
  std::vector<Block> blocks = model.blocks();
  const std::shared_ptr<void> library = model.library();
  if (!library) return blocks;
  for (Block& block : blocks) {
    block.module = keep_library_loaded(std::move(block.module), library);
    if (block.forward) block.forward = LibraryHeldForward{library, std::move(block.forward)};
  }
  return blocks;
}

}  // namespace trainyard
