#include "evaluation.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <optional>

#include "training_data.hpp"
#include "trainyard/api/communicator.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/api/strategy.hpp"

namespace trainyard {

Evaluation::Evaluation(std::shared_ptr<Dataset> dataset, std::string split, LoaderOptions options,
                       std::int64_t max_batches, Strategy& strategy, c10::Device device,
                       const DistributedRuntime& runtime)
    : dataset_(std::move(dataset)),
      split_(std::move(split)),
      options_(std::move(options)),
      max_batches_(max_batches),
      strategy_(strategy),
      device_(device),
      runtime_(runtime) {}

namespace {
constexpr const char* kSumNamesKey = "trainyard/eval_sum_names";
}  // namespace

// The names go through the store, once per run: every rank holding a loss sets the same value,
// the others wait for it.
void Evaluation::publish_sum_names(const TensorMap& sums) {
  if (sum_names_published_) return;
  std::string joined;
  for (const auto& [name, value] : sums) joined += name + "\n";
  runtime_.communicator()->store()->set(kSumNamesKey,
                                        std::vector<std::uint8_t>(joined.begin(), joined.end()));
  sum_names_published_ = true;
}

std::vector<std::string> Evaluation::sum_names_from_holders() {
  if (sum_names_.empty()) {
    const std::vector<std::uint8_t> bytes = runtime_.communicator()->store()->get(kSumNamesKey);
    std::string name;
    for (std::uint8_t byte : bytes) {
      if (byte == '\n') {
        sum_names_.push_back(name);
        name.clear();
      } else {
        name.push_back(static_cast<char>(byte));
      }
    }
  }
  return sum_names_;
}

std::vector<std::pair<std::string, double>> Evaluation::run() {
  LoaderOptions options = options_;
  options.place = runtime_.data_parallel_place();
  std::unique_ptr<Loader> loader = open_split(*dataset_, split_, options, false);
  at::Tensor loss_sum;
  TensorMap sums;
  std::int64_t samples = 0;
  std::int64_t batches = 0;
  // Sharded strategies evaluate collectively (fsdp gathers each unit), so every rank runs as
  // many evaluation steps as the rank with the most batches; the others repeat their last
  // batch and discard the result.
  std::int64_t steps_everywhere = 0;
  if (runtime_.multi_process() && loader->batches_per_epoch() >= 0) {
    std::int64_t own = loader->batches_per_epoch();
    if (max_batches_ > 0) own = std::min(own, max_batches_);
    steps_everywhere = runtime_.max(own);
  }
  std::optional<Batch> last;
  while (auto batch = loader->next()) {
    if (max_batches_ > 0 && batches >= max_batches_) break;
    last = batch->to(device_);
    EvalResult result = strategy_.eval_step(*last);
    ++batches;
    // Only the ranks where the loss lives report one (samples > 0).
    if (result.samples <= 0) continue;
    loss_sum = loss_sum.defined() ? loss_sum + result.loss_sum : result.loss_sum;
    for (const auto& [name, value] : result.sums) {
      auto it = sums.find(name);
      if (it == sums.end()) {
        sums.emplace(name, value.to(at::kDouble));
      } else {
        it->second = it->second + value.to(at::kDouble);
      }
    }
    samples += result.samples;
  }
  for (std::int64_t extra = batches; last && extra < steps_everywhere; ++extra) {
    strategy_.eval_step(*last);
  }
  // Every rank reports the figures of the whole split. Each data-parallel slice is read by
  // every rank of its slice that holds a loss (tensor-parallel peers, say): the sums are added
  // up per slice across ranks, and each slice's sums divided by how many ranks held them, so
  // every sample counts once.
  // A rank that holds no loss does not know the model's sums: it learns how many there are, so
  // every rank adds up buffers of one length.
  const auto named = static_cast<std::size_t>(
      runtime_.multi_process() ? runtime_.max(static_cast<std::int64_t>(sums.size()))
                               : static_cast<std::int64_t>(sums.size()));
  if (named > 0 && sums.empty()) {
    // Its names too (a pipeline's first stage reports them in its metrics like the last).
    for (const std::string& name : sum_names_from_holders()) sums.emplace(name, at::zeros({}));
  } else if (named > 0 && runtime_.multi_process()) {
    publish_sum_names(sums);
  }
  const std::size_t width = named + 3;  // loss, sums, samples, holders
  const DataParallelPlace place = runtime_.data_parallel_place();
  std::vector<double> slices(width * static_cast<std::size_t>(place.size), 0.0);
  if (samples > 0) {
    double* row = slices.data() + width * static_cast<std::size_t>(place.rank);
    std::size_t column = 0;
    row[column++] = loss_sum.item<double>();
    for (const auto& [name, value] : sums) row[column++] = value.item<double>();
    row[width - 2] = static_cast<double>(samples);
    row[width - 1] = 1;
  }
  slices = runtime_.sum(std::move(slices));
  std::vector<double> totals(width - 1, 0.0);
  for (int slice = 0; slice < place.size; ++slice) {
    const double* row = slices.data() + width * static_cast<std::size_t>(slice);
    const double holders = row[width - 1];
    if (holders == 0) continue;
    for (std::size_t i = 0; i + 1 < width; ++i) totals[i] += row[i] / holders;
  }
  std::vector<std::pair<std::string, double>> values;
  const double global_samples = totals.back();
  const double count = std::max(global_samples, 1.0);
  if (loss_sum.defined() || runtime_.multi_process())
    values.emplace_back("loss", totals[0] / count);
  std::size_t index = 1;
  for (const auto& [name, value] : sums) values.emplace_back(name, totals[index++] / count);
  values.emplace_back("samples", global_samples);
  return values;
}

}  // namespace trainyard
