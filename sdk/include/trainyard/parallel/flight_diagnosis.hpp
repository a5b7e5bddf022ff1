#pragma once
// Reading the ranks' flight records (flight_recorder.hpp) back, and naming from them what went
// wrong: `trainyard diagnose DIR`. Collectives are matched across a group's ranks by their number
// on the group; a rank that never entered the collective the others wait in, or issued another
// one under the same number (a different operation, dtype, shape or step), is named with the
// operation, the group and the number.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "trainyard/parallel/flight_recorder.hpp"

namespace trainyard {

// One rank's dump.
struct FlightRecordFile {
  std::filesystem::path path;
  int rank = 0;
  int world_size = 1;
  std::string reason;          // why it was written ("SIGUSR2", the failure)
  std::int64_t dumped_us = 0;  // when
  std::int64_t step = 0;       // the optimizer step the rank was in
  std::vector<CollectiveRecord> records;
};

// Throws Error "<file>: ..." on a file that is not a flight record, or a truncated one.
FlightRecordFile read_flight_record(const std::filesystem::path& file);

// Every rank<k>.json in `folder`, or in its flight/ subfolder (a run's output folder), ordered
// by rank. Throws Error when there is none, or two files claim one rank.
std::vector<FlightRecordFile> read_flight_records(const std::filesystem::path& folder);

// What the records show, one finding per line, the likeliest cause first: a rank that wrote no
// record, never entered the collective its group waits in, or issued a different one; then the
// collectives ranks were waiting in. A line saying nothing was found when nothing was.
std::vector<std::string> diagnose_flight_records(const std::vector<FlightRecordFile>& dumps);

// "ranks 0-2, 5" / "rank 3".
std::string rank_set_text(const std::vector<int>& ranks);

}  // namespace trainyard
