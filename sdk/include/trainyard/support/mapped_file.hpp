#pragma once
// A whole file mapped read-only into memory: readers of large weight and checkpoint files touch
// only the pages of the tensors they copy out, so a rank that needs a slice of a model never
// holds the rest of it.

#include <cstdint>
#include <filesystem>
#include <span>

namespace trainyard {

class MappedFile {
 public:
  // Throws Error naming `file` (as "<what> <file>") when it cannot be opened or mapped.
  explicit MappedFile(const std::filesystem::path& file, const char* what = "file");
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::uint8_t* data() const { return data_; }
  std::uint64_t size() const { return size_; }
  std::span<const std::uint8_t> bytes() const { return {data_, size_}; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  const std::uint8_t* data_ = nullptr;
  std::uint64_t size_ = 0;
};

}  // namespace trainyard
