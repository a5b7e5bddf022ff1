#include "tar_reader.hpp"

#include <archive.h>
#include <archive_entry.h>

#include <algorithm>

#include "member_name.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

// libarchive's read buffer: large reads for throughput, one per open shard.
constexpr std::size_t kBlockBytes = 1 << 20;

std::string reason(archive* handle) {
  const char* text = archive_error_string(handle);
  return text ? text : "unknown libarchive error";
}

}  // namespace

TarReader::TarReader(std::filesystem::path path) : path_(std::move(path)) {
  archive_ = archive_read_new();
  if (!archive_) throw Error(path_.string() + ": cannot open: libarchive is out of memory");
  archive_read_support_format_tar(archive_);
  archive_read_support_filter_all(archive_);
  if (archive_read_open_filename(archive_, path_.c_str(), kBlockBytes) != ARCHIVE_OK) {
    const std::string why = reason(archive_);
    archive_read_free(archive_);
    archive_ = nullptr;
    throw Error(path_.string() + ": cannot open: " + why);
  }
}

TarReader::~TarReader() {
  if (archive_) archive_read_free(archive_);
}

void TarReader::fail(const std::string& member_name) const {
  const std::string where = member_name.empty() ? "" : split_member_name(member_name).key + ": ";
  throw Error(path_.string() + ": " + where + "damaged or truncated tar (" + reason(archive_) +
              ")");
}

void TarReader::skip() {
  if (!unread_) return;
  unread_ = false;
  if (archive_read_data_skip(archive_) != ARCHIVE_OK) fail(name_);
}

bool TarReader::next() {
  skip();
  archive_entry* entry = nullptr;
  const int status = archive_read_next_header(archive_, &entry);
  if (status == ARCHIVE_EOF) return false;
  // A warning (an unknown pax keyword, say) still gives a usable header.
  if (status != ARCHIVE_OK && status != ARCHIVE_WARN) fail(name_);
  const char* name = archive_entry_pathname(entry);
  name_ = name ? name : "";
  regular_ = archive_entry_filetype(entry) == AE_IFREG;
  size_ = archive_entry_size_is_set(entry) ? archive_entry_size(entry) : -1;
  ++member_;
  unread_ = true;
  return true;
}

std::vector<std::uint8_t> TarReader::read() {
  if (!unread_) throw Error(path_.string() + ": " + name_ + ": member read twice");
  unread_ = false;
  // Straight into the result when the header gives the size (it always does in a tar).
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(std::max<std::int64_t>(size_, 0)));
  std::size_t filled = 0;
  while (true) {
    if (filled == bytes.size()) {
      if (size_ >= 0) break;
      bytes.resize(std::max<std::size_t>(2 * bytes.size(), 65536));
    }
    const la_ssize_t got =
        archive_read_data(archive_, bytes.data() + filled, bytes.size() - filled);
    if (got < 0) fail(name_);
    if (got == 0) break;
    filled += static_cast<std::size_t>(got);
  }
  if (size_ >= 0 && static_cast<std::int64_t>(filled) != size_) {
    throw Error(path_.string() + ": " + split_member_name(name_).key + ": the tar ends inside '" +
                name_ + "' (" + std::to_string(filled) + " of " + std::to_string(size_) +
                " bytes)");
  }
  bytes.resize(filled);
  return bytes;
}

}  // namespace trainyard
