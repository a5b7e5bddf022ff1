#include "trainyard/runtime/loader.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "trainyard/api/error.hpp"
#include "trainyard/runtime/stream_loader.hpp"

namespace trainyard {

int default_loader_workers(unsigned cores, int local_world_size) {
  const int per_rank = std::max(1, static_cast<int>(cores) / std::max(1, local_world_size));
  // A rank with one core of its own has no spare core for a worker: a worker thread would only
  // take turns with the step on that core, and switching costs more than preparing in line.
  if (per_rank == 1) return 0;
  return std::clamp(per_rank / 4, 1, 4);
}

std::vector<std::int64_t> epoch_indices(std::int64_t dataset_size, const LoaderOptions& options,
                                        std::int64_t epoch) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(dataset_size));
  if (options.shuffle) {
    at::Generator generator =
        at::make_generator<at::CPUGeneratorImpl>(options.seed + static_cast<std::uint64_t>(epoch));
    at::Tensor permutation = at::randperm(dataset_size, generator, at::TensorOptions(at::kLong));
    const auto* data = permutation.data_ptr<std::int64_t>();
    std::copy(data, data + dataset_size, order.begin());
  } else {
    for (std::int64_t i = 0; i < dataset_size; ++i) order[static_cast<std::size_t>(i)] = i;
  }
  const std::int64_t ranks = options.place.size;
  if (ranks <= 1) return order;
  if (options.pad && dataset_size > 0) {
    std::int64_t total = (dataset_size + ranks - 1) / ranks * ranks;
    for (std::int64_t i = dataset_size; i < total; ++i) {
      order.push_back(order[static_cast<std::size_t>((i - dataset_size) % dataset_size)]);
    }
  }
  std::vector<std::int64_t> mine;
  for (std::size_t i = static_cast<std::size_t>(options.place.rank); i < order.size();
       i += static_cast<std::size_t>(ranks)) {
    mine.push_back(order[i]);
  }
  return mine;
}

// Persistent worker threads. Worker w prepares batches w, w + W, w + 2W, ... of the epoch, at
// most `prefetch` ahead of the consumer each, into a map the consumer drains in order; so the
// order never depends on which worker is faster. Each worker sleeps on its own condition
// variable: taking batch b frees the slot of batch b + W * prefetch, which is worker b % W's, so
// a step wakes one thread rather than all of them.
struct Loader::Workers {
  explicit Workers(Loader& loader)
      : owner(loader), count(loader.options_.workers), work(static_cast<std::size_t>(count)) {
    next.assign(static_cast<std::size_t>(count), 0);
    for (int w = 0; w < count; ++w) threads.emplace_back([this, w] { run(w); });
  }

  ~Workers() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    wake_all();
    for (auto& thread : threads) thread.join();
  }

  void wake_all() {
    for (auto& worker : work) worker.notify_all();
  }

  // Called with `mutex` held, after the loader has switched to the new epoch.
  void restart_locked(std::int64_t first_batch) {
    ++generation;
    ready.clear();
    error = nullptr;
    consumed = first_batch;
    for (std::int64_t w = 0; w < count; ++w) {
      next[static_cast<std::size_t>(w)] = first_batch + ((w - first_batch) % count + count) % count;
    }
  }

  Batch take(std::int64_t batch_index) {
    std::unique_lock<std::mutex> lock(mutex);
    done.wait(lock, [&] { return ready.count(batch_index) || error; });
    if (error) std::rethrow_exception(error);
    Batch batch = std::move(ready[batch_index]);
    ready.erase(batch_index);
    consumed = batch_index + 1;
    lock.unlock();
    work[static_cast<std::size_t>(batch_index % count)].notify_one();
    return batch;
  }

  void run(int worker) {
    const std::int64_t ahead = count * std::max(1, owner.options_.prefetch);
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      auto& mine = next[static_cast<std::size_t>(worker)];
      work[static_cast<std::size_t>(worker)].wait(lock, [&] {
        return stop || (mine < owner.num_batches_ && mine < consumed + ahead && !error);
      });
      if (stop) return;
      const std::int64_t batch_index = mine;
      const std::uint64_t started = generation;
      std::shared_ptr<const std::vector<std::int64_t>> indices = owner.indices_;
      const std::int64_t epoch = owner.epoch_;
      mine += count;
      lock.unlock();
      Batch batch;
      std::exception_ptr failure;
      try {
        batch = owner.make_batch(*indices, batch_index, epoch, static_cast<std::size_t>(worker) + 1);
      } catch (...) {
        failure = std::current_exception();
      }
      lock.lock();
      if (started != generation) continue;
      if (failure) {
        error = failure;
      } else {
        ready.emplace(batch_index, std::move(batch));
      }
      done.notify_all();
    }
  }

  Loader& owner;
  // Fixed before any thread starts: threads.size() grows while the first threads already run.
  const std::int64_t count;
  std::mutex mutex;
  std::vector<std::condition_variable> work;  // one per worker
  std::condition_variable done;
  std::vector<std::thread> threads;
  std::vector<std::int64_t> next;
  std::map<std::int64_t, Batch> ready;
  std::int64_t consumed = 0;
  std::uint64_t generation = 0;
  std::exception_ptr error;
  bool stop = false;
};

Loader::Loader(std::shared_ptr<const MapSource> source, LoaderOptions options)
    : source_(std::move(source)), options_(options) {
  if (!source_) throw Error("loader needs a map-style split");
  if (options_.batch_size <= 0) {
    throw Error("loader.batch_size must be > 0, got " + std::to_string(options_.batch_size));
  }
  if (options_.workers < 0) throw Error("loader.workers must be >= 0");
  if (options_.workers > 0) workers_ = std::make_unique<Workers>(*this);
  start_epoch(0);
}

Loader::Loader(std::shared_ptr<const StreamSource> source, LoaderOptions options,
               bool equal_lengths)
    : options_(options),
      stream_(
          std::make_unique<StreamLoader>(std::move(source), std::move(options), equal_lengths)) {}

// Workers refer to the loader; they must stop before its members go away.
Loader::~Loader() { workers_.reset(); }

std::int64_t Loader::batches_per_epoch() const {
  if (stream_) return stream_->batches_per_epoch().value_or(-1);
  return num_batches_;
}

std::int64_t Loader::position() const { return stream_ ? stream_->position() : next_batch_; }

void Loader::save_state(StateDict& out) const {
  if (stream_) stream_->save_state(out);
}

void Loader::load_state(const StateDict& in) {
  if (stream_) stream_->load_state(in);
}

void Loader::start_epoch(std::int64_t epoch, std::int64_t first_batch) {
  if (stream_) {
    stream_->start_epoch(epoch, first_batch);
    epoch_ = epoch;
    return;
  }
  auto indices = std::make_shared<const std::vector<std::int64_t>>(
      epoch_indices(source_->size(), options_, epoch));
  const auto count = static_cast<std::int64_t>(indices->size());
  const std::int64_t num_batches = options_.drop_last
                                       ? count / options_.batch_size
                                       : (count + options_.batch_size - 1) / options_.batch_size;
  if (first_batch < 0 || first_batch > num_batches) {
    throw Error("cannot resume at batch " + std::to_string(first_batch) + " of an epoch of " +
                std::to_string(num_batches) + " batches");
  }
  std::unique_lock<std::mutex> lock;
  if (workers_) lock = std::unique_lock<std::mutex>(workers_->mutex);
  epoch_ = epoch;
  indices_ = std::move(indices);
  num_batches_ = num_batches;
  next_batch_ = first_batch;
  if (workers_) {
    workers_->restart_locked(first_batch);
    lock.unlock();
    workers_->wake_all();
  }
}

Batch Loader::make_batch(const std::vector<std::int64_t>& indices, std::int64_t batch_index,
                         std::int64_t epoch, std::size_t slot) const {
  BatchPreparation preparation;
  const auto begin = static_cast<std::size_t>(batch_index * options_.batch_size);
  const auto end = std::min(indices.size(), begin + static_cast<std::size_t>(options_.batch_size));
  Batch batch = source_->get_batch_drawn(
      std::span<const std::int64_t>(indices.data() + begin, end - begin),
      SampleDraws{options_.seed, epoch});
  if (options_.finish_batch) batch = options_.finish_batch(std::move(batch));
  preparation.record(*worker_times_, slot, batch.size);
  return batch;
}

std::vector<WorkerTimes> Loader::worker_times() const {
  return stream_ ? stream_->worker_times() : worker_times_->snapshot();
}

void Loader::set_workers(int count) {
  if (stream_) throw Error("a streaming split keeps the worker count it started with");
  if (count < 0) throw Error("loader.workers must be >= 0");
  if (count == options_.workers) return;
  workers_.reset();
  options_.workers = count;
  if (count == 0) return;
  workers_ = std::make_unique<Workers>(*this);
  std::unique_lock<std::mutex> lock(workers_->mutex);
  workers_->restart_locked(next_batch_);
  lock.unlock();
  workers_->wake_all();
}

std::vector<std::int64_t> Loader::next_batch_indices() const {
  if (stream_ || next_batch_ >= num_batches_) return {};
  const auto begin = static_cast<std::size_t>(next_batch_ * options_.batch_size);
  const auto end =
      std::min(indices_->size(), begin + static_cast<std::size_t>(options_.batch_size));
  return {indices_->begin() + static_cast<std::ptrdiff_t>(begin),
          indices_->begin() + static_cast<std::ptrdiff_t>(end)};
}

std::optional<Batch> Loader::next() {
  if (stream_) return stream_->next();
  if (next_batch_ >= num_batches_) return std::nullopt;
  const std::int64_t batch_index = next_batch_++;
  if (workers_) return workers_->take(batch_index);
  return make_batch(*indices_, batch_index, epoch_, 0);
}

}  // namespace trainyard
