// Asynchronous checkpoints taken while training goes on: entries copied at once, or read behind the
// optimizer step gate (host tensors written from their own memory, others copied first), and files
// identical byte for byte to a synchronous save of the same step, for each strategy (ranks as
// threads) and each checkpoint backend.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <map>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "step_harness.hpp"
#include "test_support.hpp"
#include "trainyard/api/checkpoint.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/runtime/checkpoint_store.hpp"
#include "trainyard/runtime/optimizer_step_gate.hpp"
#include "trainyard/runtime/optimizer_stepped_memory.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<CheckpointBackend> backend_named(const std::string& name) {
  return bundled_registry().create<CheckpointBackend>(name, Config({}, "checkpoint"),
                                                      BuildContext{});
}

// Every rank's all_ok for the store, ranks being threads of this process.
class ThreadAgreement {
 public:
  explicit ThreadAgreement(int ranks) : ranks_(ranks) {}
  CheckpointPeers peers(int rank) {
    if (ranks_ == 1) return {};
    return CheckpointPeers{rank, ranks_, [this](bool ok) { return all_ok(ok); }};
  }

 private:
  bool all_ok(bool ok) {
    std::unique_lock<std::mutex> lock(mutex_);
    const std::uint64_t round = round_;
    round_ok_ = round_ok_ && ok;
    if (++arrived_ == ranks_) {
      result_ = round_ok_;
      arrived_ = 0;
      round_ok_ = true;
      ++round_;
      changed_.notify_all();
      return result_;
    }
    changed_.wait(lock, [&] { return round_ != round; });
    return result_;
  }

  int ranks_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  bool round_ok_ = true;
  bool result_ = true;
  std::uint64_t round_ = 0;
};

std::string file_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Every file of two checkpoint folders, compared byte for byte.
void expect_same_files(const fs::path& expected, const fs::path& actual) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(expected)) {
    names.push_back(entry.path().filename().string());
  }
  std::size_t actual_count = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(actual)) ++actual_count;
  EXPECT_EQ(actual_count, names.size());
  ASSERT_GE(names.size(), 3u) << "manifest, shared file, a rank file";
  for (const auto& name : names) {
    const std::string want = file_bytes(expected / name);
    const std::string got = file_bytes(actual / name);
    EXPECT_EQ(got.size(), want.size()) << name;
    EXPECT_TRUE(got == want) << name << " differs from the synchronous save's";
  }
}

TEST(AsyncCheckpointCopyTest, SteppedEntriesAreCopiedBeforeTheGateOpensTheOthersAtOnce) {
  TempDir dir;
  CheckpointStore store(backend_named("safetensors"), "safetensors", dir / "c", 0);
  at::manual_seed(3);
  const at::Tensor weight = at::randn({64, 32});
  const at::Tensor moment = at::randn({64, 32});
  const at::Tensor running_mean = at::randn({32});
  CheckpointState state;
  state.shared.tensors["model.weight"] = weight.narrow(0, 0, 32);  // a view: a piece of it
  state.shared.tensors["optimizer.weight.exp_avg"] = moment;
  state.shared.tensors["model.running_mean"] = running_mean;
  state.local.tensors["rng"] = at::arange(8, at::kByte);
  const CheckpointState expected = snapshot_to_host(state);

  OptimizerStepGate gate;
  store.save_async(4, state, OptimizerSteppedMemory({weight, moment}), &gate);
  EXPECT_TRUE(gate.held()) << "the parameters and moments wait for the background thread";
  // Forward changes buffers at once; the optimizer changes the rest after the gate.
  running_mean.add_(100);
  state.local.tensors["rng"].zero_();
  gate.enter();
  EXPECT_FALSE(gate.held());
  weight.add_(100);
  moment.add_(100);
  const auto folder = store.commit_pending();
  ASSERT_TRUE(folder);
  const CheckpointState loaded = store.load(*folder);
  for (const auto& [name, tensor] : expected.shared.tensors) {
    EXPECT_TRUE(at::equal(loaded.shared.tensors.at(name), tensor)) << name;
  }
  EXPECT_TRUE(at::equal(loaded.local.tensors.at("rng"), expected.local.tensors.at("rng")));
}

TEST(AsyncCheckpointCopyTest, WithoutAGateEverythingIsCopiedAtOnce) {
  TempDir dir;
  CheckpointStore store(backend_named("torch"), "torch", dir / "c", 0);
  const at::Tensor weight = at::ones({16});
  CheckpointState state;
  state.shared.tensors["model.weight"] = weight;
  store.save_async(1, state, OptimizerSteppedMemory({weight}), nullptr);
  weight.add_(1);
  const auto folder = store.commit_pending();
  ASSERT_TRUE(folder);
  EXPECT_TRUE(at::equal(store.load(*folder).shared.tensors.at("model.weight"), at::ones({16})));
}

// A backend that records where each entry's bytes came from and writes only when the test lets
// it: the test sees what the optimizer step may do while a file is still reading the state.
class WhenLetBackend final : public CheckpointBackend {
 public:
  std::string extension() const override { return ".bin"; }
  void write_to(CheckpointFileWriter& out, const StateDict& state) const override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& [name, tensor] : state.tensors) sources_[name] = tensor.const_data_ptr();
    }
    let_write_.wait();
    for (const auto& [name, tensor] : state.tensors) {
      out.append(tensor.const_data_ptr(), tensor.nbytes());
    }
  }
  StateDict read(const fs::path& file) const override {
    throw Error("the test backend reads nothing: " + file.string());
  }
  void let_write() { let_.set_value(); }
  const void* source_of(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return sources_.at(name);
  }

 private:
  std::promise<void> let_;
  std::shared_future<void> let_write_ = let_.get_future().share();
  mutable std::mutex mutex_;
  mutable std::map<std::string, const void*> sources_;
};

TEST(AsyncCheckpointCopyTest, HostEntriesAreWrittenFromTheLiveTensorsAndTheGateWaitsForTheFiles) {
  TempDir dir;
  auto backend = std::make_shared<WhenLetBackend>();
  CheckpointStore store(backend, "test", dir / "c", 0);
  const at::Tensor weight = at::randn({64, 32});
  const at::Tensor moment = at::randn({32, 64});
  const at::Tensor running_mean = at::randn({32});
  CheckpointState state;
  state.shared.tensors["model.weight"] = weight;
  state.shared.tensors["optimizer.moment"] = moment.t();  // not contiguous: copied first
  state.shared.tensors["model.running_mean"] = running_mean;
  state.local.tensors["rng"] = at::arange(8, at::kByte);
  OptimizerStepGate gate;
  store.save_async(1, state, OptimizerSteppedMemory({weight, moment}), &gate);
  auto optimizer_step = std::async(std::launch::async, [&] { gate.enter(); });
  EXPECT_EQ(optimizer_step.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
      << "the optimizer step went ahead while the files were still to read the parameters";
  backend->let_write();
  ASSERT_EQ(optimizer_step.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  ASSERT_TRUE(store.commit_pending());
  EXPECT_EQ(backend->source_of("model.weight"), weight.const_data_ptr())
      << "a contiguous host parameter is written from its own memory, not from a copy";
  EXPECT_NE(backend->source_of("optimizer.moment"), moment.const_data_ptr());
  EXPECT_NE(backend->source_of("model.running_mean"), running_mean.const_data_ptr())
      << "what forward changes is copied before save_async returns";
}

TEST(AsyncCheckpointCopyTest, LiveTensorsNeverServeAsTheNextSnapshotsBuffers) {
  TempDir dir;
  CheckpointStore store(backend_named("safetensors"), "safetensors", dir / "c", 0);
  const at::Tensor weight = at::ones({16});
  CheckpointState first;
  first.shared.tensors["model.weight"] = weight;
  OptimizerStepGate gate;
  store.save_async(1, first, OptimizerSteppedMemory({weight}), &gate);
  gate.enter();
  ASSERT_TRUE(store.commit_pending());
  // The next save copies its entry at once, into the previous snapshot's buffer of that name if
  // there is one: never the parameter the previous save wrote in place.
  CheckpointState second;
  second.shared.tensors["model.weight"] = at::full({16}, 7.0);
  store.save_async(2, second);
  const auto folder = store.commit_pending();
  ASSERT_TRUE(folder);
  EXPECT_TRUE(at::equal(weight, at::ones({16}))) << "the live parameter was overwritten";
  EXPECT_TRUE(
      at::equal(store.load(*folder).shared.tensors.at("model.weight"), at::full({16}, 7.0)));
}

struct AsyncCase {
  std::string strategy;
  std::string strategy_options;
  int ranks = 1;
  std::string backend;
};

void PrintTo(const AsyncCase& param, std::ostream* out) {
  *out << param.strategy << " [" << param.strategy_options << "] on " << param.ranks << " rank(s), "
       << param.backend;
}

std::string case_name(const ::testing::TestParamInfo<AsyncCase>& info) {
  const std::string variant = info.param.strategy_options.empty() ? "" : "_zero1";
  return info.param.strategy + variant + "_" + std::to_string(info.param.ranks) + "_ranks_" +
         info.param.backend;
}

class AsyncSaveMatchesSyncSave : public ::testing::TestWithParam<AsyncCase> {};

// Each rank trains, saves step 2 synchronously, then asynchronously, and trains on at once: the
// next steps' forward changes BatchNorm's running statistics and their optimizer steps change
// parameters and AdamW's moments while the asynchronous save copies and writes. Its files must
// be those of the synchronous save, byte for byte (the manifest's checksums included).
TEST_P(AsyncSaveMatchesSyncSave, ByteForByte) {
  const AsyncCase& param = GetParam();
  TempDir dir;
  ThreadAgreement sync_peers(param.ranks);
  ThreadAgreement async_peers(param.ranks);
  const std::function<std::string(int, int)> rank_body = [&](int rank, int port) {
    OptimizerStepGate gate;
    HarnessOptions options;
    options.strategy = param.strategy;
    options.strategy_options = param.strategy_options;
    // A wide head (4 M parameters, 50 MB with AdamW's moments) makes the copy outlast a step.
    options.model = "cnn";
    options.model_options = "channels = [4, 16]\nhidden = 4096";
    options.input_shape = {1, 32, 32};
    options.classes = 10;
    options.optimizer = "adamw";
    options.optimizer_options = "lr = 0.01";
    options.optimizer_step_gate = &gate;
    if (param.ranks > 1) options.as_rank(rank, param.ranks, port);
    StepHarness harness(options);
    Strategy& strategy = *harness.strategy;
    auto train = [&](int step) {
      // Each rank reads its slice of the global batch.
      const Batch batch = random_batch(8 * param.ranks, options.input_shape, options.classes,
                                       static_cast<std::uint64_t>(100 + step));
      const std::vector<Batch> micro{
          split_batch(batch, param.ranks).at(static_cast<std::size_t>(rank))};
      strategy.train_step(micro);
    };
    train(0);
    train(1);
    CheckpointStore sync_store(backend_named(param.backend), param.backend, dir / "sync", 0,
                               sync_peers.peers(rank));
    CheckpointStore async_store(backend_named(param.backend), param.backend, dir / "async", 0,
                                async_peers.peers(rank));
    CheckpointState state;
    strategy.save_state(state);
    sync_store.save(2, state);
    CheckpointState live;
    strategy.save_state(live);
    async_store.save_async(2, live, OptimizerSteppedMemory(strategy.optimizer_stepped_tensors()),
                           &gate);
    if (!gate.held()) return std::string("nothing was left to copy behind the gate");
    train(2);
    if (gate.held()) return std::string("the strategy stepped without passing the gate");
    train(3);
    async_store.commit_pending();
    return std::string();
  };
  const std::vector<std::string> problems = run_threaded_ranks<std::string>(param.ranks, rank_body);
  for (std::size_t rank = 0; rank < problems.size(); ++rank) {
    EXPECT_EQ(problems[rank], "") << "rank " << rank;
  }
  expect_same_files(dir / "sync" / "step-000000002", dir / "async" / "step-000000002");
}

INSTANTIATE_TEST_SUITE_P(Strategies, AsyncSaveMatchesSyncSave,
                         ::testing::Values(AsyncCase{"single", "", 1, "torch"},
                                           AsyncCase{"single", "", 1, "safetensors"},
                                           AsyncCase{"ddp", "", 2, "torch"},
                                           AsyncCase{"ddp", "", 2, "safetensors"},
                                           AsyncCase{"ddp", "zero1 = true", 2, "safetensors"},
                                           AsyncCase{"fsdp", "", 2, "torch"},
                                           AsyncCase{"fsdp", "", 2, "safetensors"}),
                         case_name);

}  // namespace
}  // namespace trainyard::testing
