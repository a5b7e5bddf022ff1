// Unit tests of trainyard/plugin_loader.hpp with real plugin libraries: the bundled ones and the
// misbehaving ones built for tests.

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "test_support.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/api/device.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/parallel/held_blocks.hpp"
#include "trainyard/api/metrics.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/runtime/plugin_loader.hpp"
#include "trainyard/api/version.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::plugin_folder;
using testing::test_plugin_folder;


fs::path test_plugin(const std::string& name) { return test_plugin_folder() / ("lib" + name + ".so"); }

TEST(PluginLoaderTest, BundledFolderRegistersKnownComponents) {
  Registry registry;
  PluginLoader loader(registry);
  loader.load_folder(plugin_folder());
  EXPECT_TRUE(registry.contains("model", "cnn"));
  EXPECT_TRUE(registry.contains("model", "mlp"));
  EXPECT_TRUE(registry.contains("dataset", "fashion_mnist"));
  EXPECT_TRUE(registry.contains("dataset", "synthetic"));
  EXPECT_TRUE(registry.contains("optimizer", "adamw"));
  EXPECT_TRUE(registry.contains("sink", "console"));
  EXPECT_TRUE(registry.contains("strategy", "single"));
  EXPECT_FALSE(loader.loaded().empty());
  const ComponentInfo& cnn = registry.info("model", "cnn");
  EXPECT_FALSE(cnn.plugin.empty());
  EXPECT_FALSE(cnn.plugin_version.empty());
  ASSERT_FALSE(cnn.library_path.empty());
  EXPECT_TRUE(fs::path(cnn.library_path).is_absolute());
  EXPECT_TRUE(loader.is_loaded(cnn.library_path));
  // Loaded plugins are listed with absolute paths, in name order.
  for (std::size_t i = 0; i < loader.loaded().size(); ++i) {
    EXPECT_TRUE(loader.loaded()[i].path.is_absolute());
    if (i > 0) {
      EXPECT_LT(loader.loaded()[i - 1].path, loader.loaded()[i].path);
    }
  }
  // The test plugins are not in the bundled folder.
  EXPECT_FALSE(registry.contains("sink", "throwing"));
}

TEST(PluginLoaderTest, WrongAbiIsRefused) {
  Registry registry;
  PluginLoader loader(registry);
  fs::path path = test_plugin("wrong_abi");
  ASSERT_TRUE(fs::exists(path)) << path;
  std::string message = error_of([&] { loader.load_library(path); });
  EXPECT_HAS(message, path.string());
  EXPECT_HAS(message, "ABI");
  EXPECT_HAS(message, std::to_string(kAbiVersion));
  EXPECT_HAS(message, std::to_string(kAbiVersion + 1));
  EXPECT_FALSE(loader.is_loaded(path));
  EXPECT_TRUE(registry.list().empty());
}

TEST(PluginLoaderTest, WrongBuildTagIsRefused) {
  Registry registry;
  PluginLoader loader(registry);
  fs::path path = test_plugin("wrong_build_tag");
  std::string message = error_of([&] { loader.load_library(path); });
  EXPECT_HAS(message, path.string());
  EXPECT_HAS(message, "libtorch 1.13.1");
  EXPECT_HAS(message, kBuildTag);
  EXPECT_TRUE(registry.list().empty());
}

TEST(PluginLoaderTest, LibraryWithoutEntryPoint) {
  Registry registry;
  PluginLoader loader(registry);
  fs::path path = test_plugin("no_entry_point");
  std::string message = error_of([&] { loader.load_library(path); });
  EXPECT_HAS(message, path.string());
  EXPECT_HAS(message, "entry point");
}

TEST(PluginLoaderTest, ThrowingFactoryBecomesError) {
  Registry registry;
  PluginLoader loader(registry);
  fs::path path = test_plugin("throwing");
  ASSERT_NO_THROW(loader.load_library(path));
  ASSERT_TRUE(registry.contains("sink", "throwing"));
  EXPECT_EQ(registry.info("sink", "throwing").plugin, "throwing");
  std::string message =
      error_of([&] { registry.create<MetricsSink>("throwing", Config(), BuildContext{}); });
  EXPECT_HAS(message, "always throws");
  EXPECT_HAS(message, "throwing");
}

TEST(PluginLoaderTest, DuplicateNamesBothLibraries) {
  Registry registry;
  PluginLoader loader(registry);
  loader.load_folder(plugin_folder());
  std::string first = registry.info("model", "mlp").library_path;
  fs::path path = test_plugin("duplicate_mlp");
  std::string message = error_of([&] { loader.load_library(path); });
  EXPECT_HAS(message, "duplicate");
  EXPECT_HAS(message, "mlp");
  EXPECT_HAS(message, first);
  EXPECT_HAS(message, fs::weakly_canonical(path).string());
  EXPECT_EQ(registry.info("model", "mlp").library_path, first);
}

TEST(PluginLoaderTest, RelativePathIsRefused) {
  Registry registry;
  PluginLoader loader(registry);
  std::string message = error_of([&] { loader.load_library("libsomething.so"); });
  EXPECT_HAS(message, "absolute");
  EXPECT_HAS(message, "libsomething.so");
}

TEST(PluginLoaderTest, MissingFilesAndFolders) {
  Registry registry;
  PluginLoader loader(registry);
  testing::TempDir dir;
  EXPECT_HAS(error_of([&] { loader.load_library(dir / "libnone.so"); }), "libnone.so");
  EXPECT_HAS(error_of([&] { loader.load_folder(dir / "nowhere"); }), "nowhere");
  EXPECT_HAS(error_of([&] { loader.load_path(dir / "nothing"); }), "nothing");
  // A folder without libraries loads nothing.
  dir.write("readme.txt", "not a library");
  EXPECT_NO_THROW(loader.load_folder(dir.path()));
  EXPECT_TRUE(loader.loaded().empty());
  // A file that is not a shared library at all.
  fs::path fake = dir.write("libfake.so", "not an ELF file");
  EXPECT_HAS(error_of([&] { loader.load_library(fake); }), "libfake.so");
}

TEST(PluginLoaderTest, LoadingTwiceIsANoOp) {
  Registry registry;
  PluginLoader loader(registry);
  fs::path path = test_plugin("throwing");
  loader.load_library(path);
  ASSERT_EQ(loader.loaded().size(), 1u);
  EXPECT_NO_THROW(loader.load_library(path));
  // Through another spelling of the same file, and through load_path.
  EXPECT_NO_THROW(loader.load_library(test_plugin_folder() / "." / "libthrowing.so"));
  EXPECT_NO_THROW(loader.load_path(path));
  EXPECT_EQ(loader.loaded().size(), 1u);
  EXPECT_EQ(registry.names("sink"), (std::vector<std::string>{"throwing"}));
  // The whole bundled folder twice.
  loader.load_folder(plugin_folder());
  std::size_t count = loader.loaded().size();
  EXPECT_NO_THROW(loader.load_folder(plugin_folder()));
  EXPECT_EQ(loader.loaded().size(), count);
}

TEST(PluginLoaderTest, LoadPathTakesFilesAndFolders) {
  Registry registry;
  PluginLoader loader(registry);
  loader.load_path(test_plugin("throwing"));
  EXPECT_TRUE(registry.contains("sink", "throwing"));
  loader.load_path(plugin_folder());
  EXPECT_TRUE(registry.contains("model", "cnn"));
}

TEST(PluginLoaderTest, ObjectsOutliveRegistryAndLoader) {
  std::shared_ptr<MetricsSink> sink;
  {
    Registry registry;
    PluginLoader loader(registry);
    loader.load_folder(plugin_folder());
    auto table = std::make_shared<Table>();
    sink = registry.create<MetricsSink>("console", Config(table, "sinks.console"), BuildContext{});
  }
  ASSERT_NE(sink, nullptr);
  // The library is still loaded: calling into it works.
  sink->begin(RunInfo{});
  sink->end();
  sink.reset();
}

TEST(PluginLoaderTest, BundledFolderAndSearchPath) {
  EXPECT_EQ(bundled_plugin_folder("/opt/ty/bin/trainyard"), fs::path("/opt/ty/lib/trainyard/plugins"));
  auto paths = split_search_path("/a/b::relative/c:");
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_EQ(paths[0], fs::path("/a/b"));
  EXPECT_TRUE(paths[1].is_absolute());
  EXPECT_EQ(paths[1], fs::current_path() / "relative/c");
  EXPECT_TRUE(split_search_path("").empty());
}

TEST(PluginLoaderTest, RegistrationFailingHalfWayLeavesNothingRegistered) {
  Registry registry;
  PluginLoader loader(registry);
  fs::path path = test_plugin("partial_registration");
  ASSERT_TRUE(fs::exists(path)) << path;
  std::string message = error_of([&] { loader.load_library(path); });
  EXPECT_HAS(message, "fails after its first component");
  EXPECT_HAS(message, fs::weakly_canonical(path).string());
  EXPECT_FALSE(registry.contains("sink", "partial_first"));
  EXPECT_TRUE(registry.list().empty());
  EXPECT_FALSE(loader.is_loaded(path));
  // A good library loads afterwards as if nothing had happened.
  loader.load_library(test_plugin("throwing"));
  EXPECT_EQ(registry.names("sink"), (std::vector<std::string>{"throwing"}));
}

// Whether the library at `path` is loaded in this process (asked without loading it).
bool library_loaded(const fs::path& path) {
  void* handle = ::dlopen(fs::weakly_canonical(path).c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return false;
  ::dlclose(handle);
  return true;
}

TEST(PluginLoaderTest, PluginEventOutlivesBackendAndRegistry) {
  const fs::path path = test_plugin("event_device");
  std::shared_ptr<DeviceEvent> start, stop;
  {
    Registry registry;
    PluginLoader loader(registry);
    loader.load_library(path);
    auto backend = registry.create<DeviceBackend>("test_events", Config({}, "device"), BuildContext{});
    start = backend->create_event(0);
    stop = backend->create_event(0);
  }
  // The backend and the registry are gone; the events hold the library and their code runs.
  ASSERT_TRUE(library_loaded(path));
  start->record();
  stop->record();
  EXPECT_EQ(start->elapsed_ms(*stop), 1.0);
  start.reset();
  EXPECT_TRUE(library_loaded(path));
  stop.reset();
  EXPECT_FALSE(library_loaded(path)) << "the last event released the library";
}

TEST(PluginLoaderTest, DataSourceOutlivesDatasetAndRegistry) {
  const fs::path path = test_plugin("slow_dataset");
  std::shared_ptr<const MapSource> source;
  {
    Registry registry;
    PluginLoader loader(registry);
    loader.load_library(path);
    auto dataset = registry.create<Dataset>("test_slow", Config({}, "dataset"), BuildContext{});
    source = dataset->map_source("train");
    ASSERT_NE(source, nullptr);
  }
  ASSERT_TRUE(library_loaded(path));
  EXPECT_EQ(source->size(), 4096);
  EXPECT_EQ(source->get(3).at("target").item<std::int64_t>(), 3);
  source.reset();
  EXPECT_FALSE(library_loaded(path)) << "the last source released the library";
}

TEST(PluginLoaderTest, ModelBlocksOutliveModelAndRegistry) {
  const fs::path path = test_plugin("block_model");
  std::vector<Block> blocks;
  {
    Registry registry;
    PluginLoader loader(registry);
    loader.load_library(path);
    auto model = registry.create<Model>("test_blocks", Config({}, "model"), BuildContext{});
    blocks = held_blocks(*model);
  }
  // The model and the registry are gone; the block's module and forward hold the library.
  ASSERT_TRUE(library_loaded(path));
  ASSERT_EQ(blocks.size(), 1u);
  const at::Tensor output = blocks[0].forward(Activations(at::ones({3}))).hidden();
  EXPECT_TRUE(at::equal(output, at::full({3}, 2.0)));
  EXPECT_EQ(blocks[0].module->named_parameters().size(), 1u);
  blocks[0].forward = nullptr;
  EXPECT_TRUE(library_loaded(path)) << "the module still holds the library";
  blocks.clear();
  EXPECT_FALSE(library_loaded(path)) << "the last block released the library";
}

}  // namespace
}  // namespace trainyard
