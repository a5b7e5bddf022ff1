#include "trainyard/api/placed_state.hpp"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

#include <sstream>

#include "trainyard/api/error.hpp"

namespace trainyard {

namespace {

std::string join(const std::vector<std::int64_t>& values) {
  std::string text;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i) text += ',';
    text += std::to_string(values[i]);
  }
  return text;
}

std::vector<std::int64_t> split_numbers(const std::string& text, const std::string& whole) {
  std::vector<std::int64_t> values;
  if (text.empty()) return values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      std::size_t used = 0;
      values.push_back(std::stoll(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw Error("bad tensor placement '" + whole + "': '" + item + "' is not an integer");
    }
  }
  return values;
}

// A saved rank's entry ("rank-00003/model.w") names the same tensor as the plain entry.
std::string without_rank_prefix(const std::string& key) {
  if (key.rfind("rank-", 0) != 0) return key;
  const auto slash = key.find('/');
  return slash == std::string::npos ? key : key.substr(slash + 1);
}

}  // namespace

TensorPlacement TensorPlacement::whole(std::vector<std::int64_t> shape) {
  TensorPlacement placement;
  placement.offsets.assign(shape.size(), 0);
  placement.global_shape = std::move(shape);
  return placement;
}

TensorPlacement TensorPlacement::box(std::vector<std::int64_t> global_shape,
                                     std::vector<std::int64_t> offsets) {
  TensorPlacement placement;
  placement.global_shape = std::move(global_shape);
  placement.offsets = std::move(offsets);
  return placement;
}

TensorPlacement TensorPlacement::flat(std::vector<std::int64_t> global_shape,
                                      std::int64_t flat_offset) {
  TensorPlacement placement;
  placement.global_shape = std::move(global_shape);
  placement.flat_offset = flat_offset;
  return placement;
}

std::string TensorPlacement::encode() const {
  std::string text = "global=" + join(global_shape);
  text += flat_offset >= 0 ? ";flat=" + std::to_string(flat_offset) : ";box=" + join(offsets);
  if (!replicas.empty()) text += ";replicas=" + replicas;
  return text;
}

TensorPlacement TensorPlacement::decode(const std::string& text) {
  TensorPlacement placement;
  bool has_global = false;
  bool has_piece = false;
  std::stringstream in(text);
  std::string field;
  while (std::getline(in, field, ';')) {
    const auto equals = field.find('=');
    if (equals == std::string::npos) throw Error("bad tensor placement '" + text + "'");
    const std::string key = field.substr(0, equals);
    const std::string value = field.substr(equals + 1);
    if (key == "global") {
      placement.global_shape = split_numbers(value, text);
      has_global = true;
    } else if (key == "box") {
      placement.offsets = split_numbers(value, text);
      has_piece = true;
    } else if (key == "flat") {
      const auto numbers = split_numbers(value, text);
      if (numbers.size() != 1 || numbers[0] < 0) throw Error("bad tensor placement '" + text + "'");
      placement.flat_offset = numbers[0];
      has_piece = true;
    } else if (key == "replicas") {
      placement.replicas = value;
    } else {
      throw Error("bad tensor placement '" + text + "': unknown field '" + key + "'");
    }
  }
  if (!has_global || !has_piece) throw Error("bad tensor placement '" + text + "'");
  return placement;
}

std::string placement_key(const std::string& name) { return "placement." + name; }

namespace {

// Throws unless `piece` lies inside the whole tensor `placement` describes.
void check_fits(const std::string& name, const at::Tensor& piece,
                const TensorPlacement& placement) {
  const auto& global = placement.global_shape;
  auto refuse = [&](const std::string& why) {
    throw Error("tensor '" + name + "' piece of shape [" + join(piece.sizes().vec()) +
                "] does not fit its placement " + placement.encode() + ": " + why);
  };
  if (placement.flat_offset >= 0) {
    // A flat shard may run past the end into padding, which is never stored as data.
    if (placement.flat_offset > c10::multiply_integers(global)) refuse("it starts past the end");
    return;
  }
  if (placement.offsets.size() != global.size() ||
      static_cast<std::size_t>(piece.dim()) != global.size()) {
    refuse("dimensions differ");
  }
  for (std::size_t d = 0; d < global.size(); ++d) {
    if (placement.offsets[d] < 0 ||
        placement.offsets[d] + piece.size(static_cast<long>(d)) > global[d]) {
      refuse("dimension " + std::to_string(d) + " overruns");
    }
  }
}

}  // namespace

namespace {

// A rank may hold several pieces of one tensor (a fused q/k/v weight split by heads holds three
// boxes): the second and later are stored as "<name>#piece<k>", which readers group with the
// first.
constexpr const char* kPieceSuffix = "#piece";

std::string without_piece_suffix(const std::string& entry) {
  const auto at = entry.rfind(kPieceSuffix);
  return at == std::string::npos ? entry : entry.substr(0, at);
}

}  // namespace

void put_piece(StateDict& out, const std::string& name, const torch::Tensor& piece,
               const TensorPlacement& placement) {
  check_fits(name, piece, placement);
  std::string entry = name;
  for (int k = 1; out.tensors.count(entry) != 0; ++k) {
    entry = name + kPieceSuffix + std::to_string(k);
  }
  out.tensors[entry] = piece;
  out.metadata[placement_key(entry)] = placement.encode();
}

PlacedState::PlacedState(const CheckpointState& state) {
  for (const auto& [name, tensor] : state.shared.tensors) {
    add(name, tensor, state.shared.metadata, placement_key(name));
  }
  for (const auto& [key, tensor] : state.local.tensors) {
    const std::string name = without_rank_prefix(key);
    const std::string prefix = key.substr(0, key.size() - name.size());
    add(name, tensor, state.local.metadata, prefix + placement_key(name));
  }
}

void PlacedState::add(const std::string& entry, const torch::Tensor& tensor,
                      const std::map<std::string, std::string>& metadata,
                      const std::string& metadata_key) {
  auto it = metadata.find(metadata_key);
  TensorPlacement placement = it == metadata.end() ? TensorPlacement::whole(tensor.sizes().vec())
                                                   : TensorPlacement::decode(it->second);
  const std::string name = without_piece_suffix(entry);
  check_fits(name, tensor, placement);
  pieces_[name].push_back(Piece{tensor, std::move(placement)});
}

std::vector<std::string> PlacedState::names(const std::string& prefix) const {
  std::vector<std::string> out;
  for (auto it = pieces_.lower_bound(prefix); it != pieces_.end(); ++it) {
    if (it->first.rfind(prefix, 0) != 0) break;
    out.push_back(it->first);
  }
  return out;
}

std::vector<std::int64_t> PlacedState::global_shape(const std::string& name) const {
  auto it = pieces_.find(name);
  if (it == pieces_.end()) throw Error("checkpoint has no tensor '" + name + "'");
  return it->second.front().placement.global_shape;
}

PlacedState::Assembled PlacedState::assemble(const std::string& name) const {
  auto it = pieces_.find(name);
  if (it == pieces_.end()) throw Error("checkpoint has no tensor '" + name + "'");
  const std::vector<Piece>& pieces = it->second;
  Assembled out;
  out.shape = pieces.front().placement.global_shape;
  const at::ScalarType dtype = pieces.front().tensor.scalar_type();
  const std::int64_t count = c10::multiply_integers(out.shape);
  out.values = at::zeros({count}, at::TensorOptions(dtype));
  out.covered = at::zeros({count}, at::TensorOptions(at::kBool));
  for (const Piece& piece : pieces) {
    if (piece.placement.global_shape != out.shape || piece.tensor.scalar_type() != dtype) {
      throw Error("checkpoint tensor '" + name + "': its pieces disagree on its shape or dtype");
    }
    const at::Tensor data = piece.tensor.detach().to(at::kCPU);
    // The piece's region of the whole tensor, as views into the assembled values and coverage.
    at::Tensor values = out.values;
    at::Tensor covered = out.covered;
    if (piece.placement.flat_offset >= 0) {
      const std::int64_t begin = piece.placement.flat_offset;
      const std::int64_t stored = std::min<std::int64_t>(data.numel(), count - begin);
      values.narrow(0, begin, stored).copy_(data.reshape({-1}).narrow(0, 0, stored));
      covered.narrow(0, begin, stored).fill_(true);
      continue;
    }
    values = values.view(out.shape);
    covered = covered.view(out.shape);
    for (std::size_t d = 0; d < out.shape.size(); ++d) {
      const auto dim = static_cast<long>(d);
      values = values.narrow(dim, piece.placement.offsets[d], data.size(dim));
      covered = covered.narrow(dim, piece.placement.offsets[d], data.size(dim));
    }
    values.copy_(data);
    covered.fill_(true);
  }
  return out;
}

namespace {

// Throws unless every element of `covered` (the requested part's) was stored by some piece.
void require_covered(const std::string& name, const at::Tensor& covered) {
  if (covered.all().item<bool>()) return;
  const std::int64_t missing = covered.numel() - covered.sum().item<std::int64_t>();
  throw Error("checkpoint tensor '" + name + "' is incomplete: its pieces leave " +
              std::to_string(missing) + " of " + std::to_string(covered.numel()) +
              " requested elements uncovered (were the other ranks' files read?)");
}

}  // namespace

torch::Tensor PlacedState::whole(const std::string& name) const {
  Assembled assembled = assemble(name);
  require_covered(name, assembled.covered);
  return assembled.values.view(assembled.shape);
}

torch::Tensor PlacedState::box(const std::string& name, const std::vector<std::int64_t>& offsets,
                               const std::vector<std::int64_t>& sizes) const {
  Assembled assembled = assemble(name);
  at::Tensor region = assembled.values.view(assembled.shape);
  at::Tensor covered = assembled.covered.view(assembled.shape);
  if (offsets.size() != static_cast<std::size_t>(region.dim()) || sizes.size() != offsets.size()) {
    throw Error("checkpoint tensor '" + name + "' has " + std::to_string(region.dim()) +
                " dimensions; the requested box has " + std::to_string(offsets.size()));
  }
  for (std::size_t d = 0; d < offsets.size(); ++d) {
    const auto dim = static_cast<long>(d);
    if (offsets[d] < 0 || sizes[d] < 0 || offsets[d] + sizes[d] > region.size(dim)) {
      throw Error("checkpoint tensor '" + name + "' of shape [" + join(assembled.shape) +
                  "] has no box at [" + join(offsets) + "] of [" + join(sizes) + "]");
    }
    region = region.narrow(dim, offsets[d], sizes[d]);
    covered = covered.narrow(dim, offsets[d], sizes[d]);
  }
  require_covered(name, covered);
  return region.clone();
}

torch::Tensor PlacedState::flat_range(const std::string& name, std::int64_t offset,
                                      std::int64_t count) const {
  Assembled assembled = assemble(name);
  const std::int64_t total = assembled.values.numel();
  if (offset < 0 || count < 0 || offset > total) {
    throw Error("checkpoint tensor '" + name + "' of " + std::to_string(total) +
                " elements has no range at " + std::to_string(offset));
  }
  const std::int64_t stored = std::min(count, total - offset);
  require_covered(name, assembled.covered.narrow(0, offset, stored));
  at::Tensor out = at::zeros({count}, assembled.values.options());
  out.narrow(0, 0, stored).copy_(assembled.values.narrow(0, offset, stored));
  return out;
}

}  // namespace trainyard
