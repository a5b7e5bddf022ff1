#include "compare_baseline.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "compare_format.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/support/strict_json.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "trainyard-compare-baseline";
constexpr int kVersion = 1;

nlohmann::json variant_json(const VariantResult& v) {
  nlohmann::json losses = nlohmann::json::array();
  for (const auto& point : v.train_loss) losses.push_back({point.step, point.loss});
  return {{"label", v.label},
          {"compute_dtype", v.compute_dtype},
          {"step_times_ms", v.step_times},
          {"train_loss", losses}};
}

const nlohmann::json& member(const nlohmann::json& object, const char* name,
                             const std::string& origin) {
  if (!object.is_object() || !object.contains(name)) {
    throw Error(origin + ": not a compare baseline (no '" + name + "')");
  }
  return object.at(name);
}

BaselineVariant read_variant(const nlohmann::json& json, const std::string& origin) {
  BaselineVariant v;
  try {
    v.label = member(json, "label", origin).get<std::string>();
    v.compute_dtype = member(json, "compute_dtype", origin).get<std::string>();
    v.step_times = member(json, "step_times_ms", origin).get<RunStepTimes>();
    for (const auto& point : member(json, "train_loss", origin)) {
      v.train_loss.push_back({point.at(0).get<std::int64_t>(), point.at(1).get<double>()});
    }
  } catch (const nlohmann::json::exception& error) {
    throw Error(origin + ": a variant does not read: " + error.what());
  }
  return v;
}

// Whether the run's losses equal the baseline's at every step both logged, else the first step
// that differs.
std::string loss_difference(const BaselineVariant& base, const VariantResult& run) {
  std::map<std::int64_t, double> kept;
  for (const auto& point : base.train_loss) kept[point.step] = point.loss;
  std::size_t shared = 0;
  for (const auto& point : run.train_loss) {
    auto it = kept.find(point.step);
    if (it == kept.end()) continue;
    ++shared;
    if (!losses_match(it->second, point.loss, base.compute_dtype, run.compute_dtype)) {
      return "loss " + significant(point.loss, 7) + " at step " + std::to_string(point.step) +
             ", baseline " + significant(it->second, 7);
    }
  }
  return shared == 0 ? "no step logged by both" : "";
}

}  // namespace

void save_baseline(const fs::path& file, const CompareReport& report) {
  nlohmann::json variants = nlohmann::json::array();
  for (const auto& v : report.variants) {
    if (v.succeeded) variants.push_back(variant_json(v));
  }
  const nlohmann::json json = {{"format", kFormat},
                               {"version", kVersion},
                               {"title", report.title},
                               {"command", report.command_line},
                               {"variants", variants}};
  const fs::path staging = file.string() + ".partial";
  {
    std::ofstream out(staging, std::ios::trunc);
    out << json.dump(1) << "\n";
    out.close();
    if (!out) throw Error("compare: cannot write " + staging.string());
  }
  std::error_code error;
  fs::rename(staging, file, error);
  if (error) throw Error("compare: cannot write " + file.string() + ": " + error.message());
}

Baseline load_baseline(const fs::path& file) {
  const std::string origin = "compare: baseline " + file.string();
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(origin + ": cannot read it: " + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json json = parse_strict_json(text.str(), origin);
  if (!json.is_object() || json.value("format", std::string()) != kFormat) {
    throw Error(origin + ": not a compare baseline (its format is not '" + kFormat + "')");
  }
  if (json.value("version", 0) != kVersion) {
    throw Error(origin + ": version " + json.value("version", nlohmann::json()).dump() +
                ", this trainyard reads version " + std::to_string(kVersion));
  }
  Baseline baseline;
  const nlohmann::json& title = member(json, "title", origin);
  if (!title.is_string()) throw Error(origin + ": 'title' is not a string");
  baseline.title = title.get<std::string>();
  const nlohmann::json& variants = member(json, "variants", origin);
  if (!variants.is_array()) throw Error(origin + ": 'variants' is not a list");
  for (const auto& variant : variants) baseline.variants.push_back(read_variant(variant, origin));
  return baseline;
}

void check_baseline_fits(const Baseline& baseline, const fs::path& file, const std::string& title,
                         const std::vector<std::string>& labels) {
  const std::string origin = "compare: --against " + file.string();
  if (baseline.title != title) {
    throw Error(origin + ": the baseline compares '" + baseline.title + "', this compare runs '" +
                title + "'");
  }
  for (const auto& label : labels) {
    bool found = false;
    for (const auto& v : baseline.variants) found = found || v.label == label;
    if (!found) throw Error(origin + ": the baseline has no variant '" + label + "'");
  }
}

BaselineCheck check_against_baseline(const Baseline& baseline,
                                     const std::vector<VariantResult>& results,
                                     const BootstrapSettings& settings) {
  BaselineCheck check;
  std::ostringstream text;
  for (const auto& run : results) {
    const BaselineVariant* base = nullptr;
    for (const auto& v : baseline.variants) {
      if (v.label == run.label) base = &v;
    }
    text << "  " << run.label << ": ";
    if (!base) {
      text << "not in the baseline\n";
      continue;
    }
    if (!run.succeeded) {
      check.regressed = true;
      text << "FAILED (" << run.error << ")\n";
      continue;
    }
    const SpeedComparison speed = compare_speed(base->step_times, run.step_times, settings);
    const std::string numerics = loss_difference(*base, run);
    const bool slower = speed.verdict == SpeedComparison::Verdict::kSlower;
    check.regressed = check.regressed || slower || !numerics.empty();
    text << describe_verdict(speed) << "; "
         << (numerics.empty() ? "losses the same" : "losses differ: " + numerics)
         << (slower || !numerics.empty() ? "  REGRESSION" : "") << "\n";
  }
  check.text = text.str();
  return check;
}

}  // namespace trainyard
