// Metric records as TensorBoard event files: every figure of every record becomes a scalar
// tagged `<phase>/<name>` (train/loss, eval/accuracy, summary/wall_s) at the record's step.

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "event_file.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/metrics.hpp"
#include "trainyard/api/plugin.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// TensorBoard reads every file whose name holds "tfevents"; the time, host and process make the
// name unique when runs share a folder (a resumed run adds a file beside the first one's).
std::string event_file_name() {
  return "events.out.tfevents." +
         std::to_string(static_cast<long long>(tensorboard::wall_time_now())) + "." + host_name() +
         "." + std::to_string(::getpid());
}

class TensorBoard final : public MetricsSink {
 public:
  explicit TensorBoard(const Config& options)
      : folder_(options.get_string("dir").empty() ? fs::path() : options.get_path("dir")),
        all_ranks_(options.get_bool("all_ranks")) {}

  void begin(const RunInfo& run) override {
    if (run.rank != 0 && !all_ranks_) return;
    fs::path folder = folder_.empty() ? fs::path(run.output_dir) / "tensorboard" : folder_;
    // With several ranks writing, each gets its own folder: TensorBoard shows them as runs
    // named rank0, rank1, ... side by side.
    if (all_ranks_ && run.world_size > 1) folder /= "rank" + std::to_string(run.rank);
    try {
      fs::create_directories(folder);
      file_ = std::make_unique<tensorboard::EventFile>(folder / event_file_name());
    } catch (const std::exception& error) {
      throw Error(std::string("tensorboard sink: ") + error.what());
    }
  }

  void write(const MetricRecord& record) override {
    if (!file_) return;
    std::vector<std::pair<std::string, float>> scalars;
    scalars.reserve(record.values.size() + 2);
    const std::string prefix = record.phase + "/";
    scalars.emplace_back(prefix + "epoch", static_cast<float>(record.epoch));
    scalars.emplace_back(prefix + "elapsed_s", static_cast<float>(record.elapsed_s));
    for (const auto& [name, value] : record.values) {
      scalars.emplace_back(prefix + name, static_cast<float>(value));
    }
    try {
      file_->append_scalars(record.step, tensorboard::wall_time_now(), scalars);
    } catch (const std::exception& error) {
      throw Error(std::string("tensorboard sink: ") + error.what());
    }
  }

  void end() override { file_.reset(); }

 private:
  fs::path folder_;
  bool all_ranks_;
  std::unique_ptr<tensorboard::EventFile> file_;  // null on ranks that do not write
};

void register_components(Registry& registry) {
  registry.add<MetricsSink>(
      "tensorboard",
      {option("dir", "",
              "folder of the event files (default: <output_dir>/tensorboard; with all_ranks and "
              "several ranks, one sub-folder rank<R> per rank)"),
       option("all_ranks", false, "write an event file on every rank (default: rank 0 only)")},
      "metric records as TensorBoard scalars, tagged <phase>/<name>",
      [](const Config& options, const BuildContext&) {
        return std::make_unique<TensorBoard>(options);
      });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("tensorboard", "1.0.0", trainyard::register_components)
