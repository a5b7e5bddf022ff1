#include "trainyard/support/files.hpp"

#include <fcntl.h>
#include <ftw.h>
#include <unistd.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "trainyard/api/error.hpp"

namespace trainyard {

namespace {

thread_local std::string failed_entry;

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  if (std::remove(path) != 0 && errno != ENOENT) {
    failed_entry = std::string(path) + ": " + std::strerror(errno);
    return 1;
  }
  return 0;
}

}  // namespace

void remove_tree(const std::filesystem::path& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) return;
  failed_entry.clear();
  // Children before their folder, symbolic links removed rather than followed.
  if (::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    throw Error("cannot remove " + (failed_entry.empty() ? path.string() : failed_entry));
  }
}

void sync_to_disk(const std::filesystem::path& path) {
  struct stat info {};
  const bool folder = ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
  int fd = ::open(path.c_str(), folder ? (O_RDONLY | O_DIRECTORY | O_CLOEXEC) : (O_RDONLY | O_CLOEXEC));
  if (fd < 0) throw Error("cannot open " + path.string() + " to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  if (rc != 0) throw Error("cannot sync " + path.string() + " to disk: " + std::strerror(saved));
}

void write_file_whole(const std::filesystem::path& file, const std::string& text,
                      const std::string& what) {
  if (file.has_parent_path()) {
    std::error_code ignored;
    std::filesystem::create_directories(file.parent_path(), ignored);
  }
  std::filesystem::path partial = file;
  partial += ".partial";
  {
    std::ofstream stream(partial, std::ios::out | std::ios::trunc);
    stream << text;
    stream.close();
    if (!stream) throw Error(file.string() + ": cannot write " + what);
  }
  std::error_code error;
  std::filesystem::rename(partial, file, error);
  if (error) throw Error(file.string() + ": cannot write " + what + ": " + error.message());
}

}  // namespace trainyard
