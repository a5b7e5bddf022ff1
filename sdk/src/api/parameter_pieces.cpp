#include "trainyard/api/parameter_pieces.hpp"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <map>
#include <set>

#include "trainyard/api/error.hpp"
#include "trainyard/api/optimizer.hpp"

namespace trainyard {

namespace {

constexpr const char* kModelPrefix = "model.";
constexpr const char* kOptimizerPrefix = "optimizer.";
// The prefix the plugin's own entries are made under while they are re-keyed by parameter.
constexpr const char* kPluginPrefix = "held.";

// The optimizer's parameters in order: the held tensors the layouts describe.
std::vector<at::Tensor> held_tensors(const torch::optim::Optimizer& optimizer,
                                     std::size_t layouts) {
  std::vector<at::Tensor> held;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& parameter : group.params()) held.push_back(parameter);
  }
  if (held.size() != layouts) {
    throw Error("the optimizer holds " + std::to_string(held.size()) + " tensors, the layout " +
                std::to_string(layouts));
  }
  return held;
}

// The piece's values in its own shape: a view of the held tensor, no copy.
at::Tensor piece_values(const at::Tensor& flat_held, const ParameterPiece& piece) {
  return flat_held.narrow(0, piece.offset, piece.length).view(piece.shape);
}

// "held.param.<i>.<field>" -> (i, field).
std::pair<std::size_t, std::string> split_plugin_key(const std::string& key) {
  const std::string rest = key.substr(std::string(kPluginPrefix).size() + 6);  // "param."
  const auto dot = rest.find('.');
  return {std::stoul(rest.substr(0, dot)), rest.substr(dot + 1)};
}

// Elements [from, to) of `piece`'s own row-major order as pieces of its parameter, appended to
// `out` at buffer position `start` + (element - from). A piece that is whole (or flat) gives one
// flat range; a box gives the boxes that cover the run, each contiguous in the box's order: at
// every step the widest block that starts at `from` and ends by `to` (whole trailing dimensions
// and a run along the dimension before them).
void add_piece_run(const ParameterPiece& piece, std::int64_t from, std::int64_t to,
                   std::int64_t start, HeldLayout& out) {
  const TensorPlacement& placement = piece.placement;
  if (from == 0 && to == piece.length) {
    ParameterPiece whole = piece;
    whole.offset = start;
    out.push_back(std::move(whole));
    return;
  }
  const bool box_of_whole =
      placement.flat_offset < 0 && piece.shape != placement.global_shape;
  if (!box_of_whole) {
    const std::int64_t flat_start = placement.flat_offset < 0 ? 0 : placement.flat_offset;
    out.push_back(ParameterPiece{piece.name, start, to - from,
                                 TensorPlacement::flat(placement.global_shape, flat_start + from),
                                 {to - from}});
    return;
  }
  const std::vector<std::int64_t>& extent = piece.shape;
  const auto dims = extent.size();
  std::vector<std::int64_t> strides(dims, 1);
  for (std::size_t k = dims - 1; k > 0; --k) strides[k - 1] = strides[k] * extent[k];
  std::int64_t position = from;
  while (position < to) {
    std::size_t k = 0;  // the outermost dimension whose block fits
    while (position % strides[k] != 0 || position + strides[k] > to) ++k;
    const std::int64_t index = (position / strides[k]) % extent[k];
    const std::int64_t blocks = std::min((to - position) / strides[k], extent[k] - index);
    std::vector<std::int64_t> offsets = placement.offsets;
    std::vector<std::int64_t> shape(dims, 1);
    for (std::size_t d = 0; d < k; ++d) offsets[d] += (position / strides[d]) % extent[d];
    offsets[k] += index;
    shape[k] = blocks;
    for (std::size_t d = k + 1; d < dims; ++d) shape[d] = extent[d];
    const std::int64_t length = blocks * strides[k];
    out.push_back(ParameterPiece{piece.name, start + (position - from), length,
                                 TensorPlacement::box(placement.global_shape, offsets), shape});
    position += length;
  }
}

}  // namespace

HeldLayout whole_parameter_layout(const std::string& name, const std::vector<std::int64_t>& shape) {
  return {
      ParameterPiece{name, 0, c10::multiply_integers(shape), TensorPlacement::whole(shape), shape}};
}

HeldLayout parameter_box_layout(const std::string& name,
                                const std::vector<std::int64_t>& global_shape,
                                const std::vector<std::int64_t>& offsets,
                                const std::vector<std::int64_t>& shape) {
  return {ParameterPiece{name, 0, c10::multiply_integers(shape),
                         TensorPlacement::box(global_shape, offsets), shape}};
}

HeldLayout flat_shard_layout(const std::vector<std::string>& names,
                             const std::vector<std::vector<std::int64_t>>& shapes,
                             std::int64_t begin, std::int64_t count) {
  HeldLayout layout;
  std::int64_t start = 0;  // of the current parameter in the flat buffer
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::int64_t size = c10::multiply_integers(shapes[i]);
    const std::int64_t from = std::max(begin, start);
    const std::int64_t to = std::min(begin + count, start + size);
    if (from < to && to - from == size) {
      layout.push_back(ParameterPiece{names[i], from - begin, size,
                                      TensorPlacement::whole(shapes[i]), shapes[i]});
    } else if (from < to) {
      layout.push_back(ParameterPiece{names[i],
                                      from - begin,
                                      to - from,
                                      TensorPlacement::flat(shapes[i], from - start),
                                      {to - from}});
    }
    start += size;
  }
  return layout;
}

HeldLayout flat_shard_layout(const std::vector<HeldLayout>& layouts,
                             const std::vector<std::int64_t>& numels, std::int64_t begin,
                             std::int64_t count) {
  if (layouts.size() != numels.size()) {
    throw Error("flat_shard_layout: " + std::to_string(layouts.size()) + " layouts for " +
                std::to_string(numels.size()) + " held tensors");
  }
  HeldLayout layout;
  std::int64_t start = 0;  // of the current held tensor in the flat buffer
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    for (const ParameterPiece& piece : layouts[i]) {
      const std::int64_t piece_start = start + piece.offset;
      const std::int64_t from = std::max(begin, piece_start);
      const std::int64_t to = std::min(begin + count, piece_start + piece.length);
      if (from < to) add_piece_run(piece, from - piece_start, to - piece_start, from - begin, layout);
    }
    start += numels[i];
  }
  return layout;
}

void put_held_pieces(StateDict& out, const std::string& prefix, const torch::Tensor& held,
                     const HeldLayout& layout, const std::string& replicas) {
  const at::Tensor flat = held.detach().reshape({-1});
  for (const ParameterPiece& piece : layout) {
    TensorPlacement placement = piece.placement;
    placement.replicas = replicas;
    put_piece(out, prefix + piece.name, piece_values(flat, piece), placement);
  }
}

void read_held_pieces(const PlacedState& state, const std::string& prefix, const HeldLayout& layout,
                      const torch::Tensor& held) {
  at::Tensor values = at::zeros({held.numel()}, held.options().device(at::kCPU));
  for (const ParameterPiece& piece : layout) {
    const std::string name = prefix + piece.name;
    if (state.global_shape(name) != piece.placement.global_shape) {
      throw Error("checkpoint's '" + name + "' has another shape than this model's");
    }
    at::Tensor part;
    if (piece.placement.flat_offset >= 0) {
      part = state.flat_range(name, piece.placement.flat_offset, piece.length);
    } else {
      part = state.box(name, piece.placement.offsets, piece.shape);
    }
    values.narrow(0, piece.offset, piece.length).copy_(part.reshape({-1}).to(values.dtype()));
  }
  at::NoGradGuard no_grad;
  held.copy_(values.view(held.sizes()));
}

OptimizerFields optimizer_fields(const Optimizer& plugin,
                                 const torch::optim::Optimizer& optimizer) {
  std::size_t held = 0;
  for (const auto& group : optimizer.param_groups()) held += group.params().size();
  OptimizerFields fields(held);
  StateDict own;
  plugin.save_state_views(optimizer, kPluginPrefix, own);
  for (const auto& [key, value] : own.tensors) {
    const auto [index, field] = split_plugin_key(key);
    if (index >= held) {
      throw Error("optimizer state for parameter " + std::to_string(index) + " of " +
                  std::to_string(held));
    }
    fields[index][field] = value;
  }
  return fields;
}

void put_optimizer_pieces(const OptimizerFields& fields,
                          const std::vector<std::int64_t>& held_numels,
                          const std::vector<HeldLayout>& layouts, StateDict& pieces,
                          StateDict& whole, const std::string& replicas) {
  if (fields.size() != layouts.size() || held_numels.size() != layouts.size()) {
    throw Error("optimizer state of " + std::to_string(fields.size()) + " tensors, a layout of " +
                std::to_string(layouts.size()));
  }
  for (std::size_t index = 0; index < layouts.size(); ++index) {
    for (const auto& [field, value] : fields[index]) {
      const bool per_element = value.dim() > 0 && value.numel() == held_numels[index];
      const at::Tensor flat = value.reshape({-1});
      for (const ParameterPiece& piece : layouts[index]) {
        const std::string name = kOptimizerPrefix + piece.name + "." + field;
        if (!per_element) {
          TensorPlacement placement = TensorPlacement::whole(value.sizes().vec());
          placement.replicas = replicas;
          put_piece(whole, name, value, placement);
          continue;
        }
        TensorPlacement placement = piece.placement;
        placement.replicas = replicas;
        put_piece(pieces, name, piece_values(flat, piece), placement);
      }
    }
  }
}

void save_optimizer_pieces(const Optimizer& plugin, const torch::optim::Optimizer& optimizer,
                           const std::vector<HeldLayout>& layouts, StateDict& pieces,
                           StateDict& whole, const std::string& replicas) {
  std::vector<std::int64_t> numels;
  for (const auto& tensor : held_tensors(optimizer, layouts.size()))
    numels.push_back(tensor.numel());
  put_optimizer_pieces(optimizer_fields(plugin, optimizer), numels, layouts, pieces, whole,
                       replicas);
}

void load_optimizer_pieces(const Optimizer& plugin, torch::optim::Optimizer& optimizer,
                           const std::vector<HeldLayout>& layouts, const PlacedState& state) {
  const std::vector<at::Tensor> held = held_tensors(optimizer, layouts.size());
  StateDict own;
  for (std::size_t index = 0; index < layouts.size(); ++index) {
    const HeldLayout& layout = layouts[index];
    if (layout.empty()) continue;
    // The fields saved for this tensor's parameters (every piece has the same ones).
    const std::string first = std::string(kOptimizerPrefix) + layout.front().name + ".";
    for (const std::string& name : state.names(first)) {
      const std::string field = name.substr(first.size());
      if (field.find('.') != std::string::npos) continue;  // another parameter's longer name
      const std::vector<std::int64_t> shape = state.global_shape(name);
      const bool per_element = !shape.empty() && shape == layout.front().placement.global_shape;
      const std::string key =
          std::string(kPluginPrefix) + "param." + std::to_string(index) + "." + field;
      if (!per_element) {
        own.tensors[key] = state.whole(name);
        continue;
      }
      at::Tensor values = at::zeros_like(held[index], held[index].options().device(at::kCPU));
      HeldLayout fields = layout;
      for (auto& piece : fields) piece.name = piece.name + "." + field;
      read_held_pieces(state, kOptimizerPrefix, fields, values);
      own.tensors[key] = values;
    }
  }
  plugin.load_state(optimizer, kPluginPrefix, own);
}

namespace {

std::vector<HeldLayout> whole_layouts_of(const torch::nn::Module& module) {
  std::vector<HeldLayout> layouts;
  for (const auto& item : module.named_parameters(true)) {
    layouts.push_back(whole_parameter_layout(item.key(), item.value().sizes().vec()));
  }
  return layouts;
}

}  // namespace

bool holds_whole(const HeldLayout& layout) {
  return layout.size() == 1 && layout.front().offset == 0 &&
         layout.front().placement.flat_offset < 0 &&
         layout.front().shape == layout.front().placement.global_shape;
}

void save_module_pieces(const torch::nn::Module& module, const std::vector<HeldLayout>& layouts,
                        const Optimizer& plugin, const torch::optim::Optimizer* optimizer,
                        StateDict& out, const std::string& replicas) {
  std::size_t index = 0;
  for (const auto& item : module.named_parameters(true)) {
    const HeldLayout& layout = layouts.at(index++);
    // Frozen: rebuilt by the model (from its weights or its seed), never trained.
    if (!item.value().requires_grad()) continue;
    put_held_pieces(out, kModelPrefix, item.value().detach(), layout, replicas);
  }
  for (const auto& item : module.named_buffers(true)) {
    TensorPlacement placement = TensorPlacement::whole(item.value().sizes().vec());
    placement.replicas = replicas;
    put_piece(out, kModelPrefix + item.key(), item.value().detach(), placement);
  }
  if (optimizer) save_optimizer_pieces(plugin, *optimizer, layouts, out, out, replicas);
}

void load_module_pieces(torch::nn::Module& module, const std::vector<HeldLayout>& layouts,
                        const Optimizer& plugin, torch::optim::Optimizer* optimizer,
                        const PlacedState& state) {
  std::size_t index = 0;
  for (const auto& item : module.named_parameters(true)) {
    const HeldLayout& layout = layouts.at(index++);
    if (!item.value().requires_grad()) continue;  // frozen: as the model built it
    read_held_pieces(state, kModelPrefix, layout, item.value());
  }
  for (const auto& item : module.named_buffers(true)) {
    read_held_pieces(state, kModelPrefix,
                     whole_parameter_layout(item.key(), item.value().sizes().vec()), item.value());
  }
  if (optimizer) load_optimizer_pieces(plugin, *optimizer, layouts, state);
}

void save_whole_module_state(const torch::nn::Module& module, const Optimizer& plugin,
                             const torch::optim::Optimizer* optimizer, StateDict& shared,
                             const std::string& replicas) {
  save_module_pieces(module, whole_layouts_of(module), plugin, optimizer, shared, replicas);
}

void load_whole_module_state(torch::nn::Module& module, const Optimizer& plugin,
                             torch::optim::Optimizer* optimizer, const PlacedState& state) {
  load_module_pieces(module, whole_layouts_of(module), plugin, optimizer, state);
}

void mark_pieces_format(StateDict& shared) { shared.metadata[kPiecesFormatKey] = "1"; }

void require_pieces_format(const CheckpointState& state) {
  auto it = state.shared.metadata.find(kPiecesFormatKey);
  if (it == state.shared.metadata.end() || it->second != "1") {
    throw Error(
        "the checkpoint keeps parameters and optimizer state in an earlier format, without "
        "placed pieces; resume it with the trainyard version that wrote it");
  }
}

}  // namespace trainyard
