#include "checkpoint_command.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli.hpp"
#include "trainyard/build_context.hpp"
#include "trainyard/checkpoint.hpp"
#include "trainyard/checkpoint_store.hpp"
#include "trainyard/error.hpp"
#include "trainyard/files.hpp"
#include "trainyard/version.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace trainyard {
namespace {

constexpr const char* kCheckpointUsage = R"(usage: trainyard checkpoint inspect PATH [options]
       trainyard checkpoint export PATH --format safetensors --out FILE [options]

inspect   the checkpoint's step, backend, files with sizes and checksum status, and every
          tensor's dtype and shape; exits 1 when any file fails verification
export    the model's weights (entries 'model.*', prefix removed) as one file; the parameters
          of a sharded (fsdp) checkpoint are gathered from every rank's file into whole
          tensors; --all exports every shared entry (optimizer state included) under its full
          name)";

std::shared_ptr<CheckpointBackend> backend_named(const std::string& name, Registry& registry,
                                                 const fs::path& checkpoint) {
  if (!registry.contains("checkpoint", name)) {
    throw Error("checkpoint " + checkpoint.string() + " was written by the '" + name +
                "' backend, which no loaded plugin provides");
  }
  return registry.create<CheckpointBackend>(name, Config({}, "checkpoint"), BuildContext{});
}

std::string human_bytes(std::int64_t bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1);
  if (bytes >= (1 << 20)) {
    out << static_cast<double>(bytes) / (1 << 20) << " MiB";
  } else if (bytes >= 1024) {
    out << static_cast<double>(bytes) / 1024 << " KiB";
  } else {
    out << bytes << " B";
  }
  return out.str();
}

void print_entries(const std::string& file, const StateDict& state) {
  std::int64_t total = 0;
  std::size_t width = 0;
  for (const auto& [name, tensor] : state.tensors) {
    total += static_cast<std::int64_t>(tensor.nbytes());
    width = std::max(width, name.size());
  }
  std::cout << "  " << file << ": " << state.tensors.size() << " tensors, " << human_bytes(total)
            << "\n";
  for (const auto& [name, tensor] : state.tensors) {
    std::ostringstream shape;
    shape << tensor.sizes();
    std::cout << "    " << std::left << std::setw(static_cast<int>(width)) << name << "  "
              << std::setw(9) << c10::toString(tensor.scalar_type()) << " " << std::setw(16)
              << shape.str() << " " << human_bytes(static_cast<std::int64_t>(tensor.nbytes()))
              << "\n";
  }
  for (const auto& [key, value] : state.metadata) {
    const auto newline = value.find('\n');
    std::cout << "    " << key << " = "
              << (newline == std::string::npos
                      ? value
                      : "(" + std::to_string(std::count(value.begin(), value.end(), '\n')) +
                            " lines)")
              << "\n";
  }
}

int inspect(const fs::path& checkpoint, Registry& registry) {
  CheckpointManifest manifest = read_manifest(checkpoint);
  std::cout << "checkpoint " << checkpoint.string() << "\n"
            << "  step " << manifest.step << ", backend " << manifest.backend
            << ", written by trainyard " << manifest.framework_version << ", "
            << manifest.world_size << (manifest.world_size == 1 ? " rank" : " ranks") << "\n";
  std::optional<std::string> first_problem;
  std::size_t width = 0;
  for (const auto& file : manifest.files) width = std::max(width, file.name.size());
  std::cout << "  files:\n";
  for (const auto& file : manifest.files) {
    auto problem = check_checkpoint_file(checkpoint, file);
    std::cout << "    " << std::left << std::setw(static_cast<int>(width)) << file.name << "  "
              << std::right << std::setw(12) << file.bytes << " bytes  crc32 " << std::hex
              << std::setw(8) << std::setfill('0') << file.crc32 << std::dec << std::setfill(' ')
              << "  " << (problem ? "BAD" : "ok") << "\n";
    if (problem && !first_problem) first_problem = problem;
  }
  if (first_problem) throw Error(*first_problem);
  auto backend = backend_named(manifest.backend, registry, checkpoint);
  for (const auto& file : manifest.files) {
    print_entries(file.name, backend->read(checkpoint / file.name));
  }
  std::cout << "  status: valid\n";
  return 0;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, separator)) parts.push_back(part);
  return parts;
}

// The parameters of a sharded fsdp checkpoint, put back together: each rank file holds per unit
// one flat shard ('fsdp.shard.<unit>'), laid out as the shared 'fsdp.layout' metadata says
// ("ranks=R;<unit>:<numel>[<name>@<d0>x<d1>,...];..."). Empty for other checkpoints.
TensorMap consolidate_shards(const fs::path& checkpoint, const CheckpointManifest& manifest,
                             const CheckpointBackend& reader, const StateDict& shared) {
  TensorMap out;
  auto layout = shared.metadata.find("fsdp.layout");
  if (layout == shared.metadata.end()) return out;
  auto kind = shared.metadata.find("fsdp.state_dict");
  if (kind != shared.metadata.end() && kind->second == "full") return out;  // 'model.*' already
  auto bad = [&](const std::string& why) {
    return Error("checkpoint " + checkpoint.string() + ": fsdp layout '" + layout->second +
                 "' " + why);
  };
  std::vector<std::string> units = split(layout->second, ';');
  if (units.empty() || units[0].rfind("ranks=", 0) != 0) throw bad("does not start with ranks=");
  const int ranks = std::stoi(units[0].substr(6));
  std::vector<StateDict> files;
  for (const auto& file : manifest.files) {
    if (file.name.rfind("rank-", 0) == 0 && static_cast<int>(files.size()) < ranks) {
      files.push_back(reader.read(checkpoint / file.name));
    }
  }
  if (static_cast<int>(files.size()) != ranks) {
    throw bad("needs " + std::to_string(ranks) + " rank files, the checkpoint has " +
              std::to_string(files.size()));
  }
  for (std::size_t u = 1; u < units.size(); ++u) {
    const std::string& unit = units[u];
    const auto open = unit.find('[');
    if (open == std::string::npos || unit.back() != ']') throw bad("has a malformed unit");
    const std::string key = "fsdp.shard." + std::to_string(u - 1);
    std::vector<at::Tensor> parts;
    for (const auto& file : files) {
      auto part = file.tensors.find(key);
      if (part == file.tensors.end()) throw bad("names a shard the rank files lack: " + key);
      parts.push_back(part->second.reshape({-1}));
    }
    at::Tensor flat = at::cat(parts);
    std::int64_t offset = 0;
    for (const std::string& parameter : split(unit.substr(open + 1, unit.size() - open - 2), ',')) {
      const auto at_sign = parameter.find('@');
      if (at_sign == std::string::npos) throw bad("has a parameter without a shape");
      std::vector<std::int64_t> shape;
      std::int64_t numel = 1;
      for (const std::string& size : split(parameter.substr(at_sign + 1), 'x')) {
        shape.push_back(std::stoll(size));
        numel *= shape.back();
      }
      if (offset + numel > flat.numel()) throw bad("describes more values than the shards hold");
      out[parameter.substr(0, at_sign)] = flat.narrow(0, offset, numel).reshape(shape).clone();
      offset += numel;
    }
  }
  return out;
}

int export_weights(const fs::path& checkpoint, const std::string& format, const fs::path& out,
                   bool everything, Registry& registry) {
  if (format != "safetensors") {
    throw Error("--format must be 'safetensors', got '" + format + "'");
  }
  CheckpointManifest manifest = read_manifest(checkpoint);
  verify_checkpoint(checkpoint, manifest);
  auto reader = backend_named(manifest.backend, registry, checkpoint);
  auto writer = backend_named(format, registry, checkpoint);
  StateDict shared;
  for (const auto& file : manifest.files) {
    if (file.name.rfind("shared", 0) == 0) shared = reader->read(checkpoint / file.name);
  }
  StateDict exported;
  const std::string prefix = "model.";
  for (const auto& [name, tensor] : shared.tensors) {
    if (everything) {
      exported.tensors[name] = tensor;
    } else if (name.rfind(prefix, 0) == 0) {
      exported.tensors[name.substr(prefix.size())] = tensor;
    }
  }
  for (auto& [name, tensor] : consolidate_shards(checkpoint, manifest, *reader, shared)) {
    exported.tensors[everything ? prefix + name : name] = tensor;
  }
  if (exported.tensors.empty()) {
    throw Error("checkpoint " + checkpoint.string() + " holds no model weights ('model.*' entries)");
  }
  exported.metadata["format"] = "pt";  // what transformers expects of a PyTorch state dict
  exported.metadata["trainyard.step"] = std::to_string(manifest.step);
  exported.metadata["trainyard.framework_version"] = manifest.framework_version;
  if (auto recipe = shared.metadata.find("engine.recipe"); recipe != shared.metadata.end()) {
    exported.metadata["trainyard.recipe"] = recipe->second;
  }
  // Written beside the target and renamed over it: the file is whole or absent.
  fs::path staging = out;
  staging += ".partial";
  writer->write(staging, exported);
  sync_to_disk(staging);
  fs::rename(staging, out);
  sync_to_disk(fs::absolute(out).parent_path());
  std::cout << "wrote " << exported.tensors.size() << " tensors to " << out.string() << "\n";
  return 0;
}

}  // namespace

int command_checkpoint(const std::vector<std::string>& args, Registry& registry) {
  CommonOptions common;
  std::string action;
  std::string path;
  std::string format = "safetensors";
  std::string out;
  bool everything = false;
  po::options_description options("checkpoint options");
  options.add_options()("action", po::value(&action)->required(), "inspect or export")(
      "path", po::value(&path)->required(), "a checkpoint folder (step-NNNNNNNNN)")(
      "format", po::value(&format)->default_value("safetensors"), "export format")(
      "out", po::value(&out), "export: the file to write")(
      "all", po::bool_switch(&everything), "export every shared entry, not only the model");
  add_common(options, common);
  po::positional_options_description positional;
  positional.add("action", 1).add("path", 1);
  auto values = parse(args, options, positional, kCheckpointUsage);
  if (!values) return 0;
  PluginLoader loader(registry);
  load_plugins(loader, common);
  if (action == "inspect") return inspect(path, registry);
  if (action == "export") {
    if (out.empty()) throw po::error("export needs --out FILE");
    return export_weights(path, format, out, everything, registry);
  }
  throw po::error("unknown checkpoint action '" + action + "' (inspect or export)");
}

}  // namespace trainyard
