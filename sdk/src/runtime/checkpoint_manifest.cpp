#include "trainyard/runtime/checkpoint_manifest.hpp"

#include <limits>
#include <sstream>

#include "trainyard/api/config.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard {

namespace {

constexpr std::int64_t kFormat = 1;

std::int64_t int_at_least(const Config& table, const std::string& key, std::int64_t minimum,
                          std::int64_t maximum) {
  const std::int64_t value = table.get_int(key);
  if (value < minimum || value > maximum) {
    table.fail(key, "must be in [" + std::to_string(minimum) + ", " + std::to_string(maximum) +
                        "], got " + std::to_string(value));
  }
  return value;
}

// The manifest names files inside its own folder: a path elsewhere would make verification read
// whatever it names.
std::string plain_file_name(const Config& entry) {
  std::string name = entry.get_string("name");
  if (name.empty() || name == "." || name == ".." ||
      name.find_first_of(std::string("/\0", 2)) != std::string::npos) {
    entry.fail("name",
               "must be a file name inside the checkpoint folder, got " + Value(name).to_toml());
  }
  return name;
}

CheckpointManifest parse_checked(const std::string& text, const std::string& name) {
  Config root(parse_toml(text, name));
  const std::int64_t format = root.get_int("format");
  if (format != kFormat) {
    root.fail("format", "is " + std::to_string(format) + "; this reader knows format " +
                            std::to_string(kFormat));
  }
  CheckpointManifest manifest;
  manifest.step = int_at_least(root, "step", 0, std::numeric_limits<std::int64_t>::max());
  manifest.backend = root.get_string("backend");
  manifest.framework_version = root.get_string("framework_version");
  manifest.world_size =
      static_cast<int>(int_at_least(root, "world_size", 1, kMaxManifestWorldSize));
  const Value& files = root.value("files");
  if (files.type() != ValueType::kArray) root.fail("files", "must be an array of tables");
  for (const Value& item : files.as_array()) {
    if (item.type() != ValueType::kTable) {
      throw Error(item.where().str() + ": files must be an array of tables ([[files]])");
    }
    Config entry(item.table_ptr(), "files");
    CheckpointFileInfo info;
    info.name = plain_file_name(entry);
    info.bytes = int_at_least(entry, "bytes", 0, std::numeric_limits<std::int64_t>::max());
    info.crc32 = static_cast<std::uint32_t>(
        int_at_least(entry, "crc32", 0, std::numeric_limits<std::uint32_t>::max()));
    manifest.files.push_back(std::move(info));
  }
  return manifest;
}

}  // namespace

std::string manifest_text(const CheckpointManifest& manifest) {
  std::ostringstream out;
  out << "format = " << kFormat << "\n";
  out << "step = " << manifest.step << "\n";
  out << "backend = " << Value(manifest.backend).to_toml() << "\n";
  out << "framework_version = " << Value(manifest.framework_version).to_toml() << "\n";
  out << "world_size = " << manifest.world_size << "\n";
  for (const auto& info : manifest.files) {
    out << "\n[[files]]\nname = " << Value(info.name).to_toml() << "\nbytes = " << info.bytes
        << "\ncrc32 = " << info.crc32 << "\n";
  }
  return out.str();
}

CheckpointManifest parse_manifest(const std::string& text, const std::string& name) {
  try {
    return parse_checked(text, name);
  } catch (const Error& error) {
    throw Error("corrupt checkpoint manifest " + name + ": " + error.what());
  }
}

}  // namespace trainyard
