#include "trainyard/parallel/declared_schedule.hpp"

#include <climits>
#include <cmath>
#include <fstream>
#include <iterator>
#include <sstream>
#include <system_error>

#include "trainyard/api/error.hpp"
#include "trainyard/support/files.hpp"
#include "trainyard/support/json_quote.hpp"
#include "trainyard/support/strict_json.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const fs::path& file, const std::string& message) {
  throw Error(file.string() + ": " + message);
}

int count_member(const nlohmann::json& root, const char* name, const fs::path& file) {
  const auto value = root.find(name);
  if (value == root.end()) fail(file, std::string("missing \"") + name + "\"");
  const bool whole = value->is_number() && value->get<double>() == std::floor(value->get<double>());
  if (!whole || value->get<double>() < 1 || value->get<double>() > INT_MAX) {
    fail(file, std::string("\"") + name + "\" must be an integer in [1, " +
                   std::to_string(INT_MAX) + "], got " + value->dump());
  }
  return static_cast<int>(value->get<double>());
}

}  // namespace

fs::path declared_schedule_file(const fs::path& output_dir) {
  return output_dir / "pipeline_schedule.json";
}

void write_declared_schedule(const fs::path& output_dir, const DeclaredSchedule& declared) {
  std::ostringstream text;
  text << "{\"schedule\":" << json_quote(declared.schedule) << ",\"ranks\":" << declared.shape.ranks
       << ",\"micro_batches\":" << declared.shape.micro_batches
       << ",\"virtual_stages\":" << declared.shape.virtual_stages << "}\n";
  write_file_whole(declared_schedule_file(output_dir), text.str(),
                   "the declared pipeline schedule");
}

std::optional<DeclaredSchedule> read_declared_schedule(const fs::path& run_dir) {
  const fs::path file = declared_schedule_file(run_dir);
  std::error_code error;
  if (!fs::exists(file, error)) return std::nullopt;
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(file, "cannot read the declared pipeline schedule");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const nlohmann::json root = parse_strict_json(text, file.string());
  if (!root.is_object()) fail(file, "expected a JSON object");
  const auto schedule = root.find("schedule");
  if (schedule == root.end() || !schedule->is_string() || schedule->get<std::string>().empty()) {
    fail(file, "\"schedule\" must be a non-empty string");
  }
  DeclaredSchedule declared;
  declared.schedule = schedule->get<std::string>();
  declared.shape.ranks = count_member(root, "ranks", file);
  declared.shape.micro_batches = count_member(root, "micro_batches", file);
  declared.shape.virtual_stages = count_member(root, "virtual_stages", file);
  return declared;
}

}  // namespace trainyard
