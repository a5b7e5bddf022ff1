#pragma once
// The multi-process runtime around the communicator: where a rank meets the others (the
// environment), the c10d store it meets them through, and how a failed or stuck rank is found
// and named so that no rank ever waits forever.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "trainyard/api/batch.hpp"
#include "trainyard/api/communicator.hpp"

namespace trainyard {

// The rendezvous the environment describes: the torchrun variables (RANK, LOCAL_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), else Slurm's (SLURM_PROCID,
// SLURM_LOCALID, SLURM_NTASKS, SLURM_NTASKS_PER_NODE or SLURM_STEP_NUM_TASKS, with MASTER_ADDR
// and MASTER_PORT from the environment). nullopt when neither is set: a single-process run.
// Throws Error naming the variable when a value is malformed or inconsistent.
std::optional<Rendezvous> rendezvous_from_environment();

// Set (to "True", as torchrun's agent does) when a launcher hosts the store, so rank 0 connects
// to it instead of starting its own.
constexpr const char* kAgentStoreVariable = "TORCHELASTIC_USE_AGENT_STORE";

// Set by `trainyard launch` to the number of the group's current start (0 for the first, 1
// after the first restart, ...). Each start's ranks meet under their own store prefix, so keys
// left by an earlier start (heartbeats, a recorded failure, process-group rendezvous counters)
// never reach the next one.
constexpr const char* kRestartAttemptVariable = "TRAINYARD_RESTART_ATTEMPT";

// `store` as the ranks of start `attempt` see it: itself for the first start, else a view under
// the prefix "trainyard/attempt<N>".
c10::intrusive_ptr<c10d::Store> store_for_attempt(c10::intrusive_ptr<c10d::Store> store,
                                                  int attempt);

// The start this process belongs to, from kRestartAttemptVariable (0 when unset).
int restart_attempt_from_environment();

// A TCP socket listening on `address` only (never on every interface), port 0 letting the
// kernel pick a free one. Throws Error naming the address.
struct ListeningSocket {
  int fd = -1;
  int port = 0;
};
ListeningSocket listen_on(const std::string& address, int port);

// The job's c10d TCPStore on `rendezvous`: its server when `host` (listening on master_addr
// only), else a client. Waits up to the rendezvous timeout for the server.
c10::intrusive_ptr<c10d::Store> open_store(const Rendezvous& rendezvous, bool host);

// A store server for a launcher: listens on `address`:`port` (0: a free port), returns the
// store and the port it listens on.
std::pair<c10::intrusive_ptr<c10d::Store>, int> host_store(const std::string& address, int port,
                                                           std::chrono::milliseconds timeout);

// Marks the calling thread as waiting on a collective for the scope's lifetime, so a peer that
// times out can tell a stuck rank (not waiting) from a slow one. An exception leaving the scope
// records that a collective failed in this process (see collective_failed()).
class CollectiveWait {
 public:
  CollectiveWait();
  ~CollectiveWait();
  CollectiveWait(const CollectiveWait&) = delete;
  CollectiveWait& operator=(const CollectiveWait&) = delete;

 private:
  int exceptions_;
};
bool collective_failed();

// Watches the other ranks through the store: publishes this rank's heartbeat (alive, step,
// waiting in a collective or not, finished), records the first failure of the job (first
// reporter wins), names the rank behind a failed collective, and ends this process when another
// rank has reported a failure and this one has not ended by itself within a grace period, or
// when a peer's heartbeat stops for longer than the timeout (a dead or frozen process).
class FailureMonitor {
 public:
  // `hosts_store`: the store lives in this process (rank 0 started without a launcher).
  FailureMonitor(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                 std::chrono::milliseconds timeout, bool hosts_store);
  ~FailureMonitor();
  FailureMonitor(const FailureMonitor&) = delete;
  FailureMonitor& operator=(const FailureMonitor&) = delete;

  void set_step(std::int64_t step) { step_.store(step); }
  // Records `message` as the job's failure unless one is recorded already.
  void report(const std::string& message);
  // The recorded failure, if any.
  std::optional<std::string> failure();
  // Why a collective of this rank failed: the recorded failure, else the ranks whose heartbeat
  // stopped, else the live ranks that are not waiting in a collective. Empty when unknown.
  std::string diagnose();
  // After a failure, keeps a store-hosting process alive long enough for the others to read it.
  void linger();
  // This rank ended cleanly: peers stop watching it. Stops the heartbeat thread.
  void finish();

 private:
  void run();
  void beat();
  void watch();

  c10::intrusive_ptr<c10d::Store> store_;  // this thread's own connection
  int rank_;
  int world_size_;
  std::chrono::milliseconds timeout_;
  bool hosts_store_;
  std::atomic<std::int64_t> step_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  std::int64_t beats_ = 0;
  std::thread thread_;
  struct Peers;
  std::unique_ptr<Peers> peers_;
};

// Rethrows the exception in flight as an Error naming the rank that failed: this rank's own
// failure is recorded for the others; a failed collective is attributed with diagnose().
[[noreturn]] void rethrow_naming_failed_rank(FailureMonitor& monitor, int rank);

// Test hook (documented in docs/multi-process.md): when TRAINYARD_TEST_FAIL_RANK equals `rank` and
// TRAINYARD_TEST_FAIL_AT_STEP equals `step`, the process exits with status 3
// (TRAINYARD_TEST_FAIL_MODE=exit, the default), stops calling collectives forever (=hang) or
// crashes with a segmentation fault (=crash), kills itself with SIGKILL (=kill), freezes with
// SIGSTOP (=stop), or sends itself SIGTERM and carries on (=term).
// TRAINYARD_TEST_FAIL_PLAN="A:R:S[,A:R:S...]" instead fails rank R before step S in the group's
// start number A only (see kRestartAttemptVariable), so a restarted group meets each failure
// once.
void test_failure_hook(int rank, std::int64_t step);

// Writes `tensors` as a pickled dict of name -> tensor (torch.load / torch::pickle_load read it).
void write_tensor_file(const std::filesystem::path& file, const TensorMap& tensors);
TensorMap read_tensor_file(const std::filesystem::path& file);

}  // namespace trainyard
