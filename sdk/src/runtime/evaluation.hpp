#pragma once
// Evaluation of the strategy's model on a whole split, with every rank reporting the figures of
// the whole split whatever the mesh.

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distributed_runtime.hpp"
#include "trainyard/runtime/loader.hpp"

namespace trainyard {

class Dataset;
class Strategy;

class Evaluation {
 public:
  // `options` without the data-parallel place, which comes from the runtime's mesh.
  Evaluation(std::shared_ptr<Dataset> dataset, std::string split, LoaderOptions options,
             std::int64_t max_batches, Strategy& strategy, c10::Device device,
             const DistributedRuntime& runtime);

  // The split's mean loss (when any rank holds one), the means of the model's sums, and the
  // samples counted: the same on every rank. Collective in a multi-process run.
  std::vector<std::pair<std::string, double>> run();
  // The loader threads the next run() prepares batches with.
  void set_workers(int workers) { options_.workers = workers; }
  int workers() const { return options_.workers; }

 private:
  std::shared_ptr<Dataset> dataset_;
  std::string split_;
  LoaderOptions options_;
  std::int64_t max_batches_ = 0;
  Strategy& strategy_;
  c10::Device device_;
  const DistributedRuntime& runtime_;
  // The names of the model's evaluation sums, for ranks that hold no loss (pipeline stages
  // before the last), learnt from the ranks that do.
  void publish_sum_names(const TensorMap& sums);
  std::vector<std::string> sum_names_from_holders();
  bool sum_names_published_ = false;
  std::vector<std::string> sum_names_;
};

}  // namespace trainyard
