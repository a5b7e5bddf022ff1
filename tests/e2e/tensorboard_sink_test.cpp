// The tensorboard sink against TensorBoard's own reader: every figure of a real run's jsonl
// metrics is in the event files at its step, and a run killed with SIGKILL leaves files that
// read cleanly up to the last logging interval.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "metrics_file.hpp"
#include "test_support.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/metrics.hpp"
#include "trainyard/api/registry.hpp"
#include "venv_python.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

// Prints "tag<TAB>step<TAB>value" for every scalar of every event file under argv[1], after
// checking each file's framing record by record (lengths, masked CRCs, no trailing bytes) and
// that it starts with the file-version event.
constexpr const char* kReadEvents = R"(
import glob, os, struct, sys
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.util import tensor_util
files = sorted(glob.glob(os.path.join(sys.argv[1], '**', '*tfevents*'), recursive=True))
if not files: sys.exit('no event files under ' + sys.argv[1])
for path in files:
    data = open(path, 'rb').read()
    at = 0
    while at < len(data):
        header = data[at:at + 8]
        (length,) = struct.unpack('<Q', header)
        (length_crc,) = struct.unpack('<I', data[at + 8:at + 12])
        assert length_crc == masked_crc32c(header), 'length crc at %d of %s' % (at, path)
        body = data[at + 12:at + 12 + length]
        (body_crc,) = struct.unpack('<I', data[at + 12 + length:at + 16 + length])
        assert body_crc == masked_crc32c(body), 'data crc at %d of %s' % (at, path)
        if at == 0: assert event_pb2.Event.FromString(body).file_version == 'brain.Event:2'
        at += 16 + length
    assert at == len(data), 'trailing bytes in ' + path
    # TensorBoard's loader turns simple_value scalars into scalar tensors, as its UI reads them.
    for event in EventFileLoader(path).Load():
        for value in event.summary.value:
            assert value.metadata.plugin_data.plugin_name == 'scalars', value
            scalar = tensor_util.make_ndarray(value.tensor).item()
            print('%s\t%d\t%r' % (value.tag, event.step, scalar))
)";

struct Scalar {
  std::string tag;
  std::int64_t step;
  double value;
};

std::vector<Scalar> read_event_scalars(const fs::path& folder) {
  auto result = run_venv_python(kReadEvents, {folder.string()});
  EXPECT_EQ(result.exit_code, 0) << describe(result);
  std::vector<Scalar> out;
  std::istringstream lines(result.out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    Scalar scalar;
    std::string value;
    std::getline(fields, scalar.tag, '\t');
    fields >> scalar.step >> value;
    scalar.value = std::stod(value);
    out.push_back(scalar);
  }
  return out;
}

fs::path write_recipe(const TempDir& dir, int max_steps, int log_every) {
  return dir.write("watched.toml",
                   "extends = \"" + (source_dir() / "recipes/fashion_mnist_mlp.toml").string() +
                       "\"\n[run]\nmax_steps = " + std::to_string(max_steps) + "\nlog_every = " +
                       std::to_string(log_every) + "\neval_max_batches = 5\noutput_dir = \"" +
                       (dir / "out").string() + "\"\n[sinks.tensorboard]\n");
}

// The scalars the jsonl sink wrote, as (tag, step) -> value; null (non-finite) figures are left
// out, as the jsonl file has no value to compare with.
std::map<std::pair<std::string, std::int64_t>, double> jsonl_scalars(const fs::path& file) {
  std::map<std::pair<std::string, std::int64_t>, double> out;
  for (const auto& line : read_metrics(file)) {
    const auto step = static_cast<std::int64_t>(line.at("step"));
    for (const auto& [name, value] : line.values) {
      if (name == "step" || name == "rank") continue;
      out[{line.phase + "/" + name, step}] = value;
    }
  }
  return out;
}

TEST(TensorBoardSinkTest, EveryJsonlFigureIsAScalarAtItsStep) {
  TempDir dir;
  auto result = run_host({"run", write_recipe(dir, 40, 10).string()});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto expected = jsonl_scalars(dir / "out" / "metrics.jsonl");
  ASSERT_GT(expected.count({"eval/accuracy", 40}), 0u) << "the run evaluates at its end";
  ASSERT_GT(expected.count({"summary/wall_s", 40}), 0u);
  ASSERT_GT(expected.count({"train/loss", 10}), 0u);

  std::map<std::pair<std::string, std::int64_t>, double> events;
  for (const auto& scalar : read_event_scalars(dir / "out" / "tensorboard")) {
    events[{scalar.tag, scalar.step}] = scalar.value;
  }
  for (const auto& [key, value] : expected) {
    auto it = events.find(key);
    ASSERT_NE(it, events.end()) << key.first << " at step " << key.second;
    EXPECT_EQ(it->second, static_cast<double>(static_cast<float>(value)))
        << key.first << " at step " << key.second;
  }
  EXPECT_EQ(events.size(), expected.size()) << "no scalar the jsonl file lacks";
}

TEST(TensorBoardSinkTest, KilledRunLeavesReadableEventFiles) {
  TempDir dir;
  const fs::path jsonl = dir / "out" / "metrics.jsonl";
  auto three_intervals_written = [&] {
    std::error_code ec;
    if (!fs::exists(jsonl, ec)) return false;
    return of_phase(read_metrics(jsonl), "train").size() >= 3;
  };
  auto result = run_command({host_binary().string(), "run", write_recipe(dir, 5000, 5).string()},
                            source_dir(), 300, {}, three_intervals_written);
  ASSERT_TRUE(result.killed) << describe(result);

  std::vector<std::int64_t> event_steps;
  for (const auto& scalar : read_event_scalars(dir / "out" / "tensorboard")) {
    if (scalar.tag == "train/loss") event_steps.push_back(scalar.step);
  }
  std::vector<std::int64_t> jsonl_steps;
  for (const auto& line : of_phase(read_metrics(jsonl), "train")) {
    jsonl_steps.push_back(static_cast<std::int64_t>(line.at("step")));
  }
  // The kill lands between two sinks' writes at worst: the event file holds the same logging
  // intervals as the jsonl file, give or take the last one.
  ASSERT_GE(event_steps.size(), 2u);
  ASSERT_LE(event_steps.size(), jsonl_steps.size() + 1);
  ASSERT_GE(event_steps.size() + 1, jsonl_steps.size());
  for (std::size_t i = 0; i < std::min(event_steps.size(), jsonl_steps.size()); ++i) {
    EXPECT_EQ(event_steps[i], jsonl_steps[i]);
  }
}

// The event files each rank of a two-rank run writes with these options.
std::vector<fs::path> event_files_of_two_ranks(const TempDir& dir, bool all_ranks) {
  Registry* registry = &bundled_registry();
  for (int rank = 0; rank < 2; ++rank) {
    auto table = std::make_shared<Table>();
    table->set("all_ranks", Value(all_ranks));
    auto sink = registry->create<MetricsSink>("tensorboard", Config(table, "sinks.tensorboard"),
                                              BuildContext{});
    RunInfo run;
    run.name = "ranks";
    run.rank = rank;
    run.world_size = 2;
    run.output_dir = dir.path().string();
    sink->begin(run);
    MetricRecord record;
    record.phase = "train";
    record.step = 1;
    record.values = {{"loss", 1.0}};
    sink->write(record);
    sink->end();
  }
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir.path())) {
    if (entry.is_regular_file()) files.push_back(fs::relative(entry.path(), dir.path()));
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(TensorBoardSinkTest, RankZeroWritesByDefaultEveryRankInItsFolderWhenAsked) {
  TempDir only_first;
  const auto first = event_files_of_two_ranks(only_first, false);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].parent_path(), "tensorboard");
  EXPECT_EQ(first[0].filename().string().rfind("events.out.tfevents.", 0), 0u) << first[0];

  TempDir every;
  const auto all = event_files_of_two_ranks(every, true);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].parent_path(), fs::path("tensorboard") / "rank0");
  EXPECT_EQ(all[1].parent_path(), fs::path("tensorboard") / "rank1");
  // TensorBoard reads both, one run per rank folder.
  EXPECT_EQ(read_event_scalars(every / "tensorboard").size(), 2u * 3u);
}

}  // namespace
}  // namespace trainyard::testing
