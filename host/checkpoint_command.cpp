#include "checkpoint_command.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli.hpp"
#include "hf_export.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/checkpoint.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/placed_state.hpp"
#include "trainyard/api/version.hpp"
#include "trainyard/runtime/checkpoint_store.hpp"
#include "trainyard/runtime/default_plugins.hpp"
#include "trainyard/support/files.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace trainyard {
namespace {

constexpr const char* kCheckpointUsage = R"(usage: trainyard checkpoint inspect PATH [options]
       trainyard checkpoint export PATH --format safetensors --out FILE [options]
       trainyard checkpoint export PATH --format hf --out DIR [--max-shard-size 5GB]
                                   [--base HF_DIR]
       trainyard checkpoint export PATH --format peft --out DIR

inspect   the checkpoint's step, backend, files with sizes and checksum status, and every
          tensor's dtype and shape; exits 1 when any file fails verification
export    the model's weights (entries 'model.*', prefix removed) as one file, each tensor
          assembled whole from the pieces every rank's file holds, whatever the layout that
          wrote it; --all exports every entry (optimizer state included) under its full name;
          --format hf writes a Hugging Face model directory (config.json, safetensors files of
          at most --max-shard-size, their index) that transformers' from_pretrained loads;
          --format peft writes a LoRA checkpoint's adapters as PEFT saves them, and
          --format hf --base HF_DIR merges them into the model they were trained on)";

// The formats that are not checkpoint backends: a Hugging Face model directory and a PEFT
// adapter directory.
constexpr const char* kHfFormat = "hf";
constexpr const char* kPeftFormat = "peft";

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

// The checkpoint's entries as placed pieces: the shared file, and every rank file's pieces of
// whole tensors (a rank's private entries, such as its random streams, are left out).
CheckpointState placed_entries(const fs::path& checkpoint, const CheckpointManifest& manifest,
                               const CheckpointBackend& reader, StateDict& shared) {
  CheckpointState state;
  int rank = 0;
  for (const auto& file : manifest.files) {
    if (file.name.rfind("shared", 0) == 0) {
      shared = reader.read(checkpoint / file.name);
      continue;
    }
    if (file.name.rfind("rank-", 0) != 0) continue;
    StateDict own = reader.read(checkpoint / file.name);
    for (auto& [name, tensor] : own.tensors) {
      auto placement = own.metadata.find(placement_key(name));
      if (placement == own.metadata.end()) continue;
      state.local.tensors[saved_rank_key(rank, name)] = tensor;
      state.local.metadata[saved_rank_key(rank, placement_key(name))] = placement->second;
    }
    ++rank;
  }
  state.shared = shared;
  return state;
}

int export_hf(const fs::path& checkpoint, const std::string& format, const fs::path& out,
              const std::string& max_shard_size, const fs::path& base, Registry& registry) {
  HfExport request{checkpoint, out, parse_shard_size(max_shard_size)};
  CheckpointManifest manifest = read_manifest(checkpoint);
  verify_checkpoint(checkpoint, manifest);
  auto reader = backend_named(manifest.backend, registry, checkpoint);
  auto writer = backend_named(default_plugins::kHuggingFaceWeights, registry, checkpoint);
  StateDict shared;
  const PlacedState placed(placed_entries(checkpoint, manifest, *reader, shared));
  std::size_t written = 0;
  if (format == kPeftFormat) {
    written = write_peft_directory(request, placed, shared, *writer);
  } else if (!base.empty()) {
    written = write_merged_hf_directory(request, placed, shared, base, *writer);
  } else {
    written = write_hf_directory(request, placed, shared, *writer);
  }
  std::cout << "wrote " << written << " tensors and their config to " << out.string() << "\n";
  return 0;
}

int export_weights(const fs::path& checkpoint, const std::string& format, const fs::path& out,
                   bool everything, Registry& registry) {
  if (!registry.contains("checkpoint", format)) {
    std::string known;
    for (const auto& name : registry.names("checkpoint"))
      known += (known.empty() ? "" : ", ") + name;
    throw Error("--format '" + format + "' names no loaded checkpoint backend (loaded: " + known +
                ")");
  }
  CheckpointManifest manifest = read_manifest(checkpoint);
  verify_checkpoint(checkpoint, manifest);
  auto reader = backend_named(manifest.backend, registry, checkpoint);
  auto writer = backend_named(format, registry, checkpoint);
  StateDict shared;
  const PlacedState placed(placed_entries(checkpoint, manifest, *reader, shared));
  StateDict exported;
  const std::string prefix = "model.";
  for (const std::string& name : placed.names(everything ? "" : prefix)) {
    exported.tensors[everything ? name : name.substr(prefix.size())] = placed.whole(name);
  }
  if (exported.tensors.empty()) {
    throw Error("checkpoint " + checkpoint.string() +
                " holds no model weights ('model.*' entries)");
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
  std::string format = default_plugins::kExportFormat;
  std::string out;
  bool everything = false;
  std::string max_shard_size = "5GB";
  std::string base;
  po::options_description options("checkpoint options");
  options.add_options()("action", po::value(&action)->required(), "inspect or export")(
      "path", po::value(&path)->required(), "a checkpoint folder (step-NNNNNNNNN)")(
      "format", po::value(&format)->default_value(format),
      "export: the checkpoint backend to write with")("out", po::value(&out),
                                                      "export: the file to write")(
      "all", po::bool_switch(&everything), "export every shared entry, not only the model")(
      "max-shard-size", po::value(&max_shard_size)->default_value(max_shard_size),
      "export --format hf: the largest safetensors file (5GB, 500MB, 2GiB)")(
      "base", po::value(&base),
      "export --format hf of a LoRA checkpoint: the Hugging Face folder its adapters are merged "
      "into");
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
    if (format == kHfFormat || format == kPeftFormat) {
      if (everything)
        throw po::error("--all exports checkpoint entries, which --format " + format + " does not");
      if (!base.empty() && format != kHfFormat) throw po::error("--base goes with --format hf");
      return export_hf(path, format, out, max_shard_size, base, registry);
    }
    return export_weights(path, format, out, everything, registry);
  }
  throw po::error("unknown checkpoint action '" + action + "' (inspect or export)");
}

}  // namespace trainyard
