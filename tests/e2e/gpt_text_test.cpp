// The gpt_text recipe as shipped: a small GPT trained on Debian's fortunes through the host.
// Its loss must fall clearly below the corpus' unigram entropy (the best loss a model without
// context can reach), on the training stream and on the held-out windows, and the loader must
// keep the step fed.

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fnmatch.h>
#include <fstream>
#include <vector>

#include "metrics_file.hpp"
#include "test_support.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

constexpr const char* kCorpus = "/usr/share/games/fortunes";

// Entropy in nats of the byte frequencies of the files the recipe reads (the text dataset's
// default excludes: *.dat indexes and *.u8 duplicates), computed independently of the dataset.
double corpus_byte_entropy() {
  std::vector<double> counts(256, 0);
  double total = 0;
  for (const auto& entry : fs::directory_iterator(kCorpus)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || fnmatch("*.dat", name.c_str(), 0) == 0 ||
        fnmatch("*.u8", name.c_str(), 0) == 0) {
      continue;
    }
    std::ifstream in(entry.path(), std::ios::binary);
    char c;
    while (in.get(c)) {
      counts[static_cast<unsigned char>(c)] += 1;
      total += 1;
    }
  }
  double entropy = 0;
  for (double count : counts) {
    if (count > 0) entropy -= count / total * std::log(count / total);
  }
  return entropy;
}

TEST(GptTextTraining, LossFallsClearlyBelowTheUnigramEntropy) {
  if (!fs::exists(kCorpus)) TRAINYARD_SKIP_MISSING() << kCorpus << " missing: run tools/setup (fortunes)";
  TempDir dir;
  auto result = run_host({"run", "recipes/gpt_text.toml", "--set",
                          "run.output_dir=" + dir.path().string(), "--set",
                          "dataset.cache=" + (dir / "cache").string()});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const double entropy = corpus_byte_entropy();
  auto lines = read_metrics(dir / "metrics.jsonl");
  auto summary = of_phase(lines, "summary");
  ASSERT_EQ(summary.size(), 1u);
  const double train = summary[0].at("final_train_loss");
  const double eval = summary[0].at("eval_loss");
  std::cout << "gpt_text: unigram entropy " << entropy << " nats, final train loss " << train
            << ", held-out loss " << eval << ", data wait "
            << 100 * summary[0].at("data_wait_share") << "% of the run" << std::endl;
  EXPECT_GT(entropy, 3.0);
  EXPECT_LT(train, entropy - 0.4);
  EXPECT_LT(eval, entropy - 0.4);
  EXPECT_LE(summary[0].at("data_wait_share"), 0.02);
  // Token models report tokens/s (seq_len 128 per sample) and their FLOPs utilisation.
  for (const auto& record : of_phase(lines, "train")) {
    EXPECT_NEAR(record.at("tokens_per_s"), 128 * record.at("samples_per_s"),
                1e-9 * record.at("tokens_per_s"));
    EXPECT_GT(record.at("mfu"), 0);
  }
}

}  // namespace
}  // namespace trainyard::testing
