#pragma once
// A checkpoint as a Hugging Face model directory: the model's own description of itself
// (config.json, from Model::export_files) beside its weights in safetensors files of at most a
// given size, with transformers' index when there are several, so that
// `AutoModelForCausalLM.from_pretrained(DIR)` loads it as it was trained.

#include <cstdint>
#include <filesystem>
#include <string>

#include "trainyard/api/checkpoint.hpp"
#include "trainyard/api/placed_state.hpp"
#include "trainyard/api/state.hpp"

namespace trainyard {

struct HfExport {
  std::filesystem::path checkpoint;  // named in errors
  std::filesystem::path out;         // the directory to create
  std::uint64_t max_shard_bytes = 5'000'000'000;
};

// "5GB" (10^9), "500MB", "10KB", "2GiB" (2^30), "100MiB", or a count of bytes, as transformers'
// max_shard_size reads them. Throws Error naming the value otherwise.
std::uint64_t parse_shard_size(const std::string& text);

// Writes `request.out` whole or not at all (built beside it and renamed into place) from the
// checkpoint's model weights (`placed` entries "model.*", prefix removed) and the files its
// shared metadata carries for the format. Returns the number of tensors written. Throws Error
// naming the checkpoint when it carries no config.json, and naming `out` when it exists.
std::size_t write_hf_directory(const HfExport& request, const PlacedState& placed,
                               const StateDict& shared, const CheckpointBackend& safetensors);

// A checkpoint of adapters (as write_peft_directory reads it) merged into the Hugging Face model
// directory they were trained on (`base_dir`): every targeted weight W becomes
// W + (lora_alpha / r) B A as PEFT's merge_and_unload computes it, in fp32 and stored in the
// base's dtype, beside the base's config.json. Throws Error when an adapter has no weight in
// the base. Returns the number of tensors written.
std::size_t write_merged_hf_directory(const HfExport& request, const PlacedState& placed,
                                      const StateDict& shared,
                                      const std::filesystem::path& base_dir,
                                      const CheckpointBackend& safetensors);

// The adapters of a checkpoint whose model trained adapters alone (LoRA: its "model.*" entries
// are the adapters) as PEFT saves them: adapter_config.json from the model and
// adapter_model.safetensors with PEFT's names ("base_model.model." + the model's), which
// peft.PeftModel.from_pretrained(base, DIR) loads. Returns the number of tensors written.
std::size_t write_peft_directory(const HfExport& request, const PlacedState& placed,
                                 const StateDict& shared, const CheckpointBackend& safetensors);

}  // namespace trainyard
