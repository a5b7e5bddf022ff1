#include "doctor.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "cli.hpp"
#include "malloc_provider.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/communicator.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/api/device.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/support/libtorch_build.hpp"
#include "trainyard/runtime/default_plugins.hpp"
#include "trainyard/runtime/dtype_name.hpp"
#include "trainyard/runtime/peak_flops.hpp"
#include "trainyard/runtime/recipe.hpp"
#include "trainyard/api/version.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace trainyard {
namespace {

constexpr const char* kDoctorUsage = R"(usage: trainyard doctor [RECIPE] [options]

Checks LibTorch and its build, threads and BLAS, every plugin folder and plugin, every device
(with a tensor round trip, and its peak matmul FLOP/s in each dtype it computes fast: cached, or
measured and cached for runs to use), and with a RECIPE what it needs (plugins, device, dataset).
One line per check; exits 1 when something required is missing or broken.)";

// Prints checks and remembers whether any required one failed.
class Report {
 public:
  void ok(const std::string& what) { line("ok", what); }
  void info(const std::string& what) { line("info", what); }
  void fail(const std::string& what) {
    line("FAIL", what);
    failed_ = true;
  }
  bool failed() const { return failed_; }

 private:
  static void line(const char* status, const std::string& what) {
    std::cout << std::left << std::setw(6) << status << what << "\n";
  }
  bool failed_ = false;
};

std::string gib(std::int64_t bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / (1LL << 30) << " GiB";
  return out.str();
}

std::int64_t host_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::int64_t kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemTotal:") return kib * 1024;
    meminfo.ignore(256, '\n');
  }
  return 0;
}

void check_libtorch(Report& report) {
  const auto settings = libtorch_build_settings();
  std::string capability;
  const std::string config = at::show_config();
  if (auto at = config.find("CPU capability usage: "); at != std::string::npos) {
    capability = config.substr(at + 22, config.find('\n', at) - at - 22);
  }
  // What LibTorch says of each device and collective library comes from their plugins
  // (check_devices, check_comms).
  std::ostringstream line;
  line << "libtorch " << libtorch_build_setting("TORCH_VERSION") << " (BLAS "
       << libtorch_build_setting("BLAS_INFO") << ", CPU " << (capability.empty() ? "?" : capability)
       << ")";
  if (settings.empty()) {
    report.fail("libtorch: its build configuration could not be read");
  } else {
    report.ok(line.str());
  }
  report.ok(std::string("trainyard ") + kFrameworkVersion + " (" + kBuildTag + ", plugin ABI " +
            std::to_string(kAbiVersion) + ")");
  report.ok("threads: " + std::to_string(at::get_num_threads()) + " intra-op, " +
            std::to_string(at::get_num_interop_threads()) + " inter-op, " +
            std::to_string(std::thread::hardware_concurrency()) + " cores");
}

// Which malloc serves the run: the host links tcmalloc for step speed, and a preloaded allocator
// replaces it.
void check_malloc(Report& report) {
  const std::string provider = malloc_provider();
#ifdef TRAINYARD_LINKS_TCMALLOC
  if (provider.find("tcmalloc") != std::string::npos) {
    report.ok("malloc: " + provider + " (linked by the host)");
  } else {
    report.info("malloc: " + provider + " (preloaded in place of the host's tcmalloc)");
  }
#else
  report.info("malloc: " + provider + " (this host is built without tcmalloc)");
#endif
}

// Loads every library of every plugin place one by one, so one broken plugin is reported
// without hiding the others.
void check_plugins(Report& report, PluginLoader& loader, const CommonOptions& common) {
  std::vector<fs::path> places;
  if (!common.no_default_plugins) {
    places.push_back(bundled_plugin_folder(executable_path()));
    if (const char* env = std::getenv("TRAINYARD_PLUGIN_PATH")) {
      for (const auto& path : split_search_path(env)) places.push_back(path);
    }
  }
  for (const auto& path : common.plugin_paths) places.push_back(fs::absolute(path));
  if (places.empty()) report.fail("plugins: no plugin folder to load from");
  for (const auto& place : places) {
    std::vector<fs::path> libraries;
    std::error_code ec;
    if (fs::is_regular_file(place, ec)) {
      libraries.push_back(place);
    } else {
      try {
        libraries = plugin_libraries(place);
      } catch (const Error& error) {
        report.fail(error.what());
        continue;
      }
      if (libraries.empty()) {
        report.fail("plugin folder " + place.string() + " holds no plugin libraries");
        continue;
      }
      report.ok("plugin folder " + place.string() + ": " + std::to_string(libraries.size()) +
                " libraries");
    }
    for (const auto& library : libraries) {
      try {
        loader.load_library(library);
        const auto& loaded = loader.loaded().back();
        report.ok("plugin " + loaded.name + " " + loaded.version + " (" +
                  library.filename().string() + ")");
      } catch (const Error& error) {
        report.fail(error.what());
      }
    }
  }
}

// The peak a run on this device divides by (at this process's thread count), in every dtype the
// device computes fast: the cached figure, or a probe measured now and cached.
void check_peak_flops(Report& report, DeviceBackend& backend, int index) {
  const std::string device = backend.device(index).str();
  for (const c10::ScalarType dtype : backend.fast_compute_dtypes(index)) {
    const PeakFlops peak = cached_or_measured_peak(
        backend, index, dtype, peak_cache_folder(),
        [&](const std::string& warning) { report.info(warning); });
    const std::string line = "device " + device + " peak " + dtype_name(dtype) + ": " +
                             describe_peak(peak) + ", " + std::to_string(at::get_num_threads()) +
                             " threads";
    peak.flops_per_s > 0 ? report.ok(line) : report.fail(line);
  }
}

void check_devices(Report& report, const Registry& registry) {
  if (!registry.contains("device", default_plugins::kDevice)) {
    report.fail(std::string("device ") + default_plugins::kDevice +
                ": no plugin provides it, and recipes run on it unless [run] device names another");
  }
  for (const auto& name : registry.names("device")) {
    try {
      auto backend = registry.create<DeviceBackend>(name, Config({}, "device"), BuildContext{});
      for (const auto& line : backend->doctor_report()) report.ok("device " + name + ": " + line);
      if (!backend->available()) {
        report.info("device " + name + ": not available on this machine");
        continue;
      }
      for (int index = 0; index < backend->device_count(); ++index) {
        torch::Device device = backend->device(index);
        std::int64_t total = backend->memory(index).total_bytes;
        if (total == 0 && device.is_cpu()) total = host_memory_bytes();
        at::Tensor host = at::arange(4096, at::kFloat);
        at::Tensor back = (host.to(device) + 1).to(at::kCPU);
        backend->synchronize(index);
        const bool round_trip = at::equal(back, host + 1);
        const std::string line = "device " + device.str() + ": " + gib(total) +
                                 ", tensor round trip " + (round_trip ? "ok" : "WRONG VALUES");
        round_trip ? report.ok(line) : report.fail(line);
        check_peak_flops(report, *backend, index);
      }
    } catch (const std::exception& error) {
      report.fail("device " + name + ": " + error.what());
    }
  }
}

// What each communicator plugin reports of its collective library, and the devices it serves.
void check_comms(Report& report, const Registry& registry) {
  for (const auto& name : registry.names("comm")) {
    try {
      auto comm = registry.create<Communicator>(name, Config({}, "comm"), BuildContext{});
      for (const auto& line : comm->doctor_report()) report.ok("comm " + name + ": " + line);
      std::string types;
      for (const auto& type : comm->device_types()) types += (types.empty() ? "" : ", ") + type;
      report.info("comm " + name + " serves " + (types.empty() ? "no" : types) + " devices");
    } catch (const std::exception& error) {
      report.fail("comm " + name + ": " + error.what());
    }
  }
}

void check_recipe(Report& report, const fs::path& path, PluginLoader& loader,
                  Registry& registry) {
  Recipe resolved;
  try {
    Recipe recipe = load_recipe(path);
    for (const auto& place : recipe_plugin_paths(recipe)) loader.load_path(place);
    resolved = resolve_recipe(recipe, registry);
    report.ok("recipe " + path.string() + ": every plugin it names is loaded");
  } catch (const Error& error) {
    report.fail("recipe " + path.string() + ": " + error.what());
    return;
  }
  const std::string device = resolved.section("run").get_string("device");
  const std::string backend = device.substr(0, device.find(':'));
  if (backend != "auto") {
    bool available = false;
    try {
      available = registry.contains("device", backend) &&
                  registry.create<DeviceBackend>(backend, Config({}, "device"), BuildContext{})
                      ->available();
    } catch (const std::exception&) {
    }
    available ? report.ok("recipe device " + device + " is available")
              : report.fail("recipe device " + device + " is not available on this machine");
  }
  // What multi-process runs of the recipe hand their communication backend.
  if (resolved.has_section("comm")) {
    const Config comm = resolved.section("comm");
    std::string settings;
    for (const auto& [key, value] : comm.table().entries()) {
      settings += (settings.empty() ? "" : ", ") + key + " = " + value.to_toml();
    }
    report.info("recipe [comm]: " + settings);
  }
  try {
    Config section = resolved.section("dataset");
    BuildContext context;
    context.seed = static_cast<std::uint64_t>(resolved.section("run").get_int("seed"));
    context.recipe_dir = resolved.path.parent_path();
    auto dataset = registry.create<Dataset>(section.get_string("plugin"), section, context);
    std::string splits;
    for (const auto& split : dataset->splits()) splits += (splits.empty() ? "" : ", ") + split;
    report.ok("recipe dataset " + section.get_string("plugin") + " opens (splits: " + splits + ")");
  } catch (const std::exception& error) {
    report.fail("recipe dataset: " + std::string(error.what()));
  }
}

}  // namespace

int command_doctor(const std::vector<std::string>& args, Registry& registry) {
  CommonOptions common;
  std::string recipe;
  po::options_description options("doctor options");
  options.add_options()("recipe", po::value(&recipe), "also check what this recipe needs");
  add_common(options, common);
  po::positional_options_description positional;
  positional.add("recipe", 1);
  auto values = parse(args, options, positional, kDoctorUsage);
  if (!values) return 0;
  Report report;
  check_libtorch(report);
  check_malloc(report);
  PluginLoader loader(registry);
  check_plugins(report, loader, common);
  check_devices(report, registry);
  check_comms(report, registry);
  if (!recipe.empty()) check_recipe(report, recipe, loader, registry);
  if (report.failed()) {
    std::cout << "doctor: something a run needs is missing or broken (FAIL lines above)\n";
    return 1;
  }
  std::cout << "doctor: everything checked is in order\n";
  return 0;
}

}  // namespace trainyard
