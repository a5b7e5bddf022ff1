#include "trainyard/support/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "trainyard/api/error.hpp"

namespace trainyard {

MappedFile::MappedFile(const std::filesystem::path& file, const char* what) : path_(file) {
  const auto fail = [&](const char* action) {
    const std::string reason = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    throw Error(std::string("cannot ") + action + " " + what + " " + file.string() + ": " + reason);
  };
  fd_ = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail("open");
  struct stat info {};
  if (::fstat(fd_, &info) != 0) fail("stat");
  size_ = static_cast<std::uint64_t>(info.st_size);
  if (size_ == 0) return;
  void* address = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
  if (address == MAP_FAILED) fail("map");
  data_ = static_cast<const std::uint8_t*>(address);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace trainyard
