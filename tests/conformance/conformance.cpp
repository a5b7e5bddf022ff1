#include "conformance.hpp"

#include <cstdlib>
#include <exception>
#include <iostream>

#include "test_support.hpp"
#include "trainyard/plugin_loader.hpp"

namespace trainyard::conformance {
namespace {

struct Loaded {
  Registry* registry = nullptr;
  std::vector<std::string> errors;
};

Loaded& loaded() {
  // Deliberately leaked: plugin objects and their libraries must outlive every test, and the
  // order of static destruction across translation units is unspecified.
  static Loaded* state = [] {
    auto* out = new Loaded;
    out->registry = new Registry;
    PluginLoader loader(*out->registry);
    try {
      loader.load_folder(testing::plugin_folder());
    } catch (const std::exception& error) {
      out->errors.push_back(std::string("bundled plugins: ") + error.what());
    }
    if (const char* extra = std::getenv("TRAINYARD_CONFORMANCE_PLUGIN_PATH")) {
      for (const auto& path : split_search_path(extra)) {
        try {
          loader.load_path(path);
        } catch (const std::exception& error) {
          out->errors.push_back(path.string() + ": " + error.what());
        }
      }
    }
    for (const auto& error : out->errors) {
      std::cerr << "conformance: plugin load error: " << error << "\n";
    }
    return out;
  }();
  return *state;
}

}  // namespace

Registry& registry() { return *loaded().registry; }
const std::vector<std::string>& load_errors() { return loaded().errors; }

std::vector<std::string> plugin_names(const std::string& kind) {
  return registry().names(kind);
}

}  // namespace trainyard::conformance

namespace {

TEST(ConformancePlugins, LoadWithoutErrors) {
  for (const auto& error : trainyard::conformance::load_errors()) ADD_FAILURE() << error;
  EXPECT_FALSE(trainyard::conformance::registry().list().empty());
}

}  // namespace
