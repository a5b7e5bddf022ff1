#include "trainyard/parallel/flight_diagnosis.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "trainyard/api/error.hpp"
#include "trainyard/support/strict_json.hpp"

namespace trainyard {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const json& member(const json& object, const char* name, const fs::path& file) {
  if (!object.is_object() || !object.contains(name)) {
    throw Error(file.string() + ": not a flight record: '" + name + "' is missing");
  }
  return object.at(name);
}

template <typename T>
T value_of(const json& object, const char* name, const fs::path& file) {
  try {
    return member(object, name, file).get<T>();
  } catch (const json::exception&) {
    throw Error(file.string() + ": not a flight record: '" + name + "' has the wrong type");
  }
}

CollectiveState state_named(const std::string& name, const fs::path& file) {
  if (name == "issued") return CollectiveState::kIssued;
  if (name == "completed") return CollectiveState::kCompleted;
  if (name == "failed") return CollectiveState::kFailed;
  throw Error(file.string() + ": not a flight record: unknown state '" + name + "'");
}

// Records of one group share one CollectiveGroup, as the recorder's do.
CollectiveRecord record_from(const json& item, const fs::path& file,
                             std::map<std::pair<std::string, std::vector<int>>,
                                      std::shared_ptr<const CollectiveGroup>>& groups) {
  CollectiveRecord record;
  record.id = value_of<std::int64_t>(item, "id", file);
  auto name = value_of<std::string>(item, "group", file);
  auto ranks = value_of<std::vector<int>>(item, "ranks", file);
  auto& group = groups[{name, ranks}];
  if (!group) group = std::make_shared<const CollectiveGroup>(CollectiveGroup{name, ranks});
  record.group = group;
  record.sequence = value_of<std::int64_t>(item, "sequence", file);
  record.operation = value_of<std::string>(item, "operation", file);
  record.dtype = value_of<std::string>(item, "dtype", file);
  record.shapes = value_of<std::vector<std::vector<std::int64_t>>>(item, "shapes", file);
  record.peer = value_of<int>(item, "peer", file);
  record.step = value_of<std::int64_t>(item, "step", file);
  record.issued_us = value_of<std::int64_t>(item, "issued_us", file);
  record.finished_us = value_of<std::int64_t>(item, "finished_us", file);
  record.state = state_named(value_of<std::string>(item, "state", file), file);
  return record;
}

bool finished(const CollectiveRecord& record) {
  return record.state == CollectiveState::kCompleted;
}

// What a collective is, apart from when: two ranks' records of one number must agree on it.
std::string signature(const CollectiveRecord& record) {
  std::string out = record.operation + " " + record.dtype;
  for (const auto& shape : record.shapes) {
    out += " [";
    for (std::size_t d = 0; d < shape.size(); ++d)
      out += (d ? ", " : "") + std::to_string(shape[d]);
    out += "]";
  }
  return out + ", step " + std::to_string(record.step);
}

std::string seconds_text(std::int64_t microseconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%.0f s", static_cast<double>(microseconds) / 1e6);
  return text;
}

std::string group_text(const CollectiveGroup& group) {
  std::string out = group.name + " [";
  for (std::size_t k = 0; k < group.ranks.size(); ++k) {
    out += (k ? "," : "") + std::to_string(group.ranks[k]);
  }
  return out + "]";
}

// A group's collectives as each dumped member recorded them: rank -> number -> record.
struct GroupView {
  std::shared_ptr<const CollectiveGroup> group;
  std::map<int, std::map<std::int64_t, const CollectiveRecord*>> by_rank;
};

using Dumps = std::map<int, const FlightRecordFile*>;

// The first number at which the members that recorded it disagree, as one finding per rank
// outside the largest agreeing set. Whether there was one.
bool find_disagreement(const GroupView& view, std::vector<std::string>& findings) {
  std::set<std::int64_t> numbers;
  for (const auto& [rank, records] : view.by_rank) {
    for (const auto& entry : records) numbers.insert(entry.first);
  }
  for (std::int64_t number : numbers) {
    std::map<std::string, std::vector<int>> classes;
    std::map<std::string, const CollectiveRecord*> example;
    for (const auto& [rank, records] : view.by_rank) {
      auto found = records.find(number);
      if (found == records.end()) continue;
      classes[signature(*found->second)].push_back(rank);
      example[signature(*found->second)] = found->second;
    }
    if (classes.size() < 2) continue;
    auto majority = std::max_element(
        classes.begin(), classes.end(),
        [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
    const CollectiveRecord& expected = *example[majority->first];
    for (const auto& [key, ranks] : classes) {
      if (key == majority->first) continue;
      const CollectiveRecord& other = *example[key];
      std::string line = rank_set_text(ranks) + " never entered " + expected.operation + " #" +
                         std::to_string(number) + " on group " + group_text(*view.group) + " as " +
                         rank_set_text(majority->second) + " did (" + signature(expected) + "); " +
                         (ranks.size() == 1 ? "its" : "their") + " #" + std::to_string(number) +
                         " is " + signature(other);
      if (other.step > expected.step) line += ": a collective was skipped before it";
      if (other.step < expected.step) line += ": an extra collective was issued before it";
      findings.push_back(line);
    }
    return true;
  }
  return false;
}

// The newest record of `dump`, as "its last op" in a finding.
std::string last_operation(const FlightRecordFile& dump) {
  if (dump.records.empty()) return "no operation recorded";
  const CollectiveRecord& last = dump.records.back();
  return last.describe() + ", " + collective_state_name(last.state);
}

// The lowest number some member has not finished: who waits in it, and who never entered it.
void find_waits(const GroupView& view, const Dumps& dumps, std::vector<std::string>& findings) {
  std::int64_t stuck = -1;
  for (const auto& [rank, records] : view.by_rank) {
    for (const auto& [number, record] : records) {
      if (!finished(*record) && (stuck < 0 || number < stuck)) stuck = number;
    }
  }
  if (stuck < 0) return;
  std::vector<int> waiting, behind, silent;
  const CollectiveRecord* waited = nullptr;
  std::int64_t longest = 0;
  for (int rank : view.group->ranks) {
    auto dump = dumps.find(rank);
    if (dump == dumps.end()) {
      silent.push_back(rank);
      continue;
    }
    auto records = view.by_rank.find(rank);
    if (records == view.by_rank.end() || records->second.rbegin()->first < stuck) {
      behind.push_back(rank);
      continue;
    }
    auto found = records->second.find(stuck);
    if (found == records->second.end() || finished(*found->second)) continue;
    waiting.push_back(rank);
    if (!waited) waited = found->second;  // the first waiting member's, as the others see it
    longest = std::max(longest, dump->second->dumped_us - found->second->issued_us);
  }
  if (!waited) return;
  const std::string what = waited->operation + " #" + std::to_string(stuck) + " on group " +
                           group_text(*view.group) + " (step " + std::to_string(waited->step) + ")";
  const bool failed = waited->state == CollectiveState::kFailed;
  const std::string waits =
      rank_set_text(waiting) +
      (failed ? std::string(" failed in it after ")
              : std::string(waiting.size() == 1 ? " waits" : " wait") + " in it since ") +
      seconds_text(longest);
  for (int rank : behind) {
    findings.push_back("rank " + std::to_string(rank) + " never entered " + what + "; " + waits +
                       "; rank " + std::to_string(rank) +
                       "'s last op: " + last_operation(*dumps.at(rank)));
  }
  for (int rank : silent) {
    findings.push_back("rank " + std::to_string(rank) +
                       " wrote no flight record (stopped, frozen or killed before it could) and "
                       "never finished " +
                       what + "; " + waits);
  }
  if (behind.empty() && silent.empty()) {
    findings.push_back("every rank of group " + group_text(*view.group) + " entered " + what +
                       "; " + waits);
  }
}

// Sends and receives left unfinished, oldest per rank: a pipeline waiting on its neighbour.
void find_point_to_point_waits(const Dumps& dumps, std::vector<std::string>& findings) {
  for (const auto& [rank, dump] : dumps) {
    for (const CollectiveRecord& record : dump->records) {
      if (!record.point_to_point() || finished(record)) continue;
      std::string line = "rank " + std::to_string(rank) + " waits in " + record.describe() +
                         " since " + seconds_text(dump->dumped_us - record.issued_us);
      if (record.group && record.peer >= 0 &&
          record.peer < static_cast<int>(record.group->ranks.size())) {
        const int peer = record.group->ranks[static_cast<std::size_t>(record.peer)];
        if (!dumps.count(peer))
          line += "; rank " + std::to_string(peer) + " wrote no flight record";
      }
      findings.push_back(line);
      break;
    }
  }
}

}  // namespace

std::string rank_set_text(const std::vector<int>& ranks) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  std::string out = sorted.size() == 1 ? "rank " : "ranks ";
  for (std::size_t k = 0; k < sorted.size();) {
    std::size_t end = k;
    while (end + 1 < sorted.size() && sorted[end + 1] == sorted[end] + 1) ++end;
    out += (k ? ", " : "") + std::to_string(sorted[k]);
    if (end >= k + 2) out += "-" + std::to_string(sorted[end]);
    if (end == k + 1) out += ", " + std::to_string(sorted[end]);
    k = end + 1;
  }
  return out;
}

FlightRecordFile read_flight_record(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(file.string() + ": cannot read the flight record");
  std::stringstream text;
  text << in.rdbuf();
  const json root = parse_strict_json(text.str(), file.string());
  if (value_of<std::string>(root, "format", file) != "trainyard-flight-record") {
    throw Error(file.string() + ": not a flight record (format is not trainyard-flight-record)");
  }
  FlightRecordFile out;
  out.path = file;
  out.rank = value_of<int>(root, "rank", file);
  out.world_size = value_of<int>(root, "world_size", file);
  out.reason = value_of<std::string>(root, "reason", file);
  out.dumped_us = value_of<std::int64_t>(root, "dumped_us", file);
  out.step = value_of<std::int64_t>(root, "step", file);
  if (out.rank < 0 || out.world_size < 1 || out.rank >= out.world_size) {
    throw Error(file.string() + ": not a flight record: rank " + std::to_string(out.rank) + " of " +
                std::to_string(out.world_size));
  }
  std::map<std::pair<std::string, std::vector<int>>, std::shared_ptr<const CollectiveGroup>> groups;
  const json& records = member(root, "records", file);
  if (!records.is_array()) throw Error(file.string() + ": not a flight record: records");
  for (const json& item : records) out.records.push_back(record_from(item, file, groups));
  return out;
}

std::vector<FlightRecordFile> read_flight_records(const fs::path& folder) {
  fs::path where = folder;
  if (fs::is_directory(folder / "flight")) where = folder / "flight";
  if (!fs::is_directory(where)) throw Error(folder.string() + ": no such folder");
  static const std::regex kName(R"(rank[0-9]+\.json)");
  std::vector<FlightRecordFile> out;
  std::set<int> ranks;
  for (const auto& entry : fs::directory_iterator(where)) {
    if (!std::regex_match(entry.path().filename().string(), kName)) continue;
    out.push_back(read_flight_record(entry.path()));
    if (!ranks.insert(out.back().rank).second) {
      throw Error(entry.path().string() + ": a second flight record of rank " +
                  std::to_string(out.back().rank));
    }
  }
  if (out.empty()) throw Error(where.string() + ": no flight records (rank<k>.json)");
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  return out;
}

std::vector<std::string> diagnose_flight_records(const std::vector<FlightRecordFile>& dumps) {
  Dumps by_rank;
  int world = 1;
  for (const auto& dump : dumps) {
    by_rank[dump.rank] = &dump;
    world = std::max(world, dump.world_size);
  }
  std::map<std::pair<std::string, std::vector<int>>, GroupView> groups;
  for (const auto& dump : dumps) {
    for (const CollectiveRecord& record : dump.records) {
      if (record.point_to_point() || !record.group) continue;
      GroupView& view = groups[{record.group->name, record.group->ranks}];
      view.group = record.group;
      view.by_rank[dump.rank][record.sequence] = &record;
    }
  }
  std::vector<std::string> findings;
  // A group whose members disagree on a number waits because of it: its waits say no more (the
  // members' records of that number are different collectives).
  std::set<const GroupView*> disagreeing;
  for (const auto& [key, view] : groups) {
    if (find_disagreement(view, findings)) disagreeing.insert(&view);
  }
  for (const auto& [key, view] : groups) {
    if (!disagreeing.count(&view)) find_waits(view, by_rank, findings);
  }
  find_point_to_point_waits(by_rank, findings);
  std::vector<int> silent;
  for (int rank = 0; rank < world; ++rank) {
    if (!by_rank.count(rank)) silent.push_back(rank);
  }
  if (findings.empty() && !silent.empty()) {
    findings.push_back(rank_set_text(silent) +
                       " wrote no flight record, and the others "
                       "finished every collective they recorded");
  }
  if (findings.empty()) {
    findings.push_back(
        "no collective was left unfinished and every group's ranks issued the "
        "same collectives: the cause lies outside the recorded collectives");
  }
  return findings;
}

}  // namespace trainyard
