#include "folder_scan.hpp"

#include <algorithm>
#include <cctype>
#include <fstream>

#include <zlib.h>
#include <nlohmann/json.hpp>

#include "image_decode.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/skipped_samples.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

bool is_image_file(const fs::path& path) {
  std::string extension = path.extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return extension == ".jpg" || extension == ".jpeg" || extension == ".png";
}

// The image files under `folder`, at any depth, sorted by path.
std::vector<fs::path> image_files(const fs::path& folder) {
  std::vector<fs::path> files;
  for (const auto& entry :
       fs::recursive_directory_iterator(folder, fs::directory_options::follow_directory_symlink)) {
    if (entry.is_regular_file() && is_image_file(entry.path())) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// A file's first bytes (its header) and its last ones, without reading what lies between: a
// folder of a million photos is checked at the start in seconds, not read whole.
struct FileEnds {
  std::vector<std::uint8_t> head;
  std::vector<std::uint8_t> tail;  // the last (up to) 64 bytes
  std::uintmax_t size = 0;
};

FileEnds read_file_ends(const fs::path& path, std::size_t head_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error(path.string() + ": cannot read the image");
  FileEnds ends;
  ends.size = static_cast<std::uintmax_t>(in.tellg());
  auto read_at = [&](std::uintmax_t offset, std::size_t count, std::vector<std::uint8_t>& into) {
    into.resize(count);
    in.seekg(static_cast<std::streamoff>(offset));
    if (count > 0 &&
        !in.read(reinterpret_cast<char*>(into.data()), static_cast<std::streamsize>(count))) {
      throw Error(path.string() + ": cannot read the image");
    }
  };
  read_at(0, static_cast<std::size_t>(std::min<std::uintmax_t>(ends.size, head_bytes)), ends.head);
  const std::size_t tail = static_cast<std::size_t>(std::min<std::uintmax_t>(ends.size, 64));
  read_at(ends.size - tail, tail, ends.tail);
  return ends;
}

// A JPEG ends with its end-of-image marker (some writers pad after it) and a PNG with its IEND
// chunk: a file cut short by a failed copy or download is found here, before training, without
// decoding its pixels.
void check_complete(const FileEnds& ends, const fs::path& path) {
  static const std::vector<std::uint8_t> kIend = {'I', 'E', 'N', 'D', 0xAE, 0x42, 0x60, 0x82};
  const std::vector<std::uint8_t>& tail = ends.tail;
  if (ends.head.size() >= 2 && ends.head[0] == 0xFF && ends.head[1] == 0xD8) {
    for (std::size_t i = tail.size(); i-- > 1;) {
      if (tail[i - 1] == 0xFF && tail[i] == 0xD9) return;
    }
    throw Error(path.string() + ": truncated JPEG (no end-of-image marker)");
  }
  if (tail.size() < kIend.size() ||
      !std::equal(kIend.begin(), kIend.end(),
                  tail.end() - static_cast<std::ptrdiff_t>(kIend.size()))) {
    throw Error(path.string() + ": truncated PNG (no IEND chunk at its end)");
  }
}

// Every chunk of a PNG against its CRC: a flipped bit in the pixel data is found at the start
// rather than when the loader first decodes the file, hours into a run. PNG files are small
// next to photos' JPEGs, and zlib checks a CRC at gigabytes per second.
void check_png_chunks(const fs::path& path) {
  const std::vector<std::uint8_t> bytes = read_image_bytes(path.string());
  auto be32 = [&](std::size_t at) {
    return static_cast<std::uint32_t>(bytes[at]) << 24 |
           static_cast<std::uint32_t>(bytes[at + 1]) << 16 |
           static_cast<std::uint32_t>(bytes[at + 2]) << 8 | bytes[at + 3];
  };
  std::size_t at = 8;  // past the signature
  while (at + 12 <= bytes.size()) {
    const std::size_t length = be32(at);
    if (length > bytes.size() - at - 12) break;
    const std::uint32_t expected = be32(at + 8 + length);
    const auto actual =
        static_cast<std::uint32_t>(crc32(0, bytes.data() + at + 4, static_cast<uInt>(length + 4)));
    const std::string type(bytes.begin() + static_cast<std::ptrdiff_t>(at + 4),
                           bytes.begin() + static_cast<std::ptrdiff_t>(at + 8));
    if (actual != expected) throw Error(path.string() + ": PNG chunk " + type + " has a bad CRC");
    if (type == "IEND") return;
    at += length + 12;
  }
  throw Error(path.string() + ": truncated PNG (its chunks end before IEND)");
}

// Checks a file before training: its end (truncation), a PNG's chunk CRCs, and its header, read
// from the file's first 64 KiB, or from the whole file when its tables (a large embedded profile
// or thumbnail) run past them. Throws Error naming the file.
void check_image(const fs::path& path) {
  constexpr std::size_t kHeadBytes = 64 * 1024;
  const FileEnds ends = read_file_ends(path, kHeadBytes);
  if (ends.size == 0) throw Error(path.string() + ": empty file, not an image");
  check_complete(ends, path);
  if (ends.head.size() >= 2 && ends.head[0] == 0x89) check_png_chunks(path);
  try {
    read_image_header(ends.head, path.string());
    return;
  } catch (const Error&) {
    if (ends.size <= kHeadBytes) throw;
  }
  read_image_header(read_image_bytes(path.string()), path.string());
}

// Admits `path` to `out` with `label` when its checks pass; with skip_bad a file that fails them
// is left out and counted, otherwise the Error naming it propagates. True when admitted.
bool admit(const fs::path& path, std::int64_t label, bool skip_bad, ScannedFolder& out) {
  try {
    check_image(path);
  } catch (const Error& error) {
    if (!skip_bad) throw;
    out.skipped.push_back(error.what());
    report_skipped_sample(error.what());
    return false;
  }
  out.samples.push_back({path, label});
  return true;
}

// One "path,label" line of a CSV list (the path may hold commas: the label follows the last).
ImageSample list_line(const std::string& line, const fs::path& list, std::size_t number) {
  const auto comma = line.rfind(',');
  const std::string where = list.string() + ":" + std::to_string(number) + ": ";
  if (comma == std::string::npos || comma == 0) {
    throw Error(where + "needs path,label, got '" + line + "'");
  }
  std::string label_text = line.substr(comma + 1);
  while (!label_text.empty() && std::isspace(static_cast<unsigned char>(label_text.back()))) {
    label_text.pop_back();
  }
  std::size_t used = 0;
  std::int64_t label = -1;
  try {
    label = std::stoll(label_text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != label_text.size() || label < 0) {
    throw Error(where + "the label must be an integer >= 0, got '" + label_text + "'");
  }
  return {list.parent_path() / line.substr(0, comma), label};
}

std::vector<ImageSample> read_csv_list(const fs::path& list) {
  std::ifstream in(list);
  if (!in) throw Error(list.string() + ": cannot read the image list");
  std::vector<ImageSample> samples;
  std::string line;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (number == 1 && line == "path,label")) continue;
    samples.push_back(list_line(line, list, number));
  }
  return samples;
}

std::vector<ImageSample> read_json_list(const fs::path& list) {
  std::ifstream in(list);
  if (!in) throw Error(list.string() + ": cannot read the image list");
  const nlohmann::json entries = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!entries.is_array()) {
    throw Error(list.string() + ": not a JSON array of {\"path\": ..., \"label\": ...}");
  }
  std::vector<ImageSample> samples;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const nlohmann::json& entry = entries[i];
    if (!entry.is_object() || !entry.contains("path") || !entry["path"].is_string() ||
        !entry.contains("label") || !entry["label"].is_number_integer() ||
        entry["label"].get<std::int64_t>() < 0) {
      throw Error(list.string() + ": entry " + std::to_string(i) +
                  " needs a \"path\" string and a \"label\" integer >= 0");
    }
    samples.push_back({list.parent_path() / entry["path"].get<std::string>(),
                       entry["label"].get<std::int64_t>()});
  }
  return samples;
}

}  // namespace

bool is_image_list(const fs::path& path) {
  const std::string extension = path.extension().string();
  return fs::is_regular_file(path) && (extension == ".csv" || extension == ".json");
}

ScannedFolder scan_image_list(const fs::path& list, bool skip_bad) {
  const std::vector<ImageSample> listed =
      list.extension() == ".json" ? read_json_list(list) : read_csv_list(list);
  ScannedFolder out;
  std::int64_t classes = 0;
  for (const ImageSample& sample : listed) {
    classes = std::max(classes, sample.label + 1);
    admit(sample.path, sample.label, skip_bad, out);
  }
  if (out.samples.empty()) throw Error(list.string() + ": lists no readable image");
  for (std::int64_t label = 0; label < classes; ++label) {
    out.classes.push_back(std::to_string(label));
  }
  return out;
}

ScannedFolder scan_image_folder(const fs::path& root, bool skip_bad) {
  if (!fs::is_directory(root)) throw Error(root.string() + ": no such image folder");
  ScannedFolder out;
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.is_directory()) out.classes.push_back(entry.path().filename().string());
  }
  std::sort(out.classes.begin(), out.classes.end());
  if (out.classes.empty()) {
    throw Error(root.string() + ": no class folders (one subfolder of images per class)");
  }
  for (std::size_t label = 0; label < out.classes.size(); ++label) {
    const fs::path folder = root / out.classes[label];
    std::size_t kept = 0;
    std::size_t skipped_here = 0;
    for (const fs::path& path : image_files(folder)) {
      if (admit(path, static_cast<std::int64_t>(label), skip_bad, out)) {
        ++kept;
      } else {
        ++skipped_here;
      }
    }
    if (kept == 0) {
      throw Error(folder.string() + ": class folder '" + out.classes[label] +
                  "' holds no readable .jpg, .jpeg or .png image" +
                  (skipped_here == 0 ? std::string()
                                     : " (" + std::to_string(skipped_here) + " unreadable)"));
    }
  }
  return out;
}

}  // namespace trainyard
