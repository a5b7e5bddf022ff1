#pragma once
// One checkpoint file on its way to the disk: bytes go from the caller's memory straight to the
// file, counted and checksummed on the way, so a checkpoint is neither copied in user space nor
// read back to describe it in the manifest.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace trainyard {

// What a checkpoint's manifest records of one of its files.
struct CheckpointFileInfo {
  std::string name;  // the file's name inside the checkpoint folder
  std::int64_t bytes = 0;
  std::uint32_t crc32 = 0;  // zlib's CRC-32 of the whole file
};

// Writes one file sequentially. Large pieces (a tensor's bytes) are written from the caller's
// memory as they come; small ones (headers, names) are gathered and written together, so a
// format of many small records still costs few system calls. The disk starts writing each
// stretch as soon as it is written, while the next one is checksummed, so finish() waits only
// for the tail. Errors throw Error naming the file and the reason (a full disk, say).
class CheckpointFileWriter {
 public:
  // Creates `file`, replacing one of that name.
  explicit CheckpointFileWriter(std::filesystem::path file);
  // An unfinished file is closed and left as it is: whoever staged it discards it.
  ~CheckpointFileWriter();
  CheckpointFileWriter(const CheckpointFileWriter&) = delete;
  CheckpointFileWriter& operator=(const CheckpointFileWriter&) = delete;

  void append(const void* data, std::size_t bytes);
  void append(std::string_view bytes) { append(bytes.data(), bytes.size()); }

  // Leaves the disk idle until finish() instead of starting it on each stretch as it is written.
  // Writing then ends sooner (each start costs the writing thread time), and the disk catches up
  // in finish(): for a caller whose memory must be released as early as possible, such as an
  // asynchronous save that holds the optimizer step until its bytes are written.
  void start_writeback_at_finish();
  // Writes what is gathered: every appended byte is then in the file (not yet on the disk), and
  // the memory it came from is free to change.
  void flush();
  // Writes what is gathered, waits until the whole file is on the disk (fsync) and closes it.
  CheckpointFileInfo finish();

  const std::filesystem::path& path() const { return path_; }
  // Bytes appended so far, which is the offset the next byte lands at.
  std::uint64_t size() const { return size_; }

 private:
  void flush_gathered();
  void write_through(const unsigned char* data, std::size_t bytes);
  [[noreturn]] void fail(const std::string& what, int error) const;

  std::filesystem::path path_;
  int fd_ = -1;
  std::vector<unsigned char> gathered_;
  std::uint64_t size_ = 0;               // bytes appended
  std::uint64_t written_ = 0;            // bytes handed to the file
  std::uint64_t writeback_started_ = 0;  // the disk was asked to write the bytes before this
                                         // (the largest value: nothing before finish())
  std::uint32_t crc_ = 0;                // CRC-32 of the written bytes
};

}  // namespace trainyard
