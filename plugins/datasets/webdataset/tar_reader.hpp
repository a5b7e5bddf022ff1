#pragma once
// One tar shard read front to back through libarchive: member headers one after another, each
// member's bytes read whole or skipped (a seek on an uncompressed tar file, so skipping an image
// costs no reading). Compressed shards (.tar.gz and the like) read too, skipping by decompressing.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

struct archive;

namespace trainyard {

class TarReader {
 public:
  // Throws Error "<shard>: cannot open: <why>".
  explicit TarReader(std::filesystem::path path);
  ~TarReader();
  TarReader(const TarReader&) = delete;
  TarReader& operator=(const TarReader&) = delete;

  // Moves to the next member (skipping the current one's bytes if they were not read); false at
  // the end of the archive. Damage (a truncated or corrupt tar) throws Error
  // "<shard>: <key>: <why>" naming the member it breaks in, or the one before a broken header.
  bool next();
  // The current member: its path in the archive, whether it is a regular file, and its position
  // among the archive's members (0 for the first; -1 before the first next()).
  const std::string& name() const { return name_; }
  bool regular() const { return regular_; }
  std::int64_t member() const { return member_; }
  // The current member's bytes, whole; throws Error as next() does when they are cut short.
  std::vector<std::uint8_t> read();
  const std::filesystem::path& path() const { return path_; }

 private:
  void skip();
  [[noreturn]] void fail(const std::string& member_name) const;

  archive* archive_ = nullptr;
  std::filesystem::path path_;
  std::string name_;
  bool regular_ = false;
  std::int64_t size_ = 0;
  std::int64_t member_ = -1;
  bool unread_ = false;  // the current member's bytes are neither read nor skipped
};

}  // namespace trainyard
