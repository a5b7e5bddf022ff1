#include "trainyard/runtime/stream_loader.hpp"

#include <ATen/ATen.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "trainyard/api/error.hpp"

namespace trainyard {

namespace {

const std::string kPrefix = "loader.stream.";
const std::string kReaderPrefix = kPrefix + "reader.";

at::Tensor int_tensor(std::int64_t value) { return at::scalar_tensor(value, at::kLong); }

at::Tensor int_tensor(const std::vector<std::int64_t>& values) {
  return at::tensor(values, at::TensorOptions(at::kLong));
}

}  // namespace

// Where an epoch starts: a fresh one, or a restored position.
struct StreamLoader::Plan {
  std::int64_t epoch = 0;
  std::int64_t taken = 0;
  int cursor = 0;
  std::vector<std::int64_t> taken_from;
  std::vector<bool> ended;
  std::vector<std::optional<TensorMap>> states;

  Plan(std::int64_t epoch_, int readers)
      : epoch(epoch_),
        taken_from(static_cast<std::size_t>(readers), 0),
        ended(static_cast<std::size_t>(readers), false),
        states(static_cast<std::size_t>(readers)) {}
};

// One batch from one reader, or the news that the reader has ended, or its error.
struct StreamLoader::Item {
  std::optional<Batch> batch;  // nullopt: the reader has ended (or failed)
  TensorMap state;             // the reader's state right after this batch
  bool last = false;           // the reader has ended with this batch
  std::exception_ptr error;
};

// One reader: its SampleStream, and (with workers) the persistent thread that fills its queue.
// The stream and `produced`/`done` belong to whoever produces: the thread, or the consumer when
// there are no workers.
struct StreamLoader::Reader {
  Reader(StreamLoader& loader, int reader_index) : owner(loader), index(reader_index) {}

  void open(const Plan& plan) {
    shard.rank = owner.options_.place.rank;
    shard.world_size = owner.options_.place.size;
    shard.worker = index;
    shard.workers = owner.readers_;
    shard.seed = owner.options_.seed;
    shard.epoch = plan.epoch;
    stream.reset();
    produced = plan.taken_from[static_cast<std::size_t>(index)];
    done = plan.ended[static_cast<std::size_t>(index)] ||
           (owner.per_reader_batches_ && produced >= *owner.per_reader_batches_);
    if (done) return;
    stream = owner.source_->open(shard);
    if (!stream) throw Error("stream source returned no reader for " + describe(shard));
    const auto& state = plan.states[static_cast<std::size_t>(index)];
    if (state) stream->restore(*state);
  }

  std::string describe(const StreamShard& shard) const {
    return "stream reader (rank " + std::to_string(shard.rank) + " of " +
           std::to_string(shard.world_size) + ", worker " + std::to_string(shard.worker) +
           " of " + std::to_string(shard.workers) + ", epoch " + std::to_string(shard.epoch) + ")";
  }

  Item produce() {
    Item item;
    if (done) return item;
    BatchPreparation preparation;
    try {
      const auto batch_size = static_cast<std::size_t>(owner.options_.batch_size);
      std::vector<TensorMap> samples;
      samples.reserve(batch_size);
      while (samples.size() < batch_size) {
        std::optional<TensorMap> sample = stream->next();
        if (!sample) break;
        samples.push_back(std::move(*sample));
      }
      if (samples.size() < batch_size) {
        done = true;
        if (owner.per_reader_batches_) {
          throw Error(
              describe(shard) + " ended after " +
              std::to_string(produced * owner.options_.batch_size +
                             static_cast<std::int64_t>(samples.size())) +
              " samples, short of the " +
              std::to_string(*owner.per_reader_batches_ * owner.options_.batch_size) +
              " its share of the split's size() promises: the source's readers are unbalanced");
        }
        if (samples.empty() || owner.options_.drop_last) return item;
        item.last = true;
      }
      Batch batch = [&] {
        const SampleTimer timer(SampleStage::kCollate);
        return collate(samples);
      }();
      if (owner.options_.finish_batch) batch = owner.options_.finish_batch(std::move(batch));
      // The reader's thread, or the consumer's (slot 0) when there are no workers.
      const std::size_t slot = owner.options_.workers > 0 ? static_cast<std::size_t>(index) + 1 : 0;
      preparation.record(*owner.worker_times_, slot, batch.size);
      item.batch = std::move(batch);
      item.state = stream->state();
      ++produced;
      if (owner.per_reader_batches_ && produced >= *owner.per_reader_batches_) {
        item.last = true;
        done = true;
      }
    } catch (...) {
      item = Item{};
      item.error = std::current_exception();
      done = true;
    }
    return item;
  }

  void start_thread() {
    thread = std::thread([this] { run(); });
  }

  // Called by the consumer: the thread reopens for `next_plan` and drops what it prepared.
  void restart(std::shared_ptr<const Plan> next_plan) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      plan = std::move(next_plan);
      ++generation;
      queue.clear();
    }
    work.notify_all();
  }

  void stop_thread() {
    if (!thread.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    work.notify_all();
    thread.join();
  }

  Item take() {
    if (!thread.joinable()) return produce();
    std::unique_lock<std::mutex> lock(mutex);
    ready.wait(lock, [&] { return !queue.empty(); });
    Item item = std::move(queue.front());
    queue.pop_front();
    lock.unlock();
    work.notify_all();
    return item;
  }

  void run() {
    const auto capacity = static_cast<std::size_t>(std::max(1, owner.options_.prefetch));
    std::uint64_t serving = 0;  // the generation whose plan is open
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      work.wait(lock, [&] {
        return stop || generation != serving || (!done && queue.size() < capacity);
      });
      if (stop) return;
      if (generation != serving) {
        serving = generation;
        std::shared_ptr<const Plan> current = plan;
        lock.unlock();
        std::exception_ptr failure;
        try {
          open(*current);
        } catch (...) {
          failure = std::current_exception();
          done = true;
        }
        lock.lock();
        if (failure && serving == generation) {
          Item item;
          item.error = failure;
          queue.push_back(std::move(item));
          ready.notify_all();
        }
        continue;
      }
      lock.unlock();
      Item item = produce();
      lock.lock();
      if (serving != generation) continue;  // restarted meanwhile: stale
      queue.push_back(std::move(item));
      ready.notify_all();
    }
  }

  StreamLoader& owner;
  const int index;
  StreamShard shard;
  std::unique_ptr<SampleStream> stream;
  std::int64_t produced = 0;
  bool done = true;

  std::mutex mutex;
  std::condition_variable work;
  std::condition_variable ready;
  std::deque<Item> queue;
  std::shared_ptr<const Plan> plan;
  std::uint64_t generation = 0;
  bool stop = false;
  std::thread thread;
};

StreamLoader::StreamLoader(std::shared_ptr<const StreamSource> source, LoaderOptions options,
                           bool equal_lengths)
    : source_(std::move(source)), options_(std::move(options)) {
  if (!source_) throw Error("loader needs a streaming split");
  if (options_.batch_size <= 0) {
    throw Error("loader.batch_size must be > 0, got " + std::to_string(options_.batch_size));
  }
  if (options_.workers < 0) throw Error("loader.workers must be >= 0");
  readers_ = std::max(1, options_.workers);
  if (equal_lengths) {
    if (std::optional<std::int64_t> size = source_->size()) {
      const std::int64_t share = static_cast<std::int64_t>(options_.place.size) * readers_ *
                                 options_.batch_size;
      per_reader_batches_ = *size / share;
    }
  }
  for (int r = 0; r < readers_; ++r) slots_.push_back(std::make_unique<Reader>(*this, r));
  if (options_.workers > 0) {
    for (auto& slot : slots_) slot->start_thread();
  }
  start_epoch(0);
}

StreamLoader::~StreamLoader() {
  for (auto& slot : slots_) slot->stop_thread();
}

std::optional<std::int64_t> StreamLoader::batches_per_epoch() const {
  if (!per_reader_batches_) return std::nullopt;
  return *per_reader_batches_ * readers_;
}

void StreamLoader::open_epoch(std::shared_ptr<const Plan> plan) {
  epoch_ = plan->epoch;
  taken_ = plan->taken;
  cursor_ = plan->cursor;
  taken_from_ = plan->taken_from;
  ended_ = plan->ended;
  reader_state_ = plan->states;
  error_ = nullptr;
  for (auto& slot : slots_) {
    if (slot->thread.joinable()) {
      slot->restart(plan);
    } else {
      try {
        slot->open(*plan);
      } catch (...) {
        error_ = std::current_exception();
      }
    }
  }
}

void StreamLoader::start_epoch(std::int64_t epoch, std::int64_t first_batch) {
  const std::optional<std::int64_t> known = batches_per_epoch();
  if (first_batch < 0 || (known && first_batch > *known)) {
    throw Error("cannot resume at batch " + std::to_string(first_batch) + " of an epoch of " +
                (known ? std::to_string(*known) : std::string("unknown")) + " batches");
  }
  std::shared_ptr<const Plan> plan;
  if (restored_ && restored_->epoch == epoch && restored_->taken == first_batch) {
    plan = std::move(restored_);
  } else {
    plan = std::make_shared<const Plan>(epoch, readers_);
  }
  restored_.reset();
  open_epoch(plan);
  // No saved position for this point: the order is deterministic, so reading up to it is exact.
  while (taken_ < first_batch) {
    if (!next()) {
      throw Error("cannot resume at batch " + std::to_string(first_batch) + ": the stream's epoch " +
                  std::to_string(epoch) + " has only " + std::to_string(taken_) + " batches");
    }
  }
}

StreamLoader::Item StreamLoader::take(int reader) {
  return slots_[static_cast<std::size_t>(reader)]->take();
}

std::optional<Batch> StreamLoader::next() {
  if (error_) std::rethrow_exception(error_);
  for (int ended_in_a_row = 0; ended_in_a_row < readers_;) {
    const int r = cursor_;
    const auto slot = static_cast<std::size_t>(r);
    if (ended_[slot]) {
      cursor_ = (cursor_ + 1) % readers_;
      ++ended_in_a_row;
      continue;
    }
    Item item = take(r);
    if (item.error) {
      // Every later call fails alike until the next epoch: the reader will send nothing more.
      error_ = item.error;
      std::rethrow_exception(error_);
    }
    if (!item.batch) {
      ended_[slot] = true;
      cursor_ = (cursor_ + 1) % readers_;
      ++ended_in_a_row;
      continue;
    }
    reader_state_[slot] = std::move(item.state);
    ++taken_from_[slot];
    ++taken_;
    if (item.last) ended_[slot] = true;
    cursor_ = (r + 1) % readers_;
    return std::move(item.batch);
  }
  return std::nullopt;
}

void StreamLoader::save_state(StateDict& out) const {
  auto& t = out.tensors;
  t[kPrefix + "epoch"] = int_tensor(epoch_);
  t[kPrefix + "batch"] = int_tensor(taken_);
  t[kPrefix + "cursor"] = int_tensor(cursor_);
  t[kPrefix + "readers"] = int_tensor(readers_);
  t[kPrefix + "rank"] = int_tensor(options_.place.rank);
  t[kPrefix + "world_size"] = int_tensor(options_.place.size);
  t[kPrefix + "taken_from"] = int_tensor(taken_from_);
  std::vector<std::int64_t> ended, has_state;
  for (int r = 0; r < readers_; ++r) {
    const auto slot = static_cast<std::size_t>(r);
    ended.push_back(ended_[slot] ? 1 : 0);
    has_state.push_back(reader_state_[slot] ? 1 : 0);
    if (!reader_state_[slot]) continue;
    for (const auto& [name, tensor] : *reader_state_[slot]) {
      t[kReaderPrefix + std::to_string(r) + "." + name] = tensor;
    }
  }
  t[kPrefix + "ended"] = int_tensor(ended);
  t[kPrefix + "has_state"] = int_tensor(has_state);
}

void StreamLoader::load_state(const StateDict& in) {
  const auto& t = in.tensors;
  auto find = [&](const std::string& name) -> const at::Tensor& {
    auto it = t.find(kPrefix + name);
    if (it == t.end()) throw Error("checkpoint's stream loader state lacks '" + kPrefix + name + "'");
    return it->second;
  };
  if (!t.count(kPrefix + "readers")) return;
  auto scalar = [&](const std::string& name) { return find(name).item<std::int64_t>(); };
  const std::int64_t readers = scalar("readers");
  if (readers != readers_) {
    throw Error("the checkpoint's stream position was saved with " + std::to_string(readers) +
                " readers (loader.workers) and this run has " + std::to_string(readers_) +
                "; the readers partition the stream, so resume with the same loader.workers");
  }
  if (scalar("world_size") != options_.place.size || scalar("rank") != options_.place.rank) {
    throw Error("the checkpoint's stream position belongs to rank " +
                std::to_string(scalar("rank")) + " of " + std::to_string(scalar("world_size")) +
                ", not rank " + std::to_string(options_.place.rank) + " of " +
                std::to_string(options_.place.size));
  }
  auto plan = std::make_shared<Plan>(scalar("epoch"), readers_);
  plan->taken = scalar("batch");
  plan->cursor = static_cast<int>(scalar("cursor"));
  auto vector_of = [&](const std::string& name) {
    at::Tensor values = find(name).to(at::kLong).contiguous();
    if (values.numel() != readers_) {
      throw Error("checkpoint's '" + kPrefix + name + "' has " + std::to_string(values.numel()) +
                  " entries for " + std::to_string(readers_) + " readers");
    }
    const auto* data = values.data_ptr<std::int64_t>();
    return std::vector<std::int64_t>(data, data + readers_);
  };
  plan->taken_from = vector_of("taken_from");
  const auto ended = vector_of("ended");
  const auto has_state = vector_of("has_state");
  if (plan->cursor < 0 || plan->cursor >= readers_ || plan->taken < 0) {
    throw Error("checkpoint's stream loader position is out of range");
  }
  for (int r = 0; r < readers_; ++r) {
    const auto slot = static_cast<std::size_t>(r);
    plan->ended[slot] = ended[slot] != 0;
    if (has_state[slot] == 0) continue;
    TensorMap state;
    const std::string prefix = kReaderPrefix + std::to_string(r) + ".";
    for (auto it = t.lower_bound(prefix); it != t.end() && it->first.starts_with(prefix); ++it) {
      state.emplace(it->first.substr(prefix.size()), it->second);
    }
    plan->states[slot] = std::move(state);
  }
  restored_ = std::move(plan);
}

}  // namespace trainyard
