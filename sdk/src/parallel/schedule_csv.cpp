#include <algorithm>
#include <array>
#include <cctype>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "trainyard/api/error.hpp"
#include "trainyard/parallel/pipeline_schedule.hpp"

namespace trainyard {
namespace {

// torch.distributed.pipelining's spelling of each action kind.
constexpr std::array<std::pair<const char*, PipelineActionKind>, 8> kKindNames = {{
    {"SEND_F", PipelineActionKind::kSendActivation},
    {"RECV_F", PipelineActionKind::kReceiveActivation},
    {"SEND_B", PipelineActionKind::kSendGradient},
    {"RECV_B", PipelineActionKind::kReceiveGradient},
    {"F", PipelineActionKind::kForward},
    {"B", PipelineActionKind::kBackward},
    {"I", PipelineActionKind::kBackwardInput},
    {"W", PipelineActionKind::kBackwardWeight},
}};

const char* kind_name(PipelineActionKind kind) {
  for (const auto& [name, each] : kKindNames) {
    if (each == kind) return name;
  }
  return "?";
}

std::string trimmed(std::string_view text) {
  std::size_t begin = 0;
  std::size_t end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return std::string(text.substr(begin, end - begin));
}

// "12SEND_F3": digits, a kind, digits. Throws Error naming `where` when the entry does not read.
PipelineAction parse_action(const std::string& entry, const std::string& where) {
  std::size_t digits = 0;
  while (digits < entry.size() && std::isdigit(static_cast<unsigned char>(entry[digits]))) {
    ++digits;
  }
  std::size_t tail = entry.size();
  while (tail > digits && std::isdigit(static_cast<unsigned char>(entry[tail - 1]))) --tail;
  const std::string kind = entry.substr(digits, tail - digits);
  const auto known = std::find_if(kKindNames.begin(), kKindNames.end(),
                                  [&](const auto& each) { return kind == each.first; });
  if (digits == 0 || tail == entry.size() || known == kKindNames.end() || digits > 6 ||
      entry.size() - tail > 6) {
    throw Error(where + ": '" + entry +
                "' is not <stage><kind><micro-batch> with kind F, B, I, W, SEND_F, RECV_F, "
                "SEND_B or RECV_B (e.g. 0F1)");
  }
  return {known->second, std::stoi(entry.substr(0, digits)), std::stoi(entry.substr(tail))};
}

}  // namespace

PipelineSchedule parse_schedule_csv(std::string_view text, const std::string& name) {
  PipelineSchedule schedule;
  schedule.name = name;
  std::istringstream lines{std::string(text)};
  std::string line;
  int line_number = 0;
  int stages = 0;
  int micro_batches = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    const std::string content = trimmed(line);
    if (content.empty() || content.front() == '#') continue;
    std::vector<PipelineAction> actions;
    std::istringstream entries(content);
    std::string entry;
    while (std::getline(entries, entry, ',')) {
      const std::string where = name + ":" + std::to_string(line_number) + " (rank " +
                                std::to_string(schedule.rank_actions.size()) + ")";
      const PipelineAction action = parse_action(trimmed(entry), where);
      stages = std::max(stages, action.stage + 1);
      micro_batches = std::max(micro_batches, action.micro_batch + 1);
      actions.push_back(action);
    }
    schedule.rank_actions.push_back(std::move(actions));
  }
  const int ranks = static_cast<int>(schedule.rank_actions.size());
  if (ranks == 0) throw Error(name + ": no rank's actions (one line per rank)");
  if (stages % ranks != 0) {
    throw Error(name + ": " + std::to_string(stages) + " stages over " + std::to_string(ranks) +
                " ranks; each rank must hold as many stages");
  }
  schedule.shape = PipelineShape{ranks, micro_batches, stages / ranks};
  // The first action whose stage `shape` puts on another rank, if any.
  auto misplaced =
      [&](const PipelineShape& shape) -> std::optional<std::pair<int, PipelineAction>> {
    for (int rank = 0; rank < ranks; ++rank) {
      for (const PipelineAction& action : schedule.rank_actions[static_cast<std::size_t>(rank)]) {
        if (shape.rank_of_stage(action.stage) != rank) return std::make_pair(rank, action);
      }
    }
    return std::nullopt;
  };
  const auto looped = misplaced(schedule.shape);
  if (!looped) return schedule;
  PipelineShape v_shape = schedule.shape;
  v_shape.placement = StagePlacement::kV;
  if (!misplaced(v_shape)) {
    schedule.shape = v_shape;
    return schedule;
  }
  const auto& [rank, action] = *looped;
  throw Error(name + ": rank " + std::to_string(rank) + ", " + to_string(action) + ": stage " +
              std::to_string(action.stage) + " lives on rank " +
              std::to_string(schedule.shape.rank_of_stage(action.stage)) +
              " (stage s on rank s % " + std::to_string(ranks) +
              "), and the V placement does not hold the file's stages either");
}

PipelineSchedule read_schedule_file(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw Error("cannot read schedule file " + file.string());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_schedule_csv(text, file.string());
}

std::string format_schedule_csv(const PipelineSchedule& schedule) {
  std::ostringstream out;
  for (const auto& actions : schedule.rank_actions) {
    const char* separator = "";
    for (const PipelineAction& action : actions) {
      out << separator << action.stage << kind_name(action.kind) << action.micro_batch;
      separator = ",";
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace trainyard
