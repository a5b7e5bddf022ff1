// Unit tests of trainyard/api/registry.hpp with components defined in the test.

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_support.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/config.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/metrics.hpp"
#include "trainyard/api/registry.hpp"

namespace trainyard {
namespace {

using testing::error_of;


// A sink that remembers what it was built with and counts live instances.
struct Recorder : MetricsSink {
  explicit Recorder(std::string prefix, int* live) : prefix(std::move(prefix)), live(live) {
    if (live) ++*live;
  }
  ~Recorder() override {
    if (live) --*live;
  }
  void write(const MetricRecord& record) override { records.push_back(record.phase); }
  std::string prefix;
  int* live;
  std::vector<std::string> records;
};

// A component of some other interface.
struct NotASink : Component {};

OptionSpecs recorder_options() { return {option("prefix", "p", "prefix of lines")}; }

void add_recorder(Registry& registry, const std::string& name, int* live = nullptr) {
  registry.add<MetricsSink>(name, recorder_options(), "records",
                            [live](const Config& options, const BuildContext&) {
                              return std::make_unique<Recorder>(options.get_string("prefix"), live);
                            });
}

Config section_with(const std::string& key, Value value) {
  auto table = std::make_shared<Table>();
  table->set(key, std::move(value));
  return Config(table, "sinks.test");
}

TEST(RegistryTest, AddAndCreate) {
  Registry registry;
  int live = 0;
  add_recorder(registry, "recorder", &live);
  EXPECT_TRUE(registry.contains("sink", "recorder"));
  EXPECT_FALSE(registry.contains("model", "recorder"));
  BuildContext context;
  auto sink = registry.create<MetricsSink>("recorder", Config(), context);
  ASSERT_NE(sink, nullptr);
  EXPECT_EQ(live, 1);
  auto* recorder = dynamic_cast<Recorder*>(sink.get());
  ASSERT_NE(recorder, nullptr);
  EXPECT_EQ(recorder->prefix, "p");  // the default
  sink->write(MetricRecord{"train", 1, 0, 0.0, {}});
  EXPECT_EQ(recorder->records, (std::vector<std::string>{"train"}));

  auto custom = registry.create<MetricsSink>("recorder", section_with("prefix", Value("q")),
                                             context);
  EXPECT_EQ(dynamic_cast<Recorder&>(*custom).prefix, "q");
  EXPECT_EQ(live, 2);
  sink.reset();
  custom.reset();
  EXPECT_EQ(live, 0);
}

TEST(RegistryTest, CreateValidatesOptions) {
  Registry registry;
  add_recorder(registry, "recorder");
  BuildContext context;
  std::string unknown = error_of(
      [&] { registry.create<MetricsSink>("recorder", section_with("prefx", Value("q")), context); });
  EXPECT_HAS(unknown, "unknown");
  EXPECT_HAS(unknown, "prefx");
  std::string wrong = error_of(
      [&] { registry.create<MetricsSink>("recorder", section_with("prefix", Value(3)), context); });
  EXPECT_HAS(wrong, "sinks.test.prefix");
  EXPECT_HAS(wrong, "string");
  // The plugin key belongs to the runtime and passes.
  EXPECT_NO_THROW(
      registry.create<MetricsSink>("recorder", section_with("plugin", Value("recorder")), context));
}

TEST(RegistryTest, DeclaredRangesAreCheckedBeforeTheFactoryRuns) {
  Registry registry;
  int built = 0;
  registry.add<MetricsSink>(
      "ranged", {option("every", 1, "interval").at_least(1), option("mode", "a", "m").one_of({"a", "b"})},
      "", [&built](const Config&, const BuildContext&) {
        ++built;
        return std::make_unique<Recorder>("", nullptr);
      });
  BuildContext context;
  EXPECT_EQ(error_of([&] {
              registry.create<MetricsSink>("ranged", section_with("every", Value(0)), context);
            }),
            "<recipe>: sinks.test.every must be >= 1, got 0");
  EXPECT_HAS(error_of([&] {
               registry.create<MetricsSink>("ranged", section_with("mode", Value("c")), context);
             }),
             "sinks.test.mode must be a or b, got \"c\"");
  EXPECT_EQ(built, 0);
  registry.create<MetricsSink>("ranged", section_with("every", Value(2)), context);
  EXPECT_EQ(built, 1);
}

TEST(RegistryTest, UnknownNameNamesThePlacesSearched) {
  Registry registry;
  registry.note_searched("/opt/trainyard/lib/trainyard/plugins");
  registry.note_searched("/home/me/plugins");
  registry.note_searched("/home/me/plugins");
  const std::string message = error_of([&] { registry.info("model", "resnet"); });
  EXPECT_HAS(message, "unknown model plugin 'resnet' (known: none loaded; searched: "
                      "/opt/trainyard/lib/trainyard/plugins, /home/me/plugins)");
  EXPECT_HAS(message, "--plugin-path");
}

TEST(RegistryTest, ResolveFillsDefaults) {
  Registry registry;
  add_recorder(registry, "recorder");
  Config resolved = registry.resolve("sink", "recorder", Config());
  EXPECT_EQ(resolved.get_string("prefix"), "p");
  EXPECT_THROW(registry.resolve("sink", "nope", Config()), Error);
  EXPECT_THROW(registry.resolve("sink", "recorder", section_with("x", Value(1))), Error);
}

TEST(RegistryTest, DuplicateNamesBothLibraries) {
  Registry registry;
  registry.begin_library(std::make_shared<int>(1), "/plugins/libfirst.so", "first", "1.0");
  add_recorder(registry, "recorder");
  registry.end_library();
  registry.begin_library(std::make_shared<int>(2), "/plugins/libsecond.so", "second", "2.0");
  std::string message = error_of([&] { add_recorder(registry, "recorder"); });
  registry.end_library();
  EXPECT_HAS(message, "duplicate");
  EXPECT_HAS(message, "sink");
  EXPECT_HAS(message, "recorder");
  EXPECT_HAS(message, "/plugins/libfirst.so");
  EXPECT_HAS(message, "/plugins/libsecond.so");
  // The first registration is untouched.
  EXPECT_EQ(registry.info("sink", "recorder").library_path, "/plugins/libfirst.so");

  // Components of the host (no library) clash too.
  Registry host;
  add_recorder(host, "x");
  EXPECT_HAS(error_of([&] { add_recorder(host, "x"); }), "duplicate");
  // The same name under another kind is a different component.
  EXPECT_NO_THROW(host.add_factory("model", "x", {}, "", [](const Config&, const BuildContext&) {
    return std::unique_ptr<Component>(new NotASink);
  }));
}

TEST(RegistryTest, LibraryRegistrationsTakeEffectTogether) {
  Registry registry;
  registry.begin_library(std::make_shared<int>(1), "/plugins/libhalf.so", "half", "1.0");
  add_recorder(registry, "staged");
  EXPECT_FALSE(registry.contains("sink", "staged")) << "visible before the library committed";
  // A second registration of the same name in the same library is a duplicate too.
  EXPECT_HAS(error_of([&] { add_recorder(registry, "staged"); }), "duplicate");
  registry.abandon_library();
  EXPECT_TRUE(registry.list().empty());

  registry.begin_library(std::make_shared<int>(2), "/plugins/libwhole.so", "whole", "1.0");
  add_recorder(registry, "staged");
  registry.end_library();
  EXPECT_EQ(registry.info("sink", "staged").library_path, "/plugins/libwhole.so");
}

TEST(RegistryTest, UnknownNameListsKnownOnes) {
  Registry registry;
  add_recorder(registry, "beta");
  add_recorder(registry, "alpha");
  BuildContext context;
  std::string message =
      error_of([&] { registry.create<MetricsSink>("gamma", Config(), context); });
  EXPECT_HAS(message, "unknown sink plugin 'gamma'");
  EXPECT_HAS(message, "alpha, beta");
  EXPECT_HAS(error_of([&] { registry.info("sink", "gamma"); }), "alpha");
  EXPECT_HAS(error_of([&] { registry.info("model", "gamma"); }), "none loaded");
}

TEST(RegistryTest, FactoryExceptionsBecomeErrors) {
  Registry registry;
  registry.begin_library(std::make_shared<int>(0), "/plugins/libbad.so", "bad", "0.1");
  registry.add<MetricsSink>("runtime", {}, "",
                            [](const Config&, const BuildContext&) -> std::unique_ptr<MetricsSink> {
                              throw std::runtime_error("disk on fire");
                            });
  registry.add<MetricsSink>("user", {}, "",
                            [](const Config&, const BuildContext&) -> std::unique_ptr<MetricsSink> {
                              throw Error("sinks.user.path must exist");
                            });
  registry.add<MetricsSink>("weird", {}, "",
                            [](const Config&, const BuildContext&) -> std::unique_ptr<MetricsSink> {
                              throw 42;
                            });
  registry.add<MetricsSink>("empty", {}, "",
                            [](const Config&, const BuildContext&) -> std::unique_ptr<MetricsSink> {
                              return nullptr;
                            });
  registry.end_library();
  BuildContext context;
  std::string runtime = error_of([&] { registry.create<MetricsSink>("runtime", Config(), context); });
  EXPECT_HAS(runtime, "'runtime'");
  EXPECT_HAS(runtime, "disk on fire");
  EXPECT_HAS(runtime, "/plugins/libbad.so");
  EXPECT_EQ(error_of([&] { registry.create<MetricsSink>("user", Config(), context); }),
            "sinks.user.path must exist");
  std::string weird = error_of([&] { registry.create<MetricsSink>("weird", Config(), context); });
  EXPECT_HAS(weird, "'weird'");
  EXPECT_HAS(weird, "unknown exception");
  std::string empty = error_of([&] { registry.create<MetricsSink>("empty", Config(), context); });
  EXPECT_HAS(empty, "'empty'");
  EXPECT_HAS(empty, "returned nothing");
}

TEST(RegistryTest, WrongInterfaceIsAnError) {
  Registry registry;
  registry.add_factory("sink", "impostor", {}, "", [](const Config&, const BuildContext&) {
    return std::unique_ptr<Component>(new NotASink);
  });
  BuildContext context;
  std::string message =
      error_of([&] { registry.create<MetricsSink>("impostor", Config(), context); });
  EXPECT_HAS(message, "impostor");
  EXPECT_HAS(message, "interface");
}

// A library handle whose release is observable.
std::shared_ptr<void> fake_library(bool* released) {
  return std::shared_ptr<void>(new int(0), [released](void* p) {
    *released = true;
    delete static_cast<int*>(p);
  });
}

TEST(RegistryTest, ObjectsKeepTheLibraryAlive) {
  bool released = false;
  int live = 0;
  std::shared_ptr<MetricsSink> sink;
  {
    Registry registry;
    registry.begin_library(fake_library(&released), "/plugins/libfake.so", "fake", "1.2.3");
    add_recorder(registry, "recorder", &live);
    registry.end_library();
    EXPECT_FALSE(released);
    const ComponentInfo& info = registry.info("sink", "recorder");
    EXPECT_EQ(info.plugin, "fake");
    EXPECT_EQ(info.plugin_version, "1.2.3");
    EXPECT_EQ(info.library_path, "/plugins/libfake.so");
    sink = registry.create<MetricsSink>("recorder", Config(), BuildContext{});
  }
  // The registry is gone; the object still holds the library.
  EXPECT_FALSE(released);
  EXPECT_EQ(live, 1);
  sink.reset();
  EXPECT_EQ(live, 0);
  EXPECT_TRUE(released);
}

TEST(RegistryTest, RegistryAloneHoldsTheLibrary) {
  bool released = false;
  {
    Registry registry;
    registry.begin_library(fake_library(&released), "/plugins/libfake.so", "fake", "1");
    add_recorder(registry, "recorder");
    registry.end_library();
    {
      auto sink = registry.create<MetricsSink>("recorder", Config(), BuildContext{});
    }
    EXPECT_FALSE(released);  // the object is gone, the registry still holds it
  }
  EXPECT_TRUE(released);
}

// The factory's code lives in its library: it must be destroyed before the library goes.
TEST(RegistryTest, FactoriesAreDestroyedBeforeTheirLibrary) {
  bool released = false;
  bool factory_destroyed = false;
  bool released_before_factory = false;
  struct Guard {
    bool* released;
    bool* destroyed;
    bool* too_late;
    ~Guard() {
      *destroyed = true;
      if (*released) *too_late = true;
    }
  };
  {
    Registry registry;
    registry.begin_library(fake_library(&released), "/plugins/libfake.so", "fake", "1");
    auto guard = std::make_shared<Guard>(Guard{&released, &factory_destroyed,
                                               &released_before_factory});
    registry.add<MetricsSink>("guarded", {}, "",
                              [guard](const Config&, const BuildContext&) {
                                return std::make_unique<Recorder>("g", nullptr);
                              });
    guard.reset();
    registry.end_library();
  }
  EXPECT_TRUE(factory_destroyed);
  EXPECT_TRUE(released);
  EXPECT_FALSE(released_before_factory);
}

TEST(RegistryTest, InfoListAndNames) {
  Registry registry;
  add_recorder(registry, "b");
  add_recorder(registry, "a");
  registry.add_factory("model", "m", {option("width", 4, "w")}, "a model",
                       [](const Config&, const BuildContext&) {
                         return std::unique_ptr<Component>(new NotASink);
                       });
  EXPECT_EQ(registry.names("sink"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(registry.names("model"), (std::vector<std::string>{"m"}));
  EXPECT_TRUE(registry.names("optimizer").empty());
  EXPECT_EQ(registry.list().size(), 3u);
  auto sinks = registry.list("sink");
  ASSERT_EQ(sinks.size(), 2u);
  EXPECT_EQ(sinks[0].name, "a");
  EXPECT_EQ(sinks[0].kind, "sink");
  EXPECT_EQ(sinks[0].help, "records");
  ASSERT_EQ(sinks[0].options.size(), 1u);
  EXPECT_EQ(sinks[0].options[0].name, "prefix");
  const ComponentInfo& model = registry.info("model", "m");
  EXPECT_EQ(model.help, "a model");
  EXPECT_TRUE(model.library_path.empty());
  EXPECT_TRUE(model.plugin.empty());
  EXPECT_TRUE(registry.list("scheduler").empty());
}

}  // namespace
}  // namespace trainyard
