// The image_folder dataset in real runs: a folder of PNG and JPEG files in class subfolders,
// augmented at random by [dataset.transforms], trains the mlp with the same batches for 0, 1 and
// 4 workers; a truncated JPEG, a PNG with a bad CRC, a zero-byte file and an empty class folder
// are each refused at the start naming their paths, or (dataset.on_bad_sample = "skip") the
// files skipped and counted in the run summary.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "metrics_file.hpp"
#include "parity_runs.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

void make_folder(const fs::path& out, const std::vector<std::string>& damage) {
  std::vector<std::string> argv = {
      (source_dir() / ".venv" / "bin" / "python").string(),
      (source_dir() / "tests/e2e/image_folder/make_folder.py").string(), out.string()};
  argv.insert(argv.end(), damage.begin(), damage.end());
  const CommandResult made = run_command(argv, {}, 120);
  ASSERT_EQ(made.exit_code, 0) << describe(made);
}

std::string recipe_text(const fs::path& folder) {
  return R"([run]
seed = 1
epochs = 2
eval = true

[loader]
batch_size = 6

[dataset]
plugin = "image_folder"
train = ")" +
         (folder / "train").string() + R"("
test = ")" +
         (folder / "test").string() + R"("

[dataset.transforms]
random_resized_crop = [16, 16]
crop_scale = [0.5, 1.0]
horizontal_flip = 0.5
brightness = 0.2
mean = [0.5]
std = [0.25]

[model]
plugin = "mlp"
hidden = [32]

[optimizer]
plugin = "sgd"
lr = 0.1

[sinks.jsonl]
)";
}

double summary_value(const fs::path& out, const std::string& key) {
  const auto summary = of_phase(read_metrics(out / "metrics.jsonl"), "summary");
  if (summary.empty()) throw std::runtime_error("no summary record in " + out.string());
  return summary.back().at(key);
}

TEST(ImageFolderRun, TrainsOnAugmentedPngAndJpegFilesWithTheSameBatchesFor0And1And4Workers) {
  TempDir dir;
  make_folder(dir / "images", {});
  const auto recipe = dir.write("recipe.toml", recipe_text(dir / "images"));
  std::string four_workers_log;
  for (const char* workers : {"0", "1", "4"}) {
    const auto run = run_one_process(recipe, dir / (std::string("w") + workers),
                                     {"--set", std::string("loader.workers=") + workers});
    ASSERT_EQ(run.exit_code, 0) << describe(run);
    four_workers_log = run.out + run.err;
  }
  // The three colours are told apart after two epochs: the transforms kept the labels.
  EXPECT_GT(summary_value(dir / "w0", "eval_accuracy"), 0.9);
  expect_same_model_within(dir / "w0" / "final.pt", dir / "w1" / "final.pt", 0, 0);
  expect_same_model_within(dir / "w0" / "final.pt", dir / "w4" / "final.pt", 0, 0);
  // The loader's threads said where their time went.
  EXPECT_HAS(four_workers_log, "loader worker 3: ");
  EXPECT_HAS(four_workers_log, "decode ");
  EXPECT_GT(summary_value(dir / "w4", "loader_decode_s"), 0);
  EXPECT_GT(summary_value(dir / "w4", "loader_transform_s"), 0);
}

// The same images named by a CSV list (train) and a JSON list (test) train the same model as the
// folders; a malformed list line is refused naming the list and the line.
TEST(ImageFolderRun, CsvAndJsonListsTrainAsTheFolderDoes) {
  TempDir dir;
  make_folder(dir / "images", {});
  const auto recipe = dir.write("recipe.toml", recipe_text(dir / "images"));
  const auto folders = run_one_process(recipe, dir / "folders", {});
  ASSERT_EQ(folders.exit_code, 0) << describe(folders);
  const std::vector<std::string> lists = {
      "--set", "dataset.train=" + (dir / "images" / "train.csv").string(), "--set",
      "dataset.test=" + (dir / "images" / "test.json").string()};
  const auto listed = run_one_process(recipe, dir / "lists", lists);
  ASSERT_EQ(listed.exit_code, 0) << describe(listed);
  expect_same_model_within(dir / "folders" / "final.pt", dir / "lists" / "final.pt", 0, 0);
  EXPECT_EQ(summary_value(dir / "lists", "eval_accuracy"),
            summary_value(dir / "folders", "eval_accuracy"));

  const auto bad_list = dir.write("bad.csv", "path,label\ntrain/a/000.jpg,0\ntrain/a/001.png\n");
  const auto refused =
      run_one_process(recipe, dir / "bad", {"--set", "dataset.train=" + bad_list.string()});
  EXPECT_NE(refused.exit_code, 0) << describe(refused);
  EXPECT_HAS(refused.err, bad_list.string() + ":3: needs path,label, got 'train/a/001.png'");
}

struct Damage {
  const char* name;
  std::string file;     // under images/train
  std::string message;  // after "<path>: "
};

TEST(ImageFolderRun, EachDamageIsRefusedAtTheStartNamingItsPath) {
  const std::vector<Damage> damages = {
      {"truncated", "b/zz_truncated.jpg", "truncated JPEG (no end-of-image marker)"},
      {"crc", "a/zz_bad_crc.png", "PNG chunk IDAT has a bad CRC"},
      {"empty_file", "c/zz_empty.png", "empty file, not an image"},
      {"empty_class", "d", "class folder 'd' holds no readable .jpg, .jpeg or .png image"}};
  for (const Damage& damage : damages) {
    SCOPED_TRACE(damage.name);
    TempDir dir;
    make_folder(dir / "images", {damage.name});
    const auto recipe = dir.write("recipe.toml", recipe_text(dir / "images"));
    const auto refused = run_one_process(recipe, dir / "out", {});
    EXPECT_NE(refused.exit_code, 0) << describe(refused);
    EXPECT_HAS(refused.err,
               (dir / "images" / "train" / damage.file).string() + ": " + damage.message);
    EXPECT_FALSE(fs::exists(dir / "out" / "final.pt"));
  }
}

TEST(ImageFolderRun, SkippingLeavesDamagedFilesOutAndCountsThemInTheSummary) {
  TempDir dir;
  make_folder(dir / "images", {"truncated", "crc", "empty_file"});
  const auto recipe = dir.write("recipe.toml", recipe_text(dir / "images"));
  const auto skipped =
      run_one_process(recipe, dir / "skipped", {"--set", "dataset.on_bad_sample=skip"});
  ASSERT_EQ(skipped.exit_code, 0) << describe(skipped);
  EXPECT_HAS(skipped.err, "image_folder: skipped 3 unreadable files under " +
                              (dir / "images" / "train").string());
  EXPECT_HAS(skipped.out + skipped.err, "the dataset skipped 3 unreadable samples");
  EXPECT_EQ(summary_value(dir / "skipped", "skipped_samples"), 3);
}

}  // namespace
}  // namespace trainyard::testing
