#include "trainyard/api/checkpoint_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "trainyard/api/error.hpp"
#include "trainyard/runtime/crc32.hpp"

namespace trainyard {

namespace {

// Pieces smaller than this are gathered; a tensor's bytes are usually far larger.
constexpr std::size_t kDirectBytes = 64 << 10;
// The most gathered before one write.
constexpr std::size_t kGatherBytes = 1 << 20;
// Large pieces are written in stretches of this size: the disk starts on one while the next is
// written and checksummed, and each stretch's checksum reads bytes the write has just brought
// into cache. Larger stretches keep the disk idle longer between starts (4 MiB stretches took
// three times as long as 1 MiB ones, measured on a virtual disk).
constexpr std::size_t kStretchBytes = 1 << 20;
// The page cache's unit (the least page size; larger pages only make the rule stricter).
constexpr std::uint64_t kPageBytes = 4096;

}  // namespace

CheckpointFileWriter::CheckpointFileWriter(std::filesystem::path file) : path_(std::move(file)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create", errno);
  gathered_.reserve(kGatherBytes);
}

CheckpointFileWriter::~CheckpointFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void CheckpointFileWriter::fail(const std::string& what, int error) const {
  throw Error(what + " checkpoint file " + path_.string() + ": " + std::strerror(error));
}

void CheckpointFileWriter::append(const void* data, std::size_t bytes) {
  if (fd_ < 0) throw Error("checkpoint file " + path_.string() + " is already finished");
  const auto* next = static_cast<const unsigned char*>(data);
  size_ += bytes;
  if (bytes < kDirectBytes) {
    if (gathered_.size() + bytes > kGatherBytes) flush_gathered();
    gathered_.insert(gathered_.end(), next, next + bytes);
    return;
  }
  flush_gathered();  // keeps the bytes in order
  while (bytes > 0) {
    const std::size_t stretch = std::min(bytes, kStretchBytes);
    write_through(next, stretch);
    next += stretch;
    bytes -= stretch;
  }
}

void CheckpointFileWriter::flush_gathered() {
  if (gathered_.empty()) return;
  write_through(gathered_.data(), gathered_.size());
  gathered_.clear();
}

void CheckpointFileWriter::write_through(const unsigned char* data, std::size_t bytes) {
  const unsigned char* left = data;
  std::size_t remaining = bytes;
  while (remaining > 0) {
    const ssize_t wrote = ::write(fd_, left, remaining);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote < 0) fail("cannot write", errno);
    if (wrote == 0) fail("cannot write", ENOSPC);
    left += wrote;
    remaining -= static_cast<std::size_t>(wrote);
  }
  written_ += bytes;
  // Starts the disk on what was written now rather than at finish(): the write-back runs while the
  // stretch is checksummed and the next one written. Whole pages only: a page under write-back
  // that the next stretch fills would have to wait for the disk. Only a hint; finish()'s fsync is
  // what makes the file durable, so a failure here is left for it to report.
  const std::uint64_t whole_pages = written_ & ~std::uint64_t{kPageBytes - 1};
  if (whole_pages > writeback_started_) {
    ::sync_file_range(fd_, static_cast<off_t>(writeback_started_),
                      static_cast<off_t>(whole_pages - writeback_started_), SYNC_FILE_RANGE_WRITE);
    writeback_started_ = whole_pages;
  }
  crc_ = update_crc32(crc_, data, bytes);
}

void CheckpointFileWriter::start_writeback_at_finish() {
  // No whole page is ever past this mark, so write_through asks nothing of the disk.
  writeback_started_ = std::numeric_limits<std::uint64_t>::max();
}

void CheckpointFileWriter::flush() {
  if (fd_ < 0) throw Error("checkpoint file " + path_.string() + " is already finished");
  flush_gathered();
}

CheckpointFileInfo CheckpointFileWriter::finish() {
  flush();
  if (::fsync(fd_) != 0) fail("cannot sync", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("cannot close", errno);
  return CheckpointFileInfo{path_.filename().string(), static_cast<std::int64_t>(written_), crc_};
}

}  // namespace trainyard
