#include "diagnose_command.hpp"

#include <iostream>

#include "cli.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/parallel/flight_diagnosis.hpp"

namespace po = boost::program_options;

namespace trainyard {
namespace {

constexpr const char* kDiagnoseUsage = R"(usage: trainyard diagnose DIR

DIR is a run's output folder (its flight/ folder is read) or a folder of flight records
(rank<k>.json), which each rank of a multi-process run writes when the launcher's watchdog finds
a hang, when a collective or a peer fails, or on SIGUSR2 ([comm] flight_recorder). Prints which
rank never entered, or entered a different, collective than its group, with the operation, the
group and the collective's number on it, and the collectives ranks wait in. Exits 1 when DIR holds
no readable flight record.)";

}  // namespace

int command_diagnose(const std::vector<std::string>& args) {
  std::string folder;
  po::options_description options("diagnose options");
  options.add_options()("dir", po::value(&folder)->required(), "the folder of flight records");
  po::positional_options_description positional;
  positional.add("dir", 1);
  auto values = parse(args, options, positional, kDiagnoseUsage);
  if (!values) return 0;
  const std::vector<FlightRecordFile> dumps = read_flight_records(folder);
  const int world = dumps.front().world_size;
  std::vector<int> ranks;
  for (const auto& dump : dumps) ranks.push_back(dump.rank);
  std::cout << "flight records of " << rank_set_text(ranks) << " of " << world << " in "
            << dumps.front().path.parent_path().string() << "\n";
  for (const auto& dump : dumps) {
    std::cout << "  rank " << dump.rank << ": step " << dump.step << ", " << dump.records.size()
              << " records, written on " << dump.reason << "\n";
  }
  for (const std::string& finding : diagnose_flight_records(dumps)) {
    std::cout << "diagnosis: " << finding << "\n";
  }
  return 0;
}

}  // namespace trainyard
