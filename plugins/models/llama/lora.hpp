#pragma once
// LoRA (Hu et al. 2021) as PEFT builds it for a Llama: each targeted projection W gains
// lora_A [r, in] and lora_B [out, r], and computes x W^T + ((x A^T) B^T) * alpha / r; A starts
// kaiming-uniform (a = sqrt(5)), B at zero, so training starts from the base model exactly.
// Every other parameter is frozen: not optimised, not checkpointed (it is rebuilt from the
// weights or the seed), and the adapters alone export in PEFT's format.

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "trainyard/api/error.hpp"

namespace trainyard::llama {

struct LoraSettings {
  std::int64_t rank = 0;  // 0: no adapters
  double alpha = 8;
  std::vector<std::string> targets = {"q_proj", "v_proj"};

  bool enabled() const { return rank > 0; }
  bool targets_projection(const std::string& name) const {
    return enabled() && std::find(targets.begin(), targets.end(), name) != targets.end();
  }
  double scale() const { return alpha / static_cast<double>(rank); }

  // PEFT's adapter_config.json for these adapters on a causal language model.
  nlohmann::json peft_config() const {
    return {{"peft_type", "LORA"},
            {"task_type", "CAUSAL_LM"},
            {"r", rank},
            {"lora_alpha", alpha},
            {"target_modules", targets},
            {"lora_dropout", 0.0},
            {"bias", "none"},
            {"fan_in_fan_out", false},
            {"use_rslora", false},
            {"use_dora", false},
            {"init_lora_weights", true},
            {"inference_mode", true},
            {"modules_to_save", nullptr},
            {"base_model_name_or_path", nullptr}};
  }
};

// The projections LoRA may target: every linear of a decoder layer.
inline const std::vector<std::string>& lora_projections() {
  static const std::vector<std::string> names = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  return names;
}

// Reads [model] lora = { rank, alpha, targets, dropout } (an empty table: no adapters). Refuses
// unknown keys, a rank below 1, unknown targets and a dropout other than 0 by name.
inline LoraSettings read_lora_settings(const nlohmann::json& table, const std::string& source) {
  LoraSettings settings;
  if (table.empty()) {
    settings.rank = 0;
    return settings;
  }
  const auto refuse = [&](const std::string& problem) { throw Error(source + ": " + problem); };
  for (const auto& [key, value] : table.items()) {
    if (key == "rank") {
      if (!value.is_number_integer() || value.get<std::int64_t>() < 1)
        refuse("rank must be an integer of at least 1");
      settings.rank = value.get<std::int64_t>();
    } else if (key == "alpha") {
      if (!value.is_number() || value.get<double>() <= 0) refuse("alpha must be a positive number");
      settings.alpha = value.get<double>();
    } else if (key == "targets") {
      if (!value.is_array() || value.empty()) refuse("targets must be a non-empty list of names");
      settings.targets.clear();
      for (const auto& target : value) {
        const auto& known = lora_projections();
        if (!target.is_string() ||
            std::find(known.begin(), known.end(), target.get<std::string>()) == known.end()) {
          refuse("target " + target.dump() +
                 " is not a projection of a layer (q_proj, k_proj, v_proj, o_proj, gate_proj, "
                 "up_proj, down_proj)");
        }
        settings.targets.push_back(target.get<std::string>());
      }
    } else if (key == "dropout") {
      if (!value.is_number() || value.get<double>() != 0.0)
        refuse("dropout other than 0 is not built (adapters train without dropout)");
    } else {
      refuse("unknown key '" + key + "' (rank, alpha, targets, dropout)");
    }
  }
  if (settings.rank == 0) refuse("rank is required (the adapters' rank r)");
  return settings;
}

}  // namespace trainyard::llama
