#include "trainyard/models/pretrained_weights.hpp"

#include <ATen/ATen.h>

#include <fstream>
#include <set>
#include <sstream>

#include "trainyard/api/error.hpp"
#include "trainyard/support/mapped_file.hpp"
#include "trainyard/support/safetensors_dtype.hpp"
#include "trainyard/support/safetensors_layout.hpp"
#include "trainyard/support/strict_json.hpp"

namespace trainyard {

namespace fs = std::filesystem;

struct PretrainedWeights::MappedShard {
  MappedFile file;
  safetensors::Layout layout;

  explicit MappedShard(const fs::path& path) : file(path, "weights file") {
    try {
      layout = safetensors::read_layout(file.bytes(), path.string());
    } catch (const Error& error) {
      const std::string message = error.what();
      if (message.find(path.string()) != std::string::npos) throw;
      throw Error("weights file " + path.string() + ": " + message);
    }
  }
};

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

std::string read_whole_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error("cannot read " + file.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

// The index's weight_map: tensor name -> shard file name (relative to the folder).
std::map<std::string, std::string> read_weight_map(const fs::path& index) {
  const nlohmann::json json = parse_strict_json(read_whole_file(index), index.string());
  const auto map = json.is_object() ? json.find("weight_map") : json.end();
  if (map == json.end() || !map->is_object()) {
    throw Error(index.string() + ": no \"weight_map\" object naming each tensor's file");
  }
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, file] : map->items()) {
    if (!file.is_string() || file.get<std::string>().empty() ||
        fs::path(file.get<std::string>()).has_parent_path()) {
      throw Error(index.string() + ": weight_map entry '" + name +
                  "' is not the name of a file in the folder");
    }
    weight_map[name] = file.get<std::string>();
  }
  return weight_map;
}

}  // namespace

PretrainedWeights::PretrainedWeights(const fs::path& location) : location_(location) {
  if (!fs::is_directory(location)) {
    if (!fs::exists(location)) throw Error("weights " + location.string() + " do not exist");
    add_shard(location);
    return;
  }
  const fs::path index = location / kIndexFile;
  if (!fs::exists(index)) {
    if (!fs::exists(location / kSingleFile)) {
      throw Error("weights folder " + location.string() + " holds neither " + kSingleFile +
                  " nor " + kIndexFile);
    }
    add_shard(location / kSingleFile);
    return;
  }
  const std::map<std::string, std::string> weight_map = read_weight_map(index);
  std::set<std::string> files;
  for (const auto& [name, file] : weight_map) files.insert(file);
  for (const std::string& file : files) {
    if (!fs::exists(location / file)) {
      throw Error(index.string() + " names shard " + file + ", which is missing from " +
                  location.string());
    }
    add_shard(location / file);
  }
  for (const auto& [name, file] : weight_map) {
    auto it = tensors_.find(name);
    if (it == tensors_.end() || it->second.file.filename() != file) {
      throw Error(index.string() + " places tensor '" + name + "' in " + file +
                  ", which does not hold it");
    }
  }
  for (const auto& [name, info] : tensors_) {
    if (!weight_map.count(name)) {
      throw Error(info.file.string() + " holds tensor '" + name + "', which " + index.string() +
                  " does not name");
    }
  }
}

PretrainedWeights::~PretrainedWeights() = default;
PretrainedWeights::PretrainedWeights(PretrainedWeights&&) noexcept = default;
PretrainedWeights& PretrainedWeights::operator=(PretrainedWeights&&) noexcept = default;

void PretrainedWeights::add_shard(const fs::path& file) {
  auto shard = std::make_unique<MappedShard>(file);
  for (const auto& entry : shard->layout.tensors) {
    if (auto existing = tensors_.find(entry.name); existing != tensors_.end()) {
      throw Error("tensor '" + entry.name + "' is in both " + existing->second.file.string() +
                  " and " + file.string());
    }
    // Checked here so that a dtype without a LibTorch type fails when opened, not when read.
    safetensors::scalar_type(entry.dtype);
    tensors_[entry.name] = TensorInfo{entry.dtype, entry.shape, file};
    places_[entry.name] = Place{shard.get(), shard->layout.data_start + entry.begin};
  }
  shards_.push_back(std::move(shard));
}

const PretrainedWeights::TensorInfo& PretrainedWeights::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    throw Error("weights " + location_.string() + " hold no tensor '" + name + "'");
  }
  return it->second;
}

std::uint64_t PretrainedWeights::largest_tensor_bytes() const {
  std::uint64_t largest = 0;
  for (const auto& [name, info] : tensors_) {
    std::uint64_t bytes = c10::elementSize(safetensors::scalar_type(info.dtype));
    for (std::int64_t size : info.shape) bytes *= static_cast<std::uint64_t>(size);
    largest = std::max(largest, bytes);
  }
  return largest;
}

at::Tensor PretrainedWeights::read(const std::string& name,
                                   const std::vector<std::int64_t>& offsets,
                                   const std::vector<std::int64_t>& sizes,
                                   c10::ScalarType dtype) const {
  const TensorInfo& tensor = info(name);
  if (offsets.size() != tensor.shape.size() || sizes.size() != tensor.shape.size()) {
    throw Error("box " + shape_text(offsets) + " + " + shape_text(sizes) + " of tensor '" + name +
                "' does not match its " + std::to_string(tensor.shape.size()) + " dimensions");
  }
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    if (offsets[d] < 0 || sizes[d] < 0 || offsets[d] + sizes[d] > tensor.shape[d]) {
      throw Error("box " + shape_text(offsets) + " + " + shape_text(sizes) +
                  " lies outside "
                  "tensor '" +
                  name + "' of shape " + shape_text(tensor.shape));
    }
  }
  const Place& place = places_.at(name);
  // A view of the mapped bytes, never written: the copy below reads only the box's pages.
  void* stored = const_cast<std::uint8_t*>(place.shard->file.data() + place.begin);
  at::Tensor whole = at::from_blob(
      stored, tensor.shape, at::TensorOptions().dtype(safetensors::scalar_type(tensor.dtype)));
  at::Tensor box = whole;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    const auto dim = static_cast<std::int64_t>(d);
    if (sizes[d] != tensor.shape[d]) box = box.narrow(dim, offsets[d], sizes[d]);
  }
  at::Tensor copy = at::empty(sizes, at::TensorOptions().dtype(dtype));
  copy.copy_(box);
  return copy;
}

at::Tensor PretrainedWeights::read(const std::string& name, c10::ScalarType dtype) const {
  const std::vector<std::int64_t>& shape = info(name).shape;
  return read(name, std::vector<std::int64_t>(shape.size(), 0), shape, dtype);
}

}  // namespace trainyard
