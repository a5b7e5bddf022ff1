#pragma once
// How the LibTorch this process runs on was built, as its own configuration report states it.

#include <map>
#include <string>

namespace trainyard {

// The KEY=value pairs of the "Build settings:" line of at::show_config() (TORCH_VERSION,
// BLAS_INFO, and each backend's USE_x and x_VERSION); empty when the report has none.
std::map<std::string, std::string> libtorch_build_settings();

// A setting's value, or "?" when the report does not state it.
std::string libtorch_build_setting(const std::string& key);

// Whether a USE_x setting is on ("ON" or "1").
bool libtorch_built_with(const std::string& use_key);

}  // namespace trainyard
