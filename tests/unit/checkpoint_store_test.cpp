// Unit tests of trainyard/checkpoint_store.hpp with a checkpoint backend defined in the test.

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "test_support.hpp"
#include "trainyard/api/checkpoint.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/runtime/checkpoint_store.hpp"
#include "trainyard/api/version.hpp"

namespace trainyard {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::TempDir;
using testing::contains;


// A plain binary format: counts, lengths, names, dtypes, shapes and raw bytes.
class RawBackend : public CheckpointBackend {
 public:
  std::string extension() const override { return ".raw"; }

  void write_to(CheckpointFileWriter& out, const StateDict& state) const override {
    put(out, static_cast<std::int64_t>(state.tensors.size()));
    for (const auto& [name, tensor] : state.tensors) {
      torch::Tensor data = tensor.contiguous().cpu();
      put_string(out, name);
      put(out, static_cast<std::int64_t>(data.scalar_type()));
      put(out, static_cast<std::int64_t>(data.dim()));
      for (auto size : data.sizes()) put(out, static_cast<std::int64_t>(size));
      out.append(data.data_ptr(), data.nbytes());
    }
    put(out, static_cast<std::int64_t>(state.metadata.size()));
    for (const auto& [key, value] : state.metadata) {
      put_string(out, key);
      put_string(out, value);
    }
  }

  StateDict read(const fs::path& file) const override {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw Error("cannot read " + file.string());
    StateDict state;
    auto count = get(in, file);
    for (std::int64_t i = 0; i < count; ++i) {
      std::string name = get_string(in, file);
      auto type = static_cast<torch::ScalarType>(get(in, file));
      auto dims = get(in, file);
      std::vector<std::int64_t> sizes;
      for (std::int64_t d = 0; d < dims; ++d) sizes.push_back(get(in, file));
      torch::Tensor tensor = torch::empty(sizes, torch::TensorOptions().dtype(type));
      in.read(static_cast<char*>(tensor.data_ptr()), static_cast<std::streamsize>(tensor.nbytes()));
      if (!in) throw Error("truncated checkpoint file " + file.string());
      state.tensors[name] = tensor;
    }
    auto entries = get(in, file);
    for (std::int64_t i = 0; i < entries; ++i) {
      std::string key = get_string(in, file);
      state.metadata[key] = get_string(in, file);
    }
    return state;
  }

 private:
  static void put(CheckpointFileWriter& out, std::int64_t value) {
    out.append(&value, sizeof value);
  }
  static void put_string(CheckpointFileWriter& out, const std::string& text) {
    put(out, static_cast<std::int64_t>(text.size()));
    out.append(text);
  }
  static std::int64_t get(std::istream& in, const fs::path& file) {
    std::int64_t value = 0;
    in.read(reinterpret_cast<char*>(&value), sizeof value);
    if (!in) throw Error("truncated checkpoint file " + file.string());
    return value;
  }
  static std::string get_string(std::istream& in, const fs::path& file) {
    auto size = get(in, file);
    if (size < 0 || size > (1 << 20)) throw Error("malformed checkpoint file " + file.string());
    std::string text(static_cast<std::size_t>(size), '\0');
    in.read(text.data(), size);
    if (!in) throw Error("truncated checkpoint file " + file.string());
    return text;
  }
};

CheckpointState sample_state(int variant = 0) {
  torch::manual_seed(variant);
  CheckpointState state;
  state.shared.tensors["model.weight"] = torch::randn({3, 4});
  state.shared.tensors["model.bias"] = torch::arange(5, torch::kInt64) + variant;
  state.shared.tensors["scalar"] = torch::tensor(2.5 + variant, torch::kFloat64);
  state.shared.metadata["recipe"] = "[run]\nepochs = 1\n";
  state.shared.metadata["variant"] = std::to_string(variant);
  state.local.tensors["rng"] = torch::randint(0, 255, {16}, torch::kUInt8);
  state.local.metadata["rank"] = "0";
  return state;
}

void expect_equal(const StateDict& a, const StateDict& b) {
  EXPECT_EQ(a.metadata, b.metadata);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, tensor] : a.tensors) {
    ASSERT_TRUE(b.tensors.count(name)) << name;
    const torch::Tensor& other = b.tensors.at(name);
    EXPECT_EQ(tensor.dtype(), other.dtype()) << name;
    EXPECT_EQ(tensor.sizes(), other.sizes()) << name;
    EXPECT_TRUE(torch::equal(tensor, other)) << name;
  }
}

class CheckpointStoreTest : public ::testing::Test {
 protected:
  CheckpointStore store(int keep = 0) {
    return CheckpointStore(std::make_shared<RawBackend>(), "raw", dir_ / "checkpoints", keep);
  }
  std::vector<std::string> names(const std::vector<fs::path>& paths) {
    std::vector<std::string> out;
    for (const auto& path : paths) out.push_back(path.filename().string());
    return out;
  }
  TempDir dir_;
};

TEST_F(CheckpointStoreTest, SaveLoadRoundTrip) {
  auto checkpoints = store();
  CheckpointState state = sample_state(1);
  fs::path saved = checkpoints.save(10, state);
  EXPECT_EQ(saved.parent_path(), dir_ / "checkpoints");
  EXPECT_TRUE(fs::is_directory(saved));
  EXPECT_EQ(saved.filename().string().rfind("step-", 0), 0u);
  CheckpointState loaded = checkpoints.load(saved);
  expect_equal(state.shared, loaded.shared);
  expect_equal(state.local, loaded.local);
  // Another store on the same folder reads it as well.
  CheckpointState again = store().load(saved);
  expect_equal(state.shared, again.shared);
}

TEST_F(CheckpointStoreTest, ManifestListsFilesWithSizes) {
  auto checkpoints = store();
  fs::path saved = checkpoints.save(42, sample_state());
  EXPECT_TRUE(fs::exists(saved / "manifest.toml"));
  CheckpointManifest manifest = read_manifest(saved);
  EXPECT_EQ(manifest.step, 42);
  EXPECT_EQ(manifest.backend, "raw");
  EXPECT_EQ(manifest.framework_version, kFrameworkVersion);
  EXPECT_EQ(manifest.world_size, 1);
  ASSERT_EQ(manifest.files.size(), 2u);
  std::set<std::string> listed;
  for (const auto& file : manifest.files) {
    SCOPED_TRACE(file.name);
    listed.insert(file.name);
    ASSERT_TRUE(fs::exists(saved / file.name));
    EXPECT_EQ(file.bytes, static_cast<std::int64_t>(fs::file_size(saved / file.name)));
    EXPECT_GT(file.bytes, 0);
    EXPECT_EQ(fs::path(file.name).extension(), ".raw");
  }
  EXPECT_EQ(listed.size(), 2u);
  // Every file of the folder is either listed or the manifest.
  for (const auto& item : fs::directory_iterator(saved)) {
    std::string name = item.path().filename().string();
    EXPECT_TRUE(name == "manifest.toml" || listed.count(name)) << name;
  }
  EXPECT_NO_THROW(verify_checkpoint(saved, manifest));
}

fs::path shared_file(const fs::path& checkpoint) {
  for (const auto& file : read_manifest(checkpoint).files) {
    if (file.name.rfind("shared", 0) == 0) return checkpoint / file.name;
  }
  ADD_FAILURE() << "no shared file in " << checkpoint;
  return {};
}

TEST_F(CheckpointStoreTest, TruncatedFileIsNamed) {
  auto checkpoints = store();
  fs::path saved = checkpoints.save(1, sample_state());
  fs::path file = shared_file(saved);
  fs::resize_file(file, fs::file_size(file) - 3);
  std::string message = error_of([&] { checkpoints.load(saved); });
  EXPECT_HAS(message, file.filename().string());
  EXPECT_TRUE(message.find("truncated") != std::string::npos ||
              message.find("bytes") != std::string::npos)
      << message;
  // Grown files are caught too.
  fs::path saved2 = checkpoints.save(2, sample_state());
  fs::path file2 = shared_file(saved2);
  std::ofstream(file2, std::ios::binary | std::ios::app) << "extra";
  EXPECT_HAS(error_of([&] { checkpoints.load(saved2); }), file2.filename().string());
}

TEST_F(CheckpointStoreTest, FlippedByteFailsTheChecksum) {
  auto checkpoints = store();
  fs::path saved = checkpoints.save(1, sample_state());
  fs::path file = shared_file(saved);
  {
    std::fstream io(file, std::ios::binary | std::ios::in | std::ios::out);
    io.seekg(static_cast<std::streamoff>(fs::file_size(file) / 2));
    char byte = 0;
    io.read(&byte, 1);
    io.seekp(static_cast<std::streamoff>(fs::file_size(file) / 2));
    byte = static_cast<char>(byte ^ 0x10);
    io.write(&byte, 1);
  }
  std::string message = error_of([&] { checkpoints.load(saved); });
  EXPECT_HAS(message, file.filename().string());
  EXPECT_HAS(message, "checksum");
}

TEST_F(CheckpointStoreTest, MissingManifest) {
  auto checkpoints = store();
  fs::path saved = checkpoints.save(1, sample_state());
  fs::remove(saved / "manifest.toml");
  std::string message = error_of([&] { checkpoints.load(saved); });
  EXPECT_HAS(message, "no manifest");
  EXPECT_HAS(message, saved.filename().string());
}

TEST_F(CheckpointStoreTest, MissingOrCorruptEntries) {
  auto checkpoints = store();
  fs::path saved = checkpoints.save(1, sample_state());
  fs::path file = shared_file(saved);
  fs::remove(file);
  std::string missing = error_of([&] { checkpoints.load(saved); });
  EXPECT_HAS(missing, file.filename().string());
  EXPECT_HAS(missing, "missing");

  fs::path other = checkpoints.save(2, sample_state());
  std::ofstream(other / "manifest.toml", std::ios::trunc) << "step = \"two\"\n";
  std::string corrupt = error_of([&] { checkpoints.load(other); });
  EXPECT_HAS(corrupt, "manifest");
}

TEST_F(CheckpointStoreTest, OtherBackendIsRefused) {
  fs::path saved = store().save(1, sample_state());
  CheckpointStore other(std::make_shared<RawBackend>(), "other", dir_ / "checkpoints", 0);
  std::string message = error_of([&] { other.load(saved); });
  EXPECT_HAS(message, "raw");
  EXPECT_HAS(message, "other");
}

TEST_F(CheckpointStoreTest, LatestValidSkipsCorruptNewest) {
  auto checkpoints = store();
  checkpoints.save(1, sample_state(1));
  fs::path second = checkpoints.save(2, sample_state(2));
  fs::path third = checkpoints.save(3, sample_state(3));
  std::vector<std::string> warnings;
  auto warn = [&](const std::string& message) { warnings.push_back(message); };
  ASSERT_EQ(checkpoints.latest_valid(warn), third);
  EXPECT_TRUE(warnings.empty());

  fs::resize_file(shared_file(third), 10);
  auto latest = checkpoints.latest_valid(warn);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(*latest, second);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_HAS(warnings[0], third.filename().string());
  expect_equal(checkpoints.load(*latest).shared, sample_state(2).shared);

  // A newest checkpoint without its manifest is skipped as well.
  fs::remove(second / "manifest.toml");
  warnings.clear();
  latest = checkpoints.latest_valid(warn);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->filename().string(), names(checkpoints.list()).front());
  EXPECT_EQ(warnings.size(), 2u);
  // Nothing valid: none, and no warning callback needed.
  fs::remove(*latest / "manifest.toml");
  EXPECT_FALSE(checkpoints.latest_valid(nullptr).has_value());
}

TEST_F(CheckpointStoreTest, EmptyOrMissingFolder) {
  auto checkpoints = store();
  EXPECT_TRUE(checkpoints.list().empty());
  EXPECT_FALSE(checkpoints.latest_valid(nullptr).has_value());
  EXPECT_EQ(checkpoints.folder(), dir_ / "checkpoints");
}

TEST_F(CheckpointStoreTest, KeepLeavesTheNewest) {
  auto checkpoints = store(2);
  for (std::int64_t step : {5, 10, 15, 20}) checkpoints.save(step, sample_state());
  auto listed = checkpoints.list();
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(read_manifest(listed[0]).step, 15);
  EXPECT_EQ(read_manifest(listed[1]).step, 20);
  std::size_t entries = 0;
  for (const auto& item : fs::directory_iterator(dir_ / "checkpoints")) {
    ++entries;
    EXPECT_TRUE(item.path() == listed[0] || item.path() == listed[1]) << item.path();
  }
  EXPECT_EQ(entries, 2u);
  // keep = 0 keeps everything.
  auto all = CheckpointStore(std::make_shared<RawBackend>(), "raw", dir_ / "all", 0);
  for (std::int64_t step : {1, 2, 3, 4}) all.save(step, sample_state());
  EXPECT_EQ(all.list().size(), 4u);
}

TEST_F(CheckpointStoreTest, ListIsOldestFirstByStep) {
  auto checkpoints = store();
  for (std::int64_t step : {100, 9, 10, 1000}) checkpoints.save(step, sample_state());
  std::vector<std::int64_t> steps;
  for (const auto& path : checkpoints.list()) steps.push_back(read_manifest(path).step);
  EXPECT_EQ(steps, (std::vector<std::int64_t>{9, 10, 100, 1000}));
}

TEST_F(CheckpointStoreTest, ResavingAStepReplacesIt) {
  auto checkpoints = store();
  checkpoints.save(7, sample_state(1));
  fs::path saved = checkpoints.save(7, sample_state(2));
  EXPECT_EQ(checkpoints.list().size(), 1u);
  expect_equal(checkpoints.load(saved).shared, sample_state(2).shared);
}

TEST_F(CheckpointStoreTest, PartialStagingFoldersAreNeverListed) {
  auto checkpoints = store(1);
  fs::path saved = checkpoints.save(1, sample_state());
  // A save that died before its rename.
  fs::path partial = dir_ / "checkpoints" / ".step-000000005.partial";
  fs::create_directories(partial);
  std::ofstream(partial / "shared.raw") << "half";
  std::ofstream(partial / "manifest.toml") << "step = 5\n";
  // Stray files are not checkpoints either.
  std::ofstream(dir_ / "checkpoints" / "step-notes.txt") << "hello";
  EXPECT_EQ(checkpoints.list(), (std::vector<fs::path>{saved}));
  EXPECT_EQ(checkpoints.latest_valid(nullptr), saved);
  // Retention does not count or delete the staging folder of another save.
  checkpoints.save(2, sample_state());
  auto listed = checkpoints.list();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(read_manifest(listed[0]).step, 2);
  // Saving step 5 again replaces its leftover staging folder and commits.
  fs::path five = checkpoints.save(5, sample_state(5));
  EXPECT_FALSE(fs::exists(partial));
  expect_equal(checkpoints.load(five).shared, sample_state(5).shared);
}

TEST_F(CheckpointStoreTest, MultiProcessNeedsAnAgreementAndAValidPlace) {
  EXPECT_HAS(error_of([&] {
               CheckpointStore(std::make_shared<RawBackend>(), "raw", dir_ / "c", 1,
                               CheckpointPeers{0, 2, {}});
             }),
             "needs a way for ranks to agree");
  EXPECT_HAS(error_of([&] {
               CheckpointStore(std::make_shared<RawBackend>(), "raw", dir_ / "c", 1,
                               CheckpointPeers{2, 2, [](bool ok) { return ok; }});
             }),
             "rank 2 of 2 is not a valid place");
}

}  // namespace
}  // namespace trainyard

namespace trainyard {
namespace {

// In-process stand-in for the collective the engine provides: every "rank" (a thread) calls
// all_ok at the same points; each call returns the AND over all ranks of that round.
class ThreadAgreement {
 public:
  explicit ThreadAgreement(int ranks) : ranks_(ranks) {}
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
  CheckpointPeers peers(int rank) {
    return CheckpointPeers{rank, ranks_, [this](bool ok) { return all_ok(ok); }};
  }

 private:
  int ranks_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  bool round_ok_ = true;
  bool result_ = true;
  std::uint64_t round_ = 0;
};

// Fails every write (a full disk, a dead file system) on the rank it is given to.
class FailingBackend : public RawBackend {
 public:
  void write_to(CheckpointFileWriter& out, const StateDict&) const override {
    throw Error("cannot write " + out.path().string() + ": no space left on device");
  }
};

CheckpointState rank_state(int rank) {
  CheckpointState state = sample_state(7);
  state.local.tensors["rng"] = torch::full({4}, rank, torch::kUInt8);
  state.local.metadata["rank"] = std::to_string(rank);
  return state;
}

// Runs body(rank) on `ranks` threads and returns what each threw (empty when nothing).
template <typename Body>
std::vector<std::string> on_ranks(int ranks, Body body) {
  std::vector<std::string> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (const std::exception& error) {
        errors[static_cast<std::size_t>(rank)] = error.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return errors;
}

class MultiRankCheckpointTest : public ::testing::Test {
 protected:
  TempDir dir_;
};

TEST_F(MultiRankCheckpointTest, AnotherRankCountLoadsEverySavedRanksEntriesForResharding) {
  ThreadAgreement agreement(3);
  std::vector<CheckpointState> states;
  for (int rank = 0; rank < 3; ++rank) states.push_back(rank_state(rank));
  auto errors = on_ranks(3, [&](int rank) {
    CheckpointStore store(std::make_shared<RawBackend>(), "raw", dir_ / "c", 0,
                          agreement.peers(rank));
    store.save(2, states[static_cast<std::size_t>(rank)]);
  });
  for (const auto& error : errors) EXPECT_EQ(error, "");
  // One process reads what three wrote: the shared file, and each saved rank's own entries
  // under its own key, with the saved rank count recorded.
  CheckpointStore one(std::make_shared<RawBackend>(), "raw", dir_ / "c", 0);
  CheckpointState loaded = one.load(dir_ / "c" / "step-000000002");
  expect_equal(StateDict{loaded.shared.tensors, {}}, StateDict{states[0].shared.tensors, {}});
  EXPECT_EQ(loaded.shared.metadata.at(kSavedWorldSizeKey), "3");
  EXPECT_EQ(loaded.local.tensors.count("rng"), 0u);
  for (int rank = 0; rank < 3; ++rank) {
    const auto& rng = loaded.local.tensors.at(saved_rank_key(rank, "rng"));
    EXPECT_TRUE(torch::equal(rng, torch::full({4}, rank, torch::kUInt8))) << rank;
    EXPECT_EQ(loaded.local.metadata.at(saved_rank_key(rank, "rank")), std::to_string(rank));
  }
}

TEST_F(MultiRankCheckpointTest, EveryRankWritesItsFileAndRankZeroTheSharedOneAndManifest) {
  ThreadAgreement agreement(3);
  // Drawn before the threads start: the global generator is not for concurrent use.
  std::vector<CheckpointState> states;
  for (int rank = 0; rank < 3; ++rank) states.push_back(rank_state(rank));
  auto errors = on_ranks(3, [&](int rank) {
    CheckpointStore store(std::make_shared<RawBackend>(), "raw", dir_ / "c", 0,
                          agreement.peers(rank));
    const CheckpointState& state = states[static_cast<std::size_t>(rank)];
    fs::path folder = store.save(4, state);
    EXPECT_EQ(folder.filename(), "step-000000004");
    agreement.all_ok(true);  // every rank has returned from save before anyone loads
    CheckpointState loaded = store.load(folder);
    expect_equal(loaded.local, state.local);
    expect_equal(loaded.shared, states[0].shared);
  });
  for (const auto& error : errors) EXPECT_EQ(error, "");
  CheckpointManifest manifest = read_manifest(dir_ / "c" / "step-000000004");
  EXPECT_EQ(manifest.world_size, 3);
  std::vector<std::string> files;
  for (const auto& file : manifest.files) files.push_back(file.name);
  EXPECT_EQ(files, (std::vector<std::string>{"shared.raw", "rank-00000.raw", "rank-00001.raw",
                                             "rank-00002.raw"}));
}

TEST_F(MultiRankCheckpointTest, OneRankFailingFailsEveryRankAndCommitsNothing) {
  ThreadAgreement agreement(3);
  std::vector<CheckpointState> states;
  for (int rank = 0; rank < 3; ++rank) states.push_back(rank_state(rank));
  auto errors = on_ranks(3, [&](int rank) {
    std::shared_ptr<CheckpointBackend> backend = rank == 1 ? std::make_shared<FailingBackend>()
                                                           : std::make_shared<RawBackend>();
    CheckpointStore store(backend, "raw", dir_ / "c", 0, agreement.peers(rank));
    store.save(4, states[static_cast<std::size_t>(rank)]);
  });
  EXPECT_HAS(errors[1], "no space left on device");
  EXPECT_HAS(errors[0], "checkpoint of step 4 not saved: another rank failed");
  EXPECT_HAS(errors[2], "checkpoint of step 4 not saved: another rank failed");
  EXPECT_TRUE(CheckpointStore(std::make_shared<RawBackend>(), "raw", dir_ / "c", 0).list().empty());
}

TEST_F(MultiRankCheckpointTest, AsyncSavesCommitTogether) {
  ThreadAgreement agreement(2);
  std::vector<CheckpointState> states;
  for (int rank = 0; rank < 2; ++rank) states.push_back(rank_state(rank));
  auto errors = on_ranks(2, [&](int rank) {
    CheckpointStore store(std::make_shared<RawBackend>(), "raw", dir_ / "c", 2,
                          agreement.peers(rank));
    for (std::int64_t step = 1; step <= 3; ++step) {
      store.save_async(step, states[static_cast<std::size_t>(rank)]);  // commits the previous one
    }
    auto last = store.commit_pending();
    ASSERT_TRUE(last);
    EXPECT_EQ(last->filename(), "step-000000003");
  });
  for (const auto& error : errors) EXPECT_EQ(error, "");
  CheckpointStore reader(std::make_shared<RawBackend>(), "raw", dir_ / "c", 0);
  auto listed = reader.list();
  ASSERT_EQ(listed.size(), 2u);  // keep = 2
  EXPECT_EQ(listed.back().filename(), "step-000000003");
}

TEST_F(CheckpointStoreTest, AsyncSaveWritesTheSnapshotNotLaterChanges) {
  auto checkpoints = store();
  CheckpointState state = sample_state(2);
  const CheckpointState expected = snapshot_to_host(state);
  checkpoints.save_async(9, state);
  // Training goes on and changes the tensors in place while the writer runs.
  state.shared.tensors["model.weight"].add_(100);
  state.local.tensors["rng"].zero_();
  EXPECT_TRUE(checkpoints.list().empty()) << "listed before its commit";
  EXPECT_TRUE(checkpoints.has_pending());
  auto folder = checkpoints.commit_pending();
  ASSERT_TRUE(folder);
  EXPECT_FALSE(checkpoints.has_pending());
  CheckpointState loaded = checkpoints.load(*folder);
  expect_equal(loaded.shared, expected.shared);
  expect_equal(loaded.local, expected.local);
  EXPECT_FALSE(checkpoints.commit_pending()) << "nothing pending any more";
}

TEST_F(CheckpointStoreTest, AsyncWriteErrorSurfacesAtCommitAndNothingIsListed) {
  CheckpointStore checkpoints(std::make_shared<FailingBackend>(), "raw", dir_ / "checkpoints", 0);
  checkpoints.save_async(3, sample_state());
  EXPECT_HAS(error_of([&] { checkpoints.commit_pending(); }), "no space left on device");
  EXPECT_TRUE(checkpoints.list().empty());
}

}  // namespace
}  // namespace trainyard
