#pragma once
// Shared pieces of the conformance suites: one process-wide registry holding every plugin under
// test, the parameter lists the suites instantiate over, and small builders.
//
// The runner is installed as `trainyard-conformance` (and built as bin/conformance_tests). Given
// plugin folders or libraries, it runs the suites on their components only (the bundled plugins
// are loaded too, as the datasets and models the suites build around them):
//   trainyard-conformance /path/to/my/plugins [--component NAME]... [--set KIND.KEY=VALUE]...
//                         [GoogleTest options]
// Without paths it runs them on every bundled plugin and on those listed in
// TRAINYARD_CONFORMANCE_PLUGIN_PATH (colon-separated).

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <future>

#include <memory>
#include <string>
#include <vector>

#include "test_support.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/communicator.hpp"
#include "trainyard/api/config.hpp"
#include "trainyard/api/registry.hpp"

namespace trainyard::conformance {

// The registry every suite builds from. Loaded on first use and never destroyed, so that objects
// the plugins create (and the libraries behind them) outlive every test.
Registry& registry();

// Errors met while loading plugin folders (reported by ConformancePlugins.LoadWithoutErrors
// rather than aborting the whole executable).
const std::vector<std::string>& load_errors();

// The names of the components of `kind` under test: those of the plugin paths given on the
// command line (narrowed by --component), else every one in registry().
std::vector<std::string> plugin_names(const std::string& kind);

// The runner's own arguments (plugin paths, --component), rebuilt from its selection: a test that
// runs itself again in a child process passes them on, so that the child loads and selects the
// same plugins.
std::vector<std::string> runner_arguments();

// The options a suite builds the component of `kind` under test with: `table` (the suite's own
// settings, which --set may change) with the runner's --set KIND.KEY=VALUE overrides of that kind
// on top, as section `section_name` ("model", "sinks.jsonl"). Components the suites build around
// the one under test (the mlp a strategy trains) take section() instead: the overrides name
// options of the plugin under test.
Config under_test(const std::string& kind, const std::string& section_name,
                  std::shared_ptr<Table> table = {});
inline Config under_test(const std::string& kind, std::shared_ptr<Table> table = {}) {
  return under_test(kind, kind, std::move(table));
}

// The option keys --set gives for `kind`.
std::vector<std::string> overridden_options(const std::string& kind);

// Test-name suffix for a plugin name: GoogleTest allows only [A-Za-z0-9_].
struct PluginNameGenerator {
  std::string operator()(const ::testing::TestParamInfo<std::string>& info) const {
    std::string out = info.param;
    for (char& c : out) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
      if (!ok) c = '_';
    }
    return out.empty() ? std::string("unnamed") : out;
  }
};

// An options section holding `table` (empty: every option takes its default).
inline Config section(const std::string& name, std::shared_ptr<Table> table = {}) {
  if (!table) table = std::make_shared<Table>();
  return Config(std::move(table), name);
}

// True when the component declares an option called `option_name`.
inline bool has_option(const std::string& kind, const std::string& name,
                       const std::string& option_name) {
  for (const auto& spec : registry().info(kind, name).options) {
    if (spec.name == option_name) return true;
  }
  return false;
}

// The options the component declares without a default: it cannot be built from defaults (a
// dataset that reads only the files it is given). Empty for most components.
inline std::vector<std::string> required_options(const std::string& kind,
                                                 const std::string& name) {
  std::vector<std::string> out;
  for (const auto& spec : registry().info(kind, name).options) {
    if (!spec.default_value) out.push_back(spec.name);
  }
  return out;
}

// Why the suites, which build every component from its defaults, cannot build this one; empty
// when they can.
inline std::string why_not_buildable_from_defaults(const std::string& kind,
                                                   const std::string& name) {
  std::vector<std::string> required = required_options(kind, name);
  const std::vector<std::string> given = overridden_options(kind);
  std::erase_if(required, [&](const std::string& option) {
    return std::find(given.begin(), given.end(), option) != given.end();
  });
  if (required.empty()) return {};
  std::string names;
  for (const auto& option : required) names += (names.empty() ? "" : ", ") + kind + "." + option;
  return kind + " '" + name + "' declares required options (" + names +
         "): the suite builds components from their defaults; give them with --set " + kind +
         ".KEY=VALUE, or its own tests cover it";
}

// A CPU build context for a small image-classification dataset.
inline BuildContext classification_context(std::vector<std::int64_t> input_shape = {1, 28, 28},
                                           std::int64_t classes = 10) {
  BuildContext context;
  context.device = c10::Device(c10::kCPU);
  context.seed = 1234;
  context.data.input_shape = std::move(input_shape);
  context.data.num_classes = classes;
  return context;
}

// Runs `body(communicator)` for each of `ranks` ranks, on its own thread with the bundled gloo
// communicator connected over loopback; the results in rank order.
template <class Result>
std::vector<Result> run_gloo_ranks(
    int ranks, const std::function<Result(const std::shared_ptr<Communicator>&)>& body) {
  const int port = trainyard::testing::free_loopback_port();
  std::vector<std::future<Result>> running;
  for (int rank = 0; rank < ranks; ++rank) {
    running.push_back(std::async(std::launch::async, [rank, ranks, port, &body] {
      std::shared_ptr<Communicator> communicator =
          registry().create<Communicator>("gloo", section("comm"), classification_context());
      Rendezvous meet;
      meet.rank = rank;
      meet.world_size = ranks;
      meet.local_rank = rank;
      meet.local_world_size = ranks;
      meet.master_port = port;
      meet.timeout = std::chrono::seconds(30);
      communicator->connect(meet, c10::Device(c10::kCPU));
      return body(communicator);
    }));
  }
  std::vector<Result> out;
  for (auto& rank : running) out.push_back(rank.get());
  return out;
}

}  // namespace trainyard::conformance

// Instantiates `suite` over every plugin of `kind`. A kind without plugins (a third party's
// folder holding other kinds) is not an error.
#define TRAINYARD_CONFORMANCE_SUITE(suite, kind)                                              \
  GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(suite);                                       \
  INSTANTIATE_TEST_SUITE_P(, suite,                                                           \
                           ::testing::ValuesIn(::trainyard::conformance::plugin_names(kind)), \
                           ::trainyard::conformance::PluginNameGenerator())
