#pragma once
// The plugins a recipe or a command gets where it names none, declared here alone. The recipe's
// resolution fills them in (so `trainyard run --print-config` shows them), and the host's
// commands take theirs from here; nothing else in the host or the runtime names a plugin.

namespace trainyard::default_plugins {

inline constexpr const char* kStrategy = "single";
inline constexpr const char* kPrecision = "fp32";
inline constexpr const char* kScheduler = "constant";
inline constexpr const char* kCheckpoint = "torch";
// The sink a recipe without [sinks] gets.
inline constexpr const char* kSink = "console";
// [run] device, and the device `trainyard doctor` requires to be provided.
inline constexpr const char* kDevice = "cpu";
// The checkpoint backend `trainyard checkpoint export` writes with unless --format names another.
inline constexpr const char* kExportFormat = "safetensors";
// The checkpoint backend that writes the weight files of `checkpoint export --format hf`:
// Hugging Face model directories hold safetensors files.
inline constexpr const char* kHuggingFaceWeights = "safetensors";
// The sink `trainyard compare` adds to each variant to read its metrics back.
inline constexpr const char* kMetricsSink = "jsonl";

}  // namespace trainyard::default_plugins
