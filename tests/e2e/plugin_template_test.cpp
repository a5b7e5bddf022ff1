// A plugin built out of tree against the installed SDK (tools/plugin_template), trained by the
// installed host and passed by the installed conformance runner. Labelled "slow"; it compiles one
// file and trains on one thread, so it runs beside other tests.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "metrics_file.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

// The RUNPATH entries of an ELF file, as readelf prints them.
std::vector<std::string> runpath_of(const fs::path& file) {
  auto dump = run_command({"readelf", "-d", file.string()});
  if (dump.exit_code != 0) throw std::runtime_error("readelf failed on " + file.string());
  std::vector<std::string> entries;
  std::istringstream lines(dump.out);
  for (std::string line; std::getline(lines, line);) {
    auto open = line.find("(RUNPATH)");
    if (open == std::string::npos) open = line.find("(RPATH)");
    if (open == std::string::npos) continue;
    const auto begin = line.find('[', open), end = line.rfind(']');
    std::istringstream list(line.substr(begin + 1, end - begin - 1));
    for (std::string entry; std::getline(list, entry, ':');) entries.push_back(entry);
  }
  return entries;
}

bool under(const fs::path& path, const fs::path& folder) {
  const std::string p = fs::weakly_canonical(path).string() + "/";
  const std::string f = fs::weakly_canonical(folder).string() + "/";
  return p.rfind(f, 0) == 0;
}

// An install moved away from where it was installed, with nothing of the checkout or the build
// tree in its paths: the template builds against it with find_package(trainyard) alone (LibTorch
// through the path the install recorded), installs into the host's plugin folder, trains, and
// passes the installed conformance runner, which tests only the template's model.
TEST(PluginTemplateTest, BuildsAgainstAMovedInstallAndTrains) {
  TempDir dir;
  const fs::path installed = dir / "installed";
  const std::string path_env =
      std::string("PATH=/usr/local/cuda/bin:") + (std::getenv("PATH") ? std::getenv("PATH") : "");
  auto install = run_command({"cmake", "--install", binary_dir().string(), "--prefix",
                              installed.string()});
  ASSERT_EQ(install.exit_code, 0) << install.out << install.err;
  const fs::path prefix = dir / "moved" / "trainyard";
  fs::create_directories(prefix.parent_path());
  fs::rename(installed, prefix);
  ASSERT_TRUE(fs::exists(prefix / "bin" / "trainyard"));
  ASSERT_TRUE(fs::exists(prefix / "bin" / "trainyard-conformance"));
  ASSERT_TRUE(fs::exists(prefix / "include" / "trainyard" / "api" / "plugin.hpp"));
  // The plugin API alone: the runtime's headers stay in the source tree.
  EXPECT_FALSE(fs::exists(prefix / "include" / "trainyard" / "runtime"));
  const fs::path package = prefix / "lib" / "cmake" / "trainyard";
  ASSERT_TRUE(fs::exists(package / "trainyardConfig.cmake"));

  // Nothing installed points into the checkout or the build tree, or where it was installed.
  for (const auto& item : fs::recursive_directory_iterator(package)) {
    const std::string text = read_text(item.path());
    for (const fs::path& forbidden : {source_dir(), binary_dir(), installed}) {
      EXPECT_EQ(text.find(fs::weakly_canonical(forbidden).string()), std::string::npos)
          << item.path() << " names " << forbidden;
    }
  }
  std::vector<fs::path> binaries = {prefix / "bin" / "trainyard",
                                    prefix / "bin" / "trainyard-conformance"};
  for (const auto& item : fs::recursive_directory_iterator(prefix / "lib")) {
    if (item.is_regular_file() && item.path().string().find(".so") != std::string::npos) {
      binaries.push_back(item.path());
    }
  }
  for (const auto& binary : binaries) {
    const auto entries = runpath_of(binary);
    EXPECT_FALSE(entries.empty()) << binary;
    for (const auto& entry : entries) {
      if (entry.rfind("$ORIGIN", 0) == 0) continue;
      EXPECT_FALSE(under(entry, source_dir()) || under(entry, binary_dir()))
          << binary << " has RUNPATH " << entry;
      EXPECT_TRUE(fs::is_directory(entry)) << binary << " has RUNPATH " << entry;
    }
  }

  const fs::path build = dir / "template-build";
  auto configure = run_command({"cmake", "-S", (source_dir() / "tools" / "plugin_template").string(),
                                "-B", build.string(), "-DCMAKE_PREFIX_PATH=" + prefix.string()},
                               {}, 600, {path_env});
  ASSERT_EQ(configure.exit_code, 0) << configure.out << configure.err;
  auto compile = run_command({"cmake", "--build", build.string()}, {}, 900, {path_env});
  ASSERT_EQ(compile.exit_code, 0) << compile.out << compile.err;
  ASSERT_TRUE(fs::exists(build / "libresidual_mlp.so"));
  // The moved host, its bundled plugins, and the template found through --plugin-path.
  auto run = run_command({(prefix / "bin" / "trainyard").string(), "run",
                          (source_dir() / "tools" / "plugin_template" / "recipe.toml").string(),
                          "--plugin-path", build.string(), "--set",
                          "run.output_dir=" + (dir / "run").string(), "--set", "run.threads=1"},
                         dir.path(), 600, {"LD_LIBRARY_PATH="});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  auto records = read_metrics(dir / "run" / "metrics.jsonl");
  auto train = of_phase(records, "train");
  ASSERT_GE(train.size(), 2u);
  EXPECT_LT(train.back().at("loss"), 0.7 * train.front().at("loss"));
  EXPECT_GT(of_phase(records, "summary").back().at("eval_accuracy"), 0.6);

  // The planner plans the template's model as it plans a bundled one, with no code of its own:
  // the parameters it predicts are what the run held.
  auto plan = run_command({(prefix / "bin" / "trainyard").string(), "plan",
                           (source_dir() / "tools" / "plugin_template" / "recipe.toml").string(),
                           "--plugin-path", build.string(), "--json"},
                          dir.path(), 600, {"LD_LIBRARY_PATH="});
  ASSERT_EQ(plan.exit_code, 0) << plan.out << plan.err;
  const nlohmann::json planned = nlohmann::json::parse(plan.out);
  EXPECT_EQ(planned.at("parameters").get<double>(),
            of_phase(records, "summary").back().at("held_parameter_bytes"));
  EXPECT_GT(planned.at("activations").get<double>(), 0);
  EXPECT_GT(planned.at("peak").get<double>(), planned.at("step_start").get<double>());

  // The installed conformance runner tests the template's model and nothing else, quietly.
  auto conformance = run_command({(prefix / "bin" / "trainyard-conformance").string(),
                                  build.string()},
                                 dir.path(), 600);
  ASSERT_EQ(conformance.exit_code, 0) << conformance.out << conformance.err;
  EXPECT_HAS(conformance.out, "ModelConformance.");
  EXPECT_HAS(conformance.out, "/residual_mlp");
  EXPECT_EQ(conformance.out.find("/mlp\n"), std::string::npos) << conformance.out;
  EXPECT_EQ(conformance.out.find("DatasetConformance."), std::string::npos) << conformance.out;

  // The out-of-tree install rule: lib/trainyard/plugins under the prefix it is given.
  auto install_plugin =
      run_command({"cmake", "--install", build.string(), "--prefix", prefix.string()});
  ASSERT_EQ(install_plugin.exit_code, 0) << install_plugin.out << install_plugin.err;
  ASSERT_TRUE(fs::exists(prefix / "lib" / "trainyard" / "plugins" / "libresidual_mlp.so"));

  // Installed in the host's folder, the plugin is found without --plugin-path.
  auto listed = run_command({(prefix / "bin" / "trainyard").string(), "plugins", "model"});
  EXPECT_HAS(listed.out, "model residual_mlp");
  EXPECT_HAS(listed.out, "width of the residual stream [>= 1]");
}

}  // namespace
}  // namespace trainyard::testing
