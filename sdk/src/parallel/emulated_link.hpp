#pragma once
// A slower network than the machine's, for benchmarks and tests of what communication costs
// ([comm] emulated_bandwidth_mb_s): each collective a rank issues occupies its link, one after
// another, for the time its bytes would take to cross at that bandwidth, and waiting for it
// returns no earlier than that. Work that overlaps computation hides the time as it would on a
// real link.

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace trainyard {

class EmulatedLink {
 public:
  explicit EmulatedLink(double bytes_per_second) : bytes_per_second_(bytes_per_second) {}

  // `work` of `operation` over `bytes` of input on a group of `ranks`, waiting as its bytes on
  // the wire (a ring algorithm's share for all-reduces and gathers) would over this link.
  c10::intrusive_ptr<c10d::Work> pace(const std::string& operation, std::int64_t bytes, int ranks,
                                      c10::intrusive_ptr<c10d::Work> work);

  // The bytes one rank sends for `operation` over `bytes` of input on `ranks` ranks.
  static double wire_bytes(const std::string& operation, std::int64_t bytes, int ranks);

 private:
  using Clock = std::chrono::steady_clock;
  double bytes_per_second_;
  std::mutex mutex_;
  Clock::time_point free_at_{};
};

}  // namespace trainyard
