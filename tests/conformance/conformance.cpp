#include "conformance.hpp"

#include <c10/util/Logging.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <optional>
#include <set>

#include "trainyard/runtime/crash_report.hpp"
#include "trainyard/runtime/plugin_loader.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard::conformance {
namespace {

namespace fs = std::filesystem;

const char* kUsage = R"(usage: trainyard-conformance [PLUGIN_PATH...] [--component NAME]... [--set KIND.KEY=VALUE]...
                             [GoogleTest options]

Runs the conformance suite of each plugin kind on the components of the plugin folders or
libraries given (the bundled plugins are loaded as well, for the datasets and models the suites
build around a component, but are not tested unless their folder is given). --component keeps
only the components of that name (repeatable). Without paths: every bundled plugin and those in
TRAINYARD_CONFORMANCE_PLUGIN_PATH. --set builds the components under test of KIND with KEY set
to VALUE (TOML, or a bare string; repeatable), for variants of a plugin's options and for
options it requires. GoogleTest options (--gtest_filter=..., --gtest_list_tests)
pass through.
)";

// What the command line asks for.
struct Override {
  std::string kind, key, text;
  Value value;
};

struct Selection {
  std::vector<fs::path> plugin_paths;
  std::set<std::string> components;
  std::vector<Override> overrides;
};

Selection& selection() {
  static Selection value;
  return value;
}

struct Loaded {
  Registry* registry = nullptr;
  std::vector<std::string> errors;
  std::vector<ComponentInfo> under_test;
};

fs::path own_path() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : self;
}

// True when `library` is `path` or lies directly in the folder `path`.
bool comes_from(const std::string& library, const fs::path& path) {
  if (library.empty()) return false;
  std::error_code ec;
  const fs::path file = fs::weakly_canonical(library, ec);
  return file == path || file.parent_path() == path;
}

std::vector<ComponentInfo> components_under_test(const Registry& registry) {
  const Selection& chosen = selection();
  std::vector<ComponentInfo> out;
  for (const auto& info : registry.list()) {
    if (!chosen.plugin_paths.empty() &&
        std::none_of(chosen.plugin_paths.begin(), chosen.plugin_paths.end(),
                     [&](const fs::path& path) { return comes_from(info.library_path, path); })) {
      continue;
    }
    if (!chosen.components.empty() && !chosen.components.count(info.name)) continue;
    out.push_back(info);
  }
  return out;
}

Loaded& loaded() {
  // Deliberately leaked: plugin objects and their libraries must outlive every test, and the
  // order of static destruction across translation units is unspecified.
  static Loaded* state = [] {
    auto* out = new Loaded;
    out->registry = new Registry;
    PluginLoader loader(*out->registry);
    try {
      loader.load_folder(bundled_plugin_folder(own_path()));
    } catch (const std::exception& error) {
      out->errors.push_back(std::string("bundled plugins: ") + error.what());
    }
    std::vector<fs::path> extra = selection().plugin_paths;
    if (extra.empty()) {
      if (const char* listed = std::getenv("TRAINYARD_CONFORMANCE_PLUGIN_PATH")) {
        extra = split_search_path(listed);
      }
    }
    for (const auto& path : extra) {
      try {
        loader.load_path(path);
      } catch (const std::exception& error) {
        out->errors.push_back(path.string() + ": " + error.what());
      }
    }
    for (const auto& error : out->errors) {
      std::cerr << "conformance: plugin load error: " << error << "\n";
    }
    out->under_test = components_under_test(*out->registry);
    return out;
  }();
  return *state;
}

}  // namespace

Registry& registry() { return *loaded().registry; }
const std::vector<std::string>& load_errors() { return loaded().errors; }

std::vector<std::string> plugin_names(const std::string& kind) {
  std::vector<std::string> out;
  for (const auto& info : loaded().under_test) {
    if (info.kind == kind) out.push_back(info.name);
  }
  return out;
}

std::vector<std::string> runner_arguments() {
  std::vector<std::string> arguments;
  for (const auto& path : selection().plugin_paths) arguments.push_back(path.string());
  for (const auto& name : selection().components) arguments.push_back("--component=" + name);
  for (const auto& given : selection().overrides) {
    arguments.push_back("--set=" + given.kind + "." + given.key + "=" + given.text);
  }
  return arguments;
}

Config under_test(const std::string& kind, const std::string& section_name,
                  std::shared_ptr<Table> table) {
  auto options = table ? std::make_shared<Table>(*table) : std::make_shared<Table>();
  for (const auto& given : selection().overrides) {
    if (given.kind == kind) options->set(given.key, given.value);
  }
  return Config(std::move(options), section_name);
}

std::vector<std::string> overridden_options(const std::string& kind) {
  std::vector<std::string> keys;
  for (const auto& given : selection().overrides) {
    if (given.kind == kind) keys.push_back(given.key);
  }
  return keys;
}

namespace {

// KIND.KEY=VALUE, VALUE read as TOML (a bare word as a string, as recipes' --set reads it).
std::optional<Override> parse_override(const std::string& assignment) {
  const auto dot = assignment.find('.');
  const auto equals = assignment.find('=');
  if (dot == std::string::npos || equals == std::string::npos || dot == 0 || dot + 1 >= equals) {
    return std::nullopt;
  }
  Override given{assignment.substr(0, dot), assignment.substr(dot + 1, equals - dot - 1),
                 assignment.substr(equals + 1), Value()};
  try {
    auto parsed = parse_toml("value = " + given.text, "--set " + assignment);
    given.value = *parsed->find("value");
  } catch (const std::exception&) {
    given.value = Value(given.text);
  }
  return given;
}

}  // namespace

// Reads the runner's own arguments out of argv, leaving GoogleTest's. Returns false (after
// printing why) when the command line cannot be used.
bool take_runner_arguments(int& argc, char** argv) {
  Selection& chosen = selection();
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (arg == "--component") {
      if (i + 1 == argc) {
        std::cerr << "trainyard-conformance: --component needs a component name\n";
        return false;
      }
      chosen.components.insert(argv[++i]);
    } else if (arg.rfind("--component=", 0) == 0) {
      chosen.components.insert(arg.substr(std::strlen("--component=")));
    } else if (arg == "--set" || arg.rfind("--set=", 0) == 0) {
      std::string assignment;
      if (arg == "--set") {
        if (i + 1 == argc) {
          std::cerr << "trainyard-conformance: --set needs KIND.KEY=VALUE\n";
          return false;
        }
        assignment = argv[++i];
      } else {
        assignment = arg.substr(std::strlen("--set="));
      }
      auto given = parse_override(assignment);
      if (!given) {
        std::cerr << "trainyard-conformance: --set needs KIND.KEY=VALUE, got '" << assignment
                  << "'\n";
        return false;
      }
      chosen.overrides.push_back(std::move(*given));
    } else if (arg.rfind("-", 0) == 0) {
      argv[kept++] = argv[i];  // GoogleTest's
    } else {
      std::error_code ec;
      fs::path path = fs::weakly_canonical(fs::absolute(arg), ec);
      if (ec || !fs::exists(path)) {
        std::cerr << "trainyard-conformance: plugin path not found: " << arg << "\n";
        return false;
      }
      chosen.plugin_paths.push_back(path);
    }
  }
  argc = kept;
  argv[argc] = nullptr;
  return true;
}

}  // namespace trainyard::conformance

namespace {

TEST(ConformancePlugins, LoadWithoutErrors) {
  for (const auto& error : trainyard::conformance::load_errors()) ADD_FAILURE() << error;
  EXPECT_FALSE(trainyard::conformance::registry().list().empty());
}

}  // namespace

int main(int argc, char** argv) {
  trainyard::install_crash_report(argc > 0 ? argv[0] : "trainyard-conformance");
  // As in every test binary (tests/support/test_main.cpp): no flight recorder for ranks that
  // run as threads of one process.
  setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0);
  // The comm suite kills peers and times collectives out on purpose; c10d logs each such
  // expected failure as a warning with a stack trace. The suite checks the errors themselves,
  // so only errors are logged (TORCH_CPP_LOG_LEVEL in the environment wins).
  if (!std::getenv("TORCH_CPP_LOG_LEVEL")) setenv("TORCH_CPP_LOG_LEVEL", "ERROR", 1);
  c10::initLogging();
  if (!trainyard::conformance::take_runner_arguments(argc, argv)) return 2;
  const bool listing = std::any_of(argv + 1, argv + argc, [](const char* arg) {
    return std::strcmp(arg, "--gtest_list_tests") == 0;
  });
  // The registry loads before GoogleTest instantiates the suites over its components.
  const auto& chosen = trainyard::conformance::selection();
  if (!chosen.plugin_paths.empty() && !listing &&
      trainyard::conformance::loaded().under_test.empty()) {
    std::cerr << "trainyard-conformance: no components to test in the paths given"
              << (chosen.components.empty() ? "" : " with the names given") << "\n";
    return 2;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
