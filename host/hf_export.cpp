#include "hf_export.hpp"

#include <ATen/ATen.h>

#include <cctype>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "trainyard/api/error.hpp"
#include "trainyard/models/pretrained_weights.hpp"
#include "trainyard/runtime/checkpoint_store.hpp"
#include "trainyard/support/files.hpp"
#include "trainyard/support/safetensors_dtype.hpp"

namespace fs = std::filesystem;

namespace trainyard {
namespace {

constexpr const char* kFormat = "hf/";
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// The checkpoint's "export.<format>/<file>" entries, by file name; `required` must be one.
std::map<std::string, std::string> described_files(const StateDict& shared,
                                                   const fs::path& checkpoint,
                                                   const std::string& format,
                                                   const std::string& required,
                                                   const std::string& what) {
  const std::string prefix = std::string(kExportFilePrefix) + format;
  std::map<std::string, std::string> files;
  for (const auto& [key, text] : shared.metadata) {
    if (key.rfind(prefix, 0) == 0) files[key.substr(prefix.size())] = text;
  }
  if (files.count(required) == 0) {
    throw Error("checkpoint " + checkpoint.string() + " carries no " + what + " " + required +
                ": the model that wrote it does not describe itself so" +
                " (--format safetensors exports its weights alone)");
  }
  return files;
}

// The checkpoint's model weights ("model.*", prefix removed), whole.
std::map<std::string, at::Tensor> model_weights(const PlacedState& placed,
                                                const fs::path& checkpoint) {
  const std::string prefix = "model.";
  std::map<std::string, at::Tensor> tensors;
  for (const std::string& name : placed.names(prefix))
    tensors[name.substr(prefix.size())] = placed.whole(name).contiguous();
  if (tensors.empty()) {
    throw Error("checkpoint " + checkpoint.string() +
                " holds no model weights ('model.*' entries)");
  }
  return tensors;
}

void refuse_existing(const fs::path& out) {
  if (fs::exists(out) && !(fs::is_directory(out) && fs::is_empty(out)))
    throw Error(out.string() + " exists: remove it or choose another --out");
}

// `out` + ".partial", fresh.
fs::path start_staging(const fs::path& out) {
  fs::path staging = out;
  staging += ".partial";
  fs::remove_all(staging);
  fs::create_directories(staging);
  return staging;
}

// Every file of `staging` on the disk, then `staging` renamed to `out`.
void finish_staging(const fs::path& staging, const fs::path& out) {
  for (const auto& entry : fs::directory_iterator(staging)) sync_to_disk(entry.path());
  sync_to_disk(staging);
  if (fs::exists(out)) fs::remove(out);  // empty, checked before
  fs::rename(staging, out);
  sync_to_disk(fs::absolute(out).parent_path());
}

// Consecutive runs of tensors, each run at most `max_bytes` unless one tensor alone is larger,
// as transformers splits a state dict.
std::vector<std::vector<std::string>> shard_names(const std::vector<std::string>& names,
                                                  const std::map<std::string, at::Tensor>& tensors,
                                                  std::uint64_t max_bytes) {
  std::vector<std::vector<std::string>> shards(1);
  std::uint64_t bytes = 0;
  for (const auto& name : names) {
    const auto size = static_cast<std::uint64_t>(tensors.at(name).nbytes());
    if (!shards.back().empty() && bytes + size > max_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(name);
    bytes += size;
  }
  return shards;
}

std::string shard_file(std::size_t index, std::size_t count) {
  if (count == 1) return kSingleFile;
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

void write_text(const fs::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::binary);
  out << text;
  if (!out.flush()) throw Error("cannot write " + file.string());
}

}  // namespace

std::uint64_t parse_shard_size(const std::string& text) {
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  const std::string unit = text.substr(digits);
  static const std::map<std::string, std::uint64_t> units = {{"", 1},
                                                             {"B", 1},
                                                             {"KB", 1'000},
                                                             {"MB", 1'000'000},
                                                             {"GB", 1'000'000'000},
                                                             {"KIB", 1ull << 10},
                                                             {"MIB", 1ull << 20},
                                                             {"GIB", 1ull << 30}};
  std::string upper;
  for (char c : unit) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const auto scale = units.find(upper);
  if (digits == 0 || digits > 15 || scale == units.end() ||
      std::stoull(text.substr(0, digits)) == 0) {
    throw Error("--max-shard-size '" + text + "' is not a size (such as 5GB, 500MB or 2GiB)");
  }
  return std::stoull(text.substr(0, digits)) * scale->second;
}

namespace {

// `files` and `tensors` as a Hugging Face model directory at request.out (checked not to exist).
void write_model_directory(const HfExport& request, const std::map<std::string, std::string>& files,
                           const std::map<std::string, at::Tensor>& tensors,
                           const CheckpointBackend& safetensors) {
  std::vector<std::string> names;
  for (const auto& entry : tensors) names.push_back(entry.first);
  const fs::path staging = start_staging(request.out);
  for (const auto& [name, text] : files) write_text(staging / name, text);
  const auto shards = shard_names(names, tensors, request.max_shard_bytes);
  nlohmann::json weight_map = nlohmann::json::object();
  std::uint64_t total_bytes = 0;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    StateDict shard;
    shard.metadata["format"] = "pt";  // what transformers expects of a PyTorch state dict
    for (const auto& name : shards[i]) {
      shard.tensors[name] = tensors.at(name);
      weight_map[name] = shard_file(i, shards.size());
      total_bytes += static_cast<std::uint64_t>(tensors.at(name).nbytes());
    }
    safetensors.write(staging / shard_file(i, shards.size()), shard);
  }
  if (shards.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}},
                                  {"weight_map", weight_map}};
    write_text(staging / kIndexFile, index.dump(2) + "\n");
  }
  finish_staging(staging, request.out);
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error("cannot read " + file.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::size_t write_hf_directory(const HfExport& request, const PlacedState& placed,
                               const StateDict& shared, const CheckpointBackend& safetensors) {
  if (shared.metadata.count(std::string(kExportFilePrefix) + "peft/adapter_config.json")) {
    throw Error("checkpoint " + request.checkpoint.string() +
                " holds LoRA adapters alone: --base HF_DIR merges them into the model they were "
                "trained on (--format peft writes them as PEFT saves them)");
  }
  const auto files =
      described_files(shared, request.checkpoint, kFormat, "config.json", "Hugging Face");
  refuse_existing(request.out);
  const auto tensors = model_weights(placed, request.checkpoint);
  write_model_directory(request, files, tensors, safetensors);
  return tensors.size();
}

std::size_t write_merged_hf_directory(const HfExport& request, const PlacedState& placed,
                                      const StateDict& shared, const fs::path& base_dir,
                                      const CheckpointBackend& safetensors) {
  const auto peft =
      described_files(shared, request.checkpoint, "peft/", "adapter_config.json", "PEFT");
  const auto adapter_config =
      nlohmann::json::parse(peft.at("adapter_config.json"), nullptr, /*allow_exceptions=*/false);
  if (!adapter_config.is_object() || !adapter_config.contains("r") ||
      !adapter_config.contains("lora_alpha")) {
    throw Error("checkpoint " + request.checkpoint.string() +
                ": its adapter_config.json gives no r and lora_alpha");
  }
  const double scale =
      adapter_config["lora_alpha"].get<double>() / adapter_config["r"].get<double>();
  refuse_existing(request.out);
  const auto adapters = model_weights(placed, request.checkpoint);
  const PretrainedWeights base(base_dir);
  std::map<std::string, at::Tensor> merged;
  std::size_t used = 0;
  for (const auto& [name, info] : base.tensors()) {
    at::Tensor weight = base.read(name, at::kFloat);
    const std::string suffix = ".weight";
    const std::string stem =
        name.ends_with(suffix) ? name.substr(0, name.size() - suffix.size()) : name;
    const auto a = adapters.find(stem + ".lora_A.weight");
    const auto b = adapters.find(stem + ".lora_B.weight");
    if (a != adapters.end() && b != adapters.end()) {
      // PEFT's merge: W + (alpha / r) B A, in fp32.
      weight = weight + at::mm(b->second.to(at::kFloat), a->second.to(at::kFloat)) * scale;
      used += 2;
    }
    merged[name] = weight.to(safetensors::scalar_type(info.dtype)).contiguous();
  }
  if (used != adapters.size()) {
    throw Error("checkpoint " + request.checkpoint.string() + " holds " +
                std::to_string(adapters.size()) + " adapter tensors, of which " +
                std::to_string(used) + " belong to a weight of " + base_dir.string());
  }
  write_model_directory(request, {{"config.json", read_text(base_dir / "config.json")}}, merged,
                        safetensors);
  return merged.size();
}

std::size_t write_peft_directory(const HfExport& request, const PlacedState& placed,
                                 const StateDict& shared, const CheckpointBackend& safetensors) {
  const auto files =
      described_files(shared, request.checkpoint, "peft/", "adapter_config.json", "PEFT");
  refuse_existing(request.out);
  StateDict adapters;
  adapters.metadata["format"] = "pt";
  // PEFT names a wrapped model's tensors under base_model.model.
  for (auto& [name, tensor] : model_weights(placed, request.checkpoint))
    adapters.tensors["base_model.model." + name] = tensor;
  const fs::path staging = start_staging(request.out);
  for (const auto& [name, text] : files) write_text(staging / name, text);
  safetensors.write(staging / "adapter_model.safetensors", adapters);
  finish_staging(staging, request.out);
  return adapters.tensors.size();
}

}  // namespace trainyard
