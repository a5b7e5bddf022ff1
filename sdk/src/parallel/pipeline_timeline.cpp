#include "trainyard/parallel/pipeline_timeline.hpp"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <string_view>
#include <system_error>
#include <utility>

#include "trainyard/api/error.hpp"
#include "trainyard/support/files.hpp"
#include "trainyard/support/json_quote.hpp"
#include "trainyard/support/strict_json.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr std::string_view kOneProcessName = "pipeline_timeline.json";
constexpr std::string_view kRankPrefix = "pipeline_timeline.rank";
constexpr std::string_view kSuffix = ".json";
constexpr int kActionKinds = 8;

[[noreturn]] void fail(const fs::path& file, const std::string& message) {
  throw Error(file.string() + ": " + message);
}

// The rank a file's name carries: -1 for pipeline_timeline.json, nullopt for other names.
std::optional<int> rank_of_name(const std::string& name) {
  if (name == kOneProcessName) return -1;
  if (name.size() <= kRankPrefix.size() + kSuffix.size() || !name.starts_with(kRankPrefix) ||
      !name.ends_with(kSuffix)) {
    return std::nullopt;
  }
  const std::string_view digits = std::string_view(name).substr(
      kRankPrefix.size(), name.size() - kRankPrefix.size() - kSuffix.size());
  int rank = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), rank);
  if (error != std::errc() || end != digits.data() + digits.size() || rank < 0) {
    return std::nullopt;
  }
  return rank;
}

// Shortest text that reads back to the same double, always with a fraction or exponent, so
// that times read as the floating-point numbers they are ("0.0", "412.5").
std::string json_time(double value, const fs::path& file) {
  if (!std::isfinite(value)) fail(file, "cannot write a time that is not finite");
  char text[64];
  const auto [end, error] = std::to_chars(text, text + sizeof text, value);
  std::string out(text, error == std::errc() ? end : text);
  if (out.find_first_of(".e") == std::string::npos) out += ".0";
  return out;
}

// Reads the members of one JSON object, naming `context` ("actions[3]") in errors.
class MemberReader {
 public:
  // Json::is_string, is_number, ...: the kind a member must have.
  using KindCheck = bool (Json::*)() const noexcept;

  MemberReader(const Json& object, const fs::path& file, std::string context)
      : object_(object), file_(file), context_(std::move(context)) {
    if (!object.is_object()) fail_here("expected a JSON object");
  }

  const Json& get(std::string_view name, KindCheck is_kind, const char* what) const {
    const auto value = object_.find(name);
    if (value == object_.end()) fail_here("missing \"" + std::string(name) + "\"");
    if (!((*value).*is_kind)()) fail_here("\"" + std::string(name) + "\" must be " + what);
    return *value;
  }

  std::string string(std::string_view name) const {
    return get(name, &Json::is_string, "a string").get<std::string>();
  }

  // An integer in [minimum, maximum].
  std::int64_t integer(std::string_view name, std::int64_t minimum,
                       std::int64_t maximum = INT_MAX) const {
    const Json& number = get(name, &Json::is_number, "a number");
    const auto value = number.get<double>();
    if (value != std::floor(value) || value < static_cast<double>(minimum) ||
        value > static_cast<double>(maximum)) {
      fail_here("\"" + std::string(name) + "\" must be an integer in [" + std::to_string(minimum) +
                ", " + std::to_string(maximum) + "], got " + number.dump());
    }
    return static_cast<std::int64_t>(value);
  }

  double number(std::string_view name) const {
    return get(name, &Json::is_number, "a number").get<double>();
  }

  [[noreturn]] void fail_here(const std::string& message) const {
    fail(file_, context_.empty() ? message : context_ + ": " + message);
  }

 private:
  const Json& object_;
  const fs::path& file_;
  std::string context_;
};

PipelineActionKind kind_named(const std::string& name, const MemberReader& reader) {
  for (int k = 0; k < kActionKinds; ++k) {
    const auto kind = static_cast<PipelineActionKind>(k);
    if (name == action_kind_name(kind)) return kind;
  }
  reader.fail_here("unknown action kind \"" + name + "\"");
}

std::string describe_step(const RankTimeline& t) {
  std::ostringstream out;
  out << "schedule '" << t.schedule << "', " << t.ranks << " ranks, " << t.micro_batches
      << " micro-batches, " << t.virtual_stages << " virtual stages, step " << t.step;
  return out.str();
}

}  // namespace

fs::path measured_timeline_file(const fs::path& output_dir, int rank, int world_size) {
  if (world_size <= 1) return output_dir / kOneProcessName;
  return output_dir / (std::string(kRankPrefix) + std::to_string(rank) + std::string(kSuffix));
}

std::vector<fs::path> measured_timeline_files(const fs::path& run_dir) {
  std::vector<std::pair<int, fs::path>> found;
  std::error_code error;
  for (fs::directory_iterator it(run_dir, error), end; !error && it != end; it.increment(error)) {
    if (auto rank = rank_of_name(it->path().filename().string())) {
      found.emplace_back(*rank, it->path());
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> files;
  for (auto& [rank, path] : found) files.push_back(std::move(path));
  return files;
}

void write_measured_timeline(const fs::path& file, const RankTimeline& timeline) {
  std::ostringstream out;
  out << "{\"schedule\":" << json_quote(timeline.schedule) << ",\"ranks\":" << timeline.ranks
      << ",\"micro_batches\":" << timeline.micro_batches
      << ",\"virtual_stages\":" << timeline.virtual_stages << ",\"step\":" << timeline.step
      << ",\"rank\":" << timeline.rank << ",\"pp_rank\":" << timeline.pp_rank
      << ",\"dp_rank\":" << timeline.dp_rank << ",\n \"actions\":[";
  for (std::size_t i = 0; i < timeline.actions.size(); ++i) {
    const MeasuredAction& measured = timeline.actions[i];
    // One action a line, aligned under the first.
    out << (i == 0 ? "" : ",\n            ") << "{\"kind\":\""
        << action_kind_name(measured.action.kind) << "\",\"stage\":" << measured.action.stage
        << ",\"micro_batch\":" << measured.action.micro_batch
        << ",\"start_us\":" << json_time(measured.start_us, file)
        << ",\"end_us\":" << json_time(measured.end_us, file) << "}";
  }
  out << "]}\n";

  write_file_whole(file, out.str(), "the pipeline timeline");
}

RankTimeline read_rank_timeline(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(file, "cannot read the pipeline timeline");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const Json root = parse_strict_json(text, file.string());

  const MemberReader top(root, file, "");
  RankTimeline t;
  t.schedule = top.string("schedule");
  t.ranks = static_cast<int>(top.integer("ranks", 1));
  t.micro_batches = static_cast<int>(top.integer("micro_batches", 1));
  t.virtual_stages = static_cast<int>(top.integer("virtual_stages", 1));
  t.step = top.integer("step", 0, std::numeric_limits<std::int64_t>::max() / 2);
  t.rank = static_cast<int>(top.integer("rank", 0));
  t.pp_rank = static_cast<int>(top.integer("pp_rank", 0, t.ranks - 1));
  t.dp_rank = static_cast<int>(top.integer("dp_rank", 0));
  const std::int64_t stages = static_cast<std::int64_t>(t.ranks) * t.virtual_stages;

  const Json& actions = top.get("actions", &Json::is_array, "an array");
  for (std::size_t i = 0; i < actions.size(); ++i) {
    const MemberReader item(actions[i], file, "actions[" + std::to_string(i) + "]");
    MeasuredAction measured;
    measured.action.kind = kind_named(item.string("kind"), item);
    measured.action.stage = static_cast<int>(item.integer("stage", 0, stages - 1));
    measured.action.micro_batch =
        static_cast<int>(item.integer("micro_batch", 0, t.micro_batches - 1));
    measured.start_us = item.number("start_us");
    measured.end_us = item.number("end_us");
    if (measured.start_us < 0 || measured.end_us < measured.start_us) {
      item.fail_here("needs 0 <= start_us <= end_us, got " + actions[i]["start_us"].dump() +
                     " and " + actions[i]["end_us"].dump());
    }
    t.actions.push_back(measured);
  }
  return t;
}

std::optional<MeasuredPipelineTimeline> read_measured_timeline(const fs::path& run_dir) {
  std::vector<std::pair<int, fs::path>> files;
  for (auto& file : measured_timeline_files(run_dir)) {
    files.emplace_back(*rank_of_name(file.filename().string()), std::move(file));
  }
  if (files.empty()) return std::nullopt;
  // Sorted: the one-process file (-1) first, then the rank files, which win when both exist.
  if (files.size() > 1 && files.front().first == -1) files.erase(files.begin());

  MeasuredPipelineTimeline out;
  std::optional<RankTimeline> first;
  fs::path first_file;
  std::vector<fs::path> file_of_pp_rank;
  for (const auto& [name_rank, file] : files) {
    RankTimeline t = read_rank_timeline(file);
    if (name_rank >= 0 && t.rank != name_rank) {
      fail(file, "holds the timeline of rank " + std::to_string(t.rank) +
                     ", but its name says rank " + std::to_string(name_rank));
    }
    if (t.dp_rank != 0) continue;
    if (!first) {
      first = t;
      first->actions.clear();
      first_file = file;
      out.schedule = t.schedule;
      out.ranks = t.ranks;
      out.micro_batches = t.micro_batches;
      out.virtual_stages = t.virtual_stages;
      out.step = t.step;
      out.rank_actions.resize(static_cast<std::size_t>(t.ranks));
      file_of_pp_rank.resize(static_cast<std::size_t>(t.ranks));
    } else if (t.schedule != first->schedule || t.ranks != first->ranks ||
               t.micro_batches != first->micro_batches ||
               t.virtual_stages != first->virtual_stages || t.step != first->step) {
      fail(file, describe_step(t) + " differs from " + first_file.filename().string() + "'s " +
                     describe_step(*first));
    }
    const auto pp_rank = static_cast<std::size_t>(t.pp_rank);
    if (!file_of_pp_rank[pp_rank].empty()) {
      fail(file, "pp rank " + std::to_string(t.pp_rank) + " of dp rank 0 is also in " +
                     file_of_pp_rank[pp_rank].filename().string());
    }
    file_of_pp_rank[pp_rank] = file;
    out.rank_actions[pp_rank] = std::move(t.actions);
  }
  if (!first) throw Error(run_dir.string() + ": no pipeline timeline file of dp rank 0");
  for (std::size_t pp_rank = 0; pp_rank < file_of_pp_rank.size(); ++pp_rank) {
    if (file_of_pp_rank[pp_rank].empty()) {
      throw Error(run_dir.string() + ": no pipeline timeline of pp rank " +
                  std::to_string(pp_rank) + " from dp rank 0 (the run has " +
                  std::to_string(out.ranks) + " pp ranks)");
    }
  }
  return out;
}

std::vector<double> measured_idle_shares(const MeasuredPipelineTimeline& timeline) {
  double first_start = std::numeric_limits<double>::infinity();
  double last_end = -first_start;
  std::vector<double> busy(timeline.rank_actions.size(), 0.0);
  for (std::size_t rank = 0; rank < timeline.rank_actions.size(); ++rank) {
    for (const auto& measured : timeline.rank_actions[rank]) {
      if (!is_compute(measured.action.kind)) continue;
      first_start = std::min(first_start, measured.start_us);
      last_end = std::max(last_end, measured.end_us);
      busy[rank] += measured.end_us - measured.start_us;
    }
  }
  const double makespan = last_end - first_start;
  std::vector<double> shares(busy.size(), 0.0);
  if (!(makespan > 0)) return shares;
  for (std::size_t rank = 0; rank < busy.size(); ++rank) shares[rank] = 1 - busy[rank] / makespan;
  return shares;
}

MeasuredCosts measured_costs(const MeasuredPipelineTimeline& timeline) {
  double sum[4] = {0, 0, 0, 0};
  int count[4] = {0, 0, 0, 0};
  for (const auto& actions : timeline.rank_actions) {
    for (const auto& measured : actions) {
      if (!is_compute(measured.action.kind)) continue;
      const auto k = static_cast<std::size_t>(measured.action.kind);
      sum[k] += measured.end_us - measured.start_us;
      ++count[k];
    }
  }
  MeasuredCosts out;
  const char* letters[] = {"F", "B", "I", "W"};
  auto mean = [&](PipelineActionKind kind) -> std::optional<int> {
    const auto k = static_cast<std::size_t>(kind);
    if (count[k] == 0) return std::nullopt;
    const int value = std::max(1, static_cast<int>(std::lround(sum[k] / count[k])));
    out.text +=
        (out.text.empty() ? "" : " ") + std::string(letters[k]) + "=" + std::to_string(value);
    return value;
  };
  out.costs.forward = mean(PipelineActionKind::kForward).value_or(1);
  out.costs.backward = mean(PipelineActionKind::kBackward);
  out.costs.backward_input = mean(PipelineActionKind::kBackwardInput).value_or(1);
  out.costs.backward_weight = mean(PipelineActionKind::kBackwardWeight).value_or(1);
  if (!out.text.empty()) out.text += " us";
  return out;
}

namespace {

std::string percent(double share) {
  std::ostringstream text;
  text.setf(std::ios::fixed);
  text.precision(1);
  text << 100 * share << "%";
  return text.str();
}

}  // namespace

std::string describe_idle_shares(const MeasuredPipelineTimeline& timeline) {
  const PipelineSchedule schedule = build_pipeline_schedule(
      timeline.schedule, {timeline.ranks, timeline.micro_batches, timeline.virtual_stages});
  const MeasuredCosts costs = measured_costs(timeline);
  const PipelineSimulation simulated = simulate_schedule(schedule, costs.costs);
  const IdleShareFormula formula = idle_share_formula(schedule, costs.costs);
  const std::vector<double> measured = measured_idle_shares(timeline);
  std::string text = "idle share at step " + std::to_string(timeline.step) +
                     " per pp rank, measured (simulated at " + costs.text + "):";
  for (std::size_t rank = 0; rank < measured.size(); ++rank) {
    text += (rank > 0 ? ", rank " : " rank ") + std::to_string(rank) + " " +
            percent(measured[rank]);
    if (rank < simulated.ranks.size()) text += " (" + percent(simulated.ranks[rank].idle_share()) + ")";
  }
  return text + "; formula " + formula.formula + (formula.upper_bound ? " at most " : " = ") +
         percent(formula.value);
}

}  // namespace trainyard
