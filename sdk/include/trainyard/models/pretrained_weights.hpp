#pragma once
// Weights published in the Hugging Face layout: a folder holding one `model.safetensors`, or
// shards named by `model.safetensors.index.json` ({"weight_map": {tensor: file}}), or a single
// .safetensors file. Every file is memory-mapped and its header checked
// (safetensors_layout.hpp) when opened; reading a tensor, or a box of one, copies only those
// bytes, so a rank that holds a shard, a stage or a tensor-parallel slice of a model reads its
// pieces and never the whole model.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace trainyard {

class PretrainedWeights {
 public:
  struct TensorInfo {
    std::string dtype;  // the format's name ("BF16", "F32")
    std::vector<std::int64_t> shape;
    std::filesystem::path file;
  };

  // Opens `location` (a folder or one .safetensors file). Throws Error naming the file and the
  // problem: no weights in the folder, an index that is not JSON or names a file that is
  // missing, a tensor the index places in a file that lacks it or a file holding a tensor the
  // index does not name, a tensor in two files, a header that lies about sizes.
  explicit PretrainedWeights(const std::filesystem::path& location);
  ~PretrainedWeights();
  PretrainedWeights(PretrainedWeights&&) noexcept;
  PretrainedWeights& operator=(PretrainedWeights&&) noexcept;

  const std::filesystem::path& location() const { return location_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws Error naming the tensor and the location when it is absent.
  const TensorInfo& info(const std::string& name) const;
  // The bytes of the largest tensor, as stored.
  std::uint64_t largest_tensor_bytes() const;

  // A new tensor of `dtype` holding the box of `name` that starts at `offsets` and has `sizes`
  // (both one entry per dimension). Only the box's bytes are read from the file.
  at::Tensor read(const std::string& name, const std::vector<std::int64_t>& offsets,
                  const std::vector<std::int64_t>& sizes, c10::ScalarType dtype) const;
  // The whole tensor `name` as `dtype`.
  at::Tensor read(const std::string& name, c10::ScalarType dtype) const;

 private:
  struct MappedShard;
  std::filesystem::path location_;
  std::vector<std::unique_ptr<MappedShard>> shards_;
  std::map<std::string, TensorInfo> tensors_;
  // Where each tensor's bytes are: its shard and byte range in the file.
  struct Place {
    const MappedShard* shard = nullptr;
    std::uint64_t begin = 0;
  };
  std::map<std::string, Place> places_;

  void add_shard(const std::filesystem::path& file);
};

}  // namespace trainyard
