// Fuzzes the safetensors layout reader on whole files, and checks that a layout it accepts is one
// the plugin can copy tensors out of: every range inside the data section, sized by its shape and
// dtype, the ranges tiling the data section.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>

#include "trainyard/support/safetensors_layout.hpp"
#include "trainyard/api/error.hpp"

namespace st = trainyard::safetensors;

namespace {

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "accepted a bad layout: %s\n", what.c_str());
  std::abort();
}

std::uint64_t element_bytes(const std::string& dtype) {
  for (const auto& known : st::known_dtypes()) {
    if (dtype == known.name) return known.bytes;
  }
  broken("unknown dtype " + dtype);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  st::Layout layout;
  try {
    layout = st::read_layout(std::span<const std::uint8_t>(data, size), "fuzz.safetensors");
  } catch (const trainyard::Error&) {
    return 0;
  }
  if (layout.data_start < 8 || layout.data_start > size) broken("data section outside the file");
  const std::uint64_t data_size = size - layout.data_start;
  std::uint64_t covered = 0;
  for (const auto& tensor : layout.tensors) {
    if (tensor.begin > tensor.end || tensor.end > data_size) broken(tensor.name + " out of range");
    std::uint64_t numel = 1;
    for (std::int64_t d : tensor.shape) {
      if (d < 0) broken(tensor.name + " negative dimension");
      numel *= static_cast<std::uint64_t>(d);
    }
    if (numel * element_bytes(tensor.dtype) != tensor.end - tensor.begin) {
      broken(tensor.name + " size disagrees with its shape");
    }
    covered += tensor.end - tensor.begin;
  }
  if (covered != data_size) broken("ranges do not cover the data section");
  return 0;
}
