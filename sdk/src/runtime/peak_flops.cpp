#include "trainyard/runtime/peak_flops.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <map>
#include <sstream>
#include <vector>

#include "trainyard/api/device.hpp"
#include "trainyard/runtime/dtype_name.hpp"

namespace fs = std::filesystem;

namespace trainyard {
namespace {

constexpr const char* kCacheHeader = "trainyard peak flops 1";
// Each timed repetition runs about this long: long enough that the clock's resolution and a
// scheduler hiccup are small against it, short enough that the whole probe takes about a second.
constexpr double kRepetitionMs = 50;
constexpr int kTimedRepetitions = 7;

std::string safe_for_file_name(const std::string& text) {
  std::string out;
  for (char c : text) {
    const bool plain = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-';
    out += plain ? c : '_';
  }
  return out;
}

std::string format_flops(double flops) {
  std::ostringstream out;
  out << std::setprecision(17) << flops;
  return out.str();
}

// The entry's figure, or the reason it cannot be used.
struct CacheEntry {
  std::optional<double> flops_per_s;
  std::string problem;
};

CacheEntry read_entry(const fs::path& file, const PeakProbeKey& key) {
  std::ifstream in(file);
  std::string header;
  if (!std::getline(in, header) || header != kCacheHeader) {
    return {std::nullopt, "it does not start with '" + std::string(kCacheHeader) + "'"};
  }
  std::map<std::string, std::string> fields;
  for (std::string line; std::getline(in, line);) {
    const auto equals = line.find(" = ");
    if (equals == std::string::npos)
      return {std::nullopt, "line '" + line + "' is not 'key = value'"};
    fields[line.substr(0, equals)] = line.substr(equals + 3);
  }
  const std::map<std::string, std::string> expected = {{"host", key.host},
                                                       {"device", key.device},
                                                       {"dtype", key.dtype},
                                                       {"threads", std::to_string(key.threads)}};
  for (const auto& [name, value] : expected) {
    auto it = fields.find(name);
    if (it == fields.end()) return {std::nullopt, "it has no " + name};
    if (it->second != value) {
      return {std::nullopt, "its " + name + " is '" + it->second + "', not '" + value + "'"};
    }
  }
  auto flops = fields.find("flops_per_s");
  if (flops == fields.end()) return {std::nullopt, "it has no flops_per_s"};
  char* end = nullptr;
  const double value = std::strtod(flops->second.c_str(), &end);
  if (flops->second.empty() || *end != '\0' || !std::isfinite(value) || value <= 0) {
    return {std::nullopt, "its flops_per_s '" + flops->second + "' is not a positive number"};
  }
  return {value, ""};
}

// Writes the entry beside its final name and renames it into place, so a reader sees the old
// entry or the whole new one, never a part. False when the folder cannot be written.
bool write_entry(const fs::path& file, const PeakProbeKey& key, double flops_per_s) {
  std::error_code error;
  fs::create_directories(file.parent_path(), error);
  const fs::path partial = file.string() + ".partial." + std::to_string(::getpid());
  {
    std::ofstream out(partial, std::ios::out | std::ios::trunc);
    out << kCacheHeader << "\nhost = " << key.host << "\ndevice = " << key.device
        << "\ndtype = " << key.dtype << "\nthreads = " << key.threads
        << "\nflops_per_s = " << format_flops(flops_per_s) << "\n";
    out.close();
    if (!out) {
      fs::remove(partial, error);
      return false;
    }
  }
  fs::rename(partial, file, error);
  if (error) fs::remove(partial, error);
  return !error;
}

}  // namespace

const char* peak_source_name(PeakSource source) {
  switch (source) {
    case PeakSource::Declared:
      return "declared";
    case PeakSource::Cached:
      return "cached";
    case PeakSource::Measured:
      return "measured";
  }
  return "?";
}

PeakProbeKey PeakProbeKey::of(const DeviceBackend& backend, int device_index,
                              c10::ScalarType dtype) {
  PeakProbeKey key;
  key.host = cache_host_name();
  key.device = backend.device(device_index).str() + " " + backend.device_name(device_index);
  key.dtype = dtype_name(dtype);
  key.threads = at::get_num_threads();
  return key;
}

fs::path PeakProbeKey::file_in(const fs::path& folder) const {
  return folder / (safe_for_file_name(host) + "__" + safe_for_file_name(device) + "__" + dtype +
                   "__" + std::to_string(threads) + "threads.txt");
}

std::string cache_host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  return name;
}

fs::path peak_cache_folder() {
  if (const char* cache = std::getenv("TRAINYARD_CACHE"); cache != nullptr && *cache != '\0') {
    return fs::path(cache) / "peak_flops";
  }
  const char* home = std::getenv("HOME");
  return fs::path(home != nullptr && *home != '\0' ? home : "/tmp") / ".cache" / "trainyard" /
         "peak_flops";
}

double measure_peak_flops(DeviceBackend& backend, int device_index, c10::ScalarType dtype) {
  const torch::Device device = backend.device(device_index);
  // Large enough to reach the device's dense-matmul rate.
  const std::int64_t size = device.is_cpu() ? 512 : 8192;
  const double flops_per_matmul = 2.0 * static_cast<double>(size * size * size);
  std::vector<double> rates;
  {
    at::NoGradGuard no_grad;
    // Deterministic values in [-1, 1]: no draw from the run's generators.
    at::Tensor a = at::linspace(-1.0, 1.0, size * size, at::TensorOptions(device))
                       .reshape({size, size})
                       .to(dtype);
    at::Tensor b = a.t().contiguous();
    at::Tensor c = at::mm(a, b);
    auto timed_ms = [&](int matmuls) {
      backend.synchronize(device_index);
      auto start = backend.create_event(device_index);
      auto end = backend.create_event(device_index);
      start->record();
      for (int i = 0; i < matmuls; ++i) at::mm_out(c, a, b);
      end->record();
      return start->elapsed_ms(*end);
    };
    // Warm-up (kernels, allocator, clocks) that also finds how many matmuls take a repetition.
    int matmuls = 1;
    double ms = timed_ms(matmuls);
    while (ms < kRepetitionMs / 2 && matmuls < (1 << 16)) {
      matmuls *= 2;
      ms = timed_ms(matmuls);
    }
    matmuls =
        std::max(1, static_cast<int>(std::lround(matmuls * kRepetitionMs / std::max(ms, 1e-3))));
    timed_ms(matmuls);
    for (int repetition = 0; repetition < kTimedRepetitions; ++repetition) {
      const double elapsed = timed_ms(matmuls);
      if (elapsed > 0) rates.push_back(flops_per_matmul * matmuls / (elapsed / 1000.0));
    }
  }
  backend.synchronize(device_index);
  backend.reset_peak_memory(device_index);
  if (rates.empty()) return 0;
  std::nth_element(rates.begin(), rates.begin() + static_cast<std::ptrdiff_t>(rates.size() / 2),
                   rates.end());
  return rates[rates.size() / 2];
}

PeakFlops cached_or_measured_peak(DeviceBackend& backend, int device_index, c10::ScalarType dtype,
                                  const fs::path& folder,
                                  const std::function<void(const std::string&)>& warn) {
  const PeakProbeKey key = PeakProbeKey::of(backend, device_index, dtype);
  PeakFlops peak;
  peak.dtype = dtype;
  peak.cache_file = key.file_in(folder);
  std::error_code error;
  if (fs::exists(peak.cache_file, error)) {
    const CacheEntry entry = read_entry(peak.cache_file, key);
    if (entry.flops_per_s) {
      peak.flops_per_s = *entry.flops_per_s;
      peak.source = PeakSource::Cached;
      return peak;
    }
    if (warn) {
      warn("trainyard: warning: ignoring the peak FLOP/s cache " + peak.cache_file.string() + ": " +
           entry.problem + "; measuring it again");
    }
  }
  peak.flops_per_s = measure_peak_flops(backend, device_index, dtype);
  peak.source = PeakSource::Measured;
  if (peak.flops_per_s > 0 && !write_entry(peak.cache_file, key, peak.flops_per_s)) {
    peak.cache_file.clear();
  }
  return peak;
}

double remeasure_cached_peak(DeviceBackend& backend, int device_index, const PeakFlops& stale) {
  if (stale.source != PeakSource::Cached || stale.cache_file.empty()) return 0;
  const PeakProbeKey key = PeakProbeKey::of(backend, device_index, stale.dtype);
  const double flops = measure_peak_flops(backend, device_index, stale.dtype);
  if (flops <= 0 || !write_entry(stale.cache_file, key, flops)) return 0;
  return flops;
}

PeakFlops resolve_peak_flops(double declared_tflops, DeviceBackend& backend, int device_index,
                             std::optional<c10::ScalarType> autocast_dtype, const fs::path& folder,
                             const std::function<void(const std::string&)>& warn) {
  if (declared_tflops > 0) {
    PeakFlops declared;
    declared.flops_per_s = declared_tflops * 1e12;
    declared.source = PeakSource::Declared;
    return declared;
  }
  std::vector<c10::ScalarType> dtypes = {c10::kFloat};
  const auto fast = backend.fast_compute_dtypes(device_index);
  if (autocast_dtype && *autocast_dtype != c10::kFloat &&
      std::find(fast.begin(), fast.end(), *autocast_dtype) != fast.end()) {
    dtypes.push_back(*autocast_dtype);
  }
  PeakFlops best;
  for (c10::ScalarType dtype : dtypes) {
    PeakFlops peak = cached_or_measured_peak(backend, device_index, dtype, folder, warn);
    if (peak.flops_per_s > best.flops_per_s) best = peak;
  }
  return best;
}

std::string describe_peak(const PeakFlops& peak) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(3) << peak.flops_per_s / 1e12 << " TFLOP/s ("
      << peak_source_name(peak.source);
  if (peak.source == PeakSource::Declared) {
    out << ": run.peak_tflops";
  } else {
    out << ", " << dtype_name(peak.dtype) << " matmul probe";
    if (!peak.cache_file.empty()) out << ", " << peak.cache_file.string();
  }
  out << ")";
  return out.str();
}

}  // namespace trainyard
