#include "training_data.hpp"

#include <algorithm>

#include "trainyard/api/device.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard {

std::unique_ptr<Loader> open_split(const Dataset& dataset, const std::string& split,
                                   const LoaderOptions& options, bool equal_lengths) {
  if (auto map = dataset.map_source(split)) return std::make_unique<Loader>(map, options);
  if (auto stream = dataset.stream_source(split)) {
    return std::make_unique<Loader>(stream, options, equal_lengths);
  }
  return nullptr;
}

TrainingData::TrainingData(const Dataset& dataset, const std::string& dataset_plugin,
                           const LoaderSettings& loader, const RunOptions& run,
                           const DevicePlacement& placement, DataParallelPlace place,
                           unsigned cores, int local_ranks)
    : accumulation_(run.grad_accumulation) {
  LoaderOptions train;
  train.batch_size = loader.batch_size;
  train.shuffle = loader.shuffle;
  train.drop_last = loader.drop_last;
  // A stream's order depends on its worker count, so only a map-style split's count is left
  // to what the first steps measure (LoaderTuner).
  chooses_workers_ = loader.workers == -1 && dataset.map_split(loader.train_split) != nullptr;
  train.workers = chooses_workers_ ? 0 : loader.worker_count(cores, local_ranks);
  train.prefetch = static_cast<int>(loader.prefetch);
  train.seed = run.seed;
  train.place = place;
  if (placement.device.type() != c10::kCPU) {
    // Workers finish batches in page-locked memory and start their copies to the device, so
    // the training thread only orders its stream after them (DeviceBackend::stage).
    std::shared_ptr<DeviceBackend> backend = placement.backend;
    const int index = placement.index;
    train.finish_batch = [backend, index](Batch batch) {
      for (auto& [name, tensor] : batch.tensors) tensor = backend->pin(tensor);
      return backend->prefetch(batch, index);
    };
  }
  const std::string& split = loader.train_split;
  loader_ = open_split(dataset, split, train, /*equal_lengths=*/true);
  if (!loader_) {
    loader.section.fail("train_split", "names a split the dataset does not have: '" + split + "'");
  }
  if (loader_->batches_per_epoch() < 0) {
    throw Error("dataset '" + dataset_plugin + "' streams its '" + split +
                "' split without knowing its size; the engine needs the samples per epoch to "
                "schedule the run");
  }
  steps_per_epoch_ = loader_->batches_per_epoch() / accumulation_;
  if (steps_per_epoch_ < 1) {
    throw Error("the '" + split + "' split yields " + std::to_string(loader_->batches_per_epoch()) +
                " batches per epoch, fewer than one optimizer step of " +
                std::to_string(accumulation_) + " micro-batches");
  }
  total_steps_ = run.epochs * steps_per_epoch_;
  if (run.max_steps > 0) total_steps_ = std::min(total_steps_, run.max_steps);
  if (run.eval) {
    if (!dataset.map_split(loader.eval_split) && !dataset.stream_split(loader.eval_split)) {
      loader.section.fail("eval_split",
                          "names a split the dataset does not have: '" + loader.eval_split + "'");
    }
    eval_split_ = loader.eval_split;
  }
}

bool TrainingData::epoch_complete() const {
  return loader_->batches_per_epoch() - loader_->position() < accumulation_;
}

}  // namespace trainyard
