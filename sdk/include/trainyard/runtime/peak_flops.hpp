#pragma once
// The peak FLOP/s that model FLOPs utilisation is a fraction of: the recipe's declared figure, or
// a settled matmul probe measured once per machine, device, dtype and thread count and cached in
// a small file that later runs (and `trainyard doctor`) reuse, so every run divides by the same
// figure however busy the machine is when it starts.

#include <c10/core/ScalarType.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

namespace trainyard {

class DeviceBackend;

enum class PeakSource { Declared, Cached, Measured };
const char* peak_source_name(PeakSource source);  // "declared", "cached", "measured"

struct PeakFlops {
  double flops_per_s = 0;  // per device
  PeakSource source = PeakSource::Declared;
  c10::ScalarType dtype = c10::kFloat;  // what the probe computed in (fp32 when declared)
  std::filesystem::path cache_file;     // where the figure is kept; empty when declared
};

// What a probe's figure depends on, and so what its cache entry is keyed by.
struct PeakProbeKey {
  std::string host;    // the machine's host name
  std::string device;  // torch::Device::str() ("cpu", "<type>:0"), then the device's name
  std::string dtype;   // "float32", "bfloat16", "float16"
  int threads = 1;     // LibTorch's intra-op threads at the time of the probe

  static PeakProbeKey of(const DeviceBackend& backend, int device_index, c10::ScalarType dtype);
  // The entry's file in `folder`: the key, made safe for a file name.
  std::filesystem::path file_in(const std::filesystem::path& folder) const;
};

// This machine's host name, which the probes cached per machine are keyed by ("unknown-host"
// when it cannot be read).
std::string cache_host_name();

// Where probes are cached: $TRAINYARD_CACHE/peak_flops, else ~/.cache/trainyard/peak_flops.
std::filesystem::path peak_cache_folder();

// Dense matmul FLOP/s of device `device_index` in `dtype`: warm-up, then the median of several
// timed repetitions of about 50 ms each. Draws no random numbers (a run's random streams stay
// the same whether it probes or reads the cache) and resets the device's peak memory statistics
// afterwards, so the probe's matrices are not counted as the run's.
double measure_peak_flops(DeviceBackend& backend, int device_index, c10::ScalarType dtype);

// The cached figure for (this machine, device, dtype, threads) in `folder`; when the entry is
// missing, or unreadable (`warn` gets one line saying so), the probe is measured and its entry
// written atomically (temp file, then rename). A folder that cannot be written only costs the
// cache: the measured figure is still returned.
PeakFlops cached_or_measured_peak(DeviceBackend& backend, int device_index, c10::ScalarType dtype,
                                  const std::filesystem::path& folder,
                                  const std::function<void(const std::string&)>& warn);

// The run's peak: `declared_tflops` when above 0; otherwise the best cached-or-measured figure
// over the dtypes the run computes in that the device computes fast (float32, and the run's
// autocast dtype when the device declares it fast).
PeakFlops resolve_peak_flops(double declared_tflops, DeviceBackend& backend, int device_index,
                             std::optional<c10::ScalarType> autocast_dtype,
                             const std::filesystem::path& folder,
                             const std::function<void(const std::string&)>& warn);

// A cached peak that a run's model outran (mfu above 1) was measured while the machine was busy:
// measures the probe again and replaces the entry, for later runs. Returns the new figure (0 when
// it could not be measured or written).
double remeasure_cached_peak(DeviceBackend& backend, int device_index, const PeakFlops& stale);

// "0.184 TFLOP/s (cached, bfloat16 matmul probe, <file>)", for logs.
std::string describe_peak(const PeakFlops& peak);

}  // namespace trainyard
