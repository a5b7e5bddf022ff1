#include "trainyard/support/libtorch_build.hpp"

#include <ATen/Version.h>

#include <sstream>

namespace trainyard {

namespace {

std::string trim(std::string text) {
  text.erase(0, text.find_first_not_of(' '));
  text.erase(text.find_last_not_of(' ') + 1);
  return text;
}

}  // namespace

std::map<std::string, std::string> libtorch_build_settings() {
  std::map<std::string, std::string> out;
  constexpr const char* kHeading = "Build settings:";
  const std::string config = at::show_config();
  const auto start = config.find(kHeading);
  if (start == std::string::npos) return out;
  const auto first = start + std::string(kHeading).size();
  std::stringstream items(config.substr(first, config.find('\n', start) - first));
  std::string item;
  while (std::getline(items, item, ',')) {
    const auto equals = item.find('=');
    if (equals == std::string::npos) continue;
    out[trim(item.substr(0, equals))] = trim(item.substr(equals + 1));
  }
  return out;
}

std::string libtorch_build_setting(const std::string& key) {
  const auto settings = libtorch_build_settings();
  const auto it = settings.find(key);
  return it == settings.end() ? std::string("?") : it->second;
}

bool libtorch_built_with(const std::string& use_key) {
  const std::string value = libtorch_build_setting(use_key);
  return value == "ON" || value == "1";
}

}  // namespace trainyard
