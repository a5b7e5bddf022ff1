#pragma once
// How the launchers of a multi-machine job agree on restarts (`--nnodes M --max-restarts K`),
// through the store machine 0's launcher hosts, as torchrun's c10d rendezvous does: a launcher
// whose group fails says so, and the others stop theirs; every live launcher then joins the next
// start, and machine 0's decides who takes part. A machine whose launcher stops beating (the
// machine or its launcher is gone) is lost: with --min-nproc the job continues on the others
// with the gradient accumulation that keeps the global batch; without it the job ends. A live
// machine always offers all its ranks again: a rank that died is started afresh where it ran.
// The store lives with machine 0's launcher, so losing machine 0 ends the job.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace trainyard {

// Who runs the start of one attempt, from this machine's point of view.
struct NodeMembership {
  bool included = true;  // false: this machine is not part of it (it should exit)
  int node_rank = 0;     // this machine's place among those taking part
  int nnodes = 1;        // machines taking part
  int nproc = 1;         // ranks on each of them
  std::optional<std::int64_t> grad_accumulation;  // when the world shrank
  std::string description;                        // "machines 0, 1 x 2 ranks"
};

// What the coordinator needs to decide a start: the job as launched.
struct NodePlanRules {
  int nnodes = 1;
  int nproc = 1;      // ranks per machine as launched
  int min_nproc = 0;  // 0: every machine must take part; else the fewest ranks in all
  std::vector<std::string> run_args;
};

class NodeRendezvous {
 public:
  // Beats under this machine's launch rank (`node_rank` as launched) from a thread of its own.
  NodeRendezvous(c10::intrusive_ptr<c10d::Store> store, int node_rank, NodePlanRules rules);
  ~NodeRendezvous();
  NodeRendezvous(const NodeRendezvous&) = delete;
  NodeRendezvous& operator=(const NodeRendezvous&) = delete;

  // This machine's group failed in `attempt`: the first report of an attempt is kept.
  void report_failure(int attempt, const std::string& what);
  // Another machine's report for `attempt`, if any (store errors read as none).
  std::optional<std::string> failure(int attempt);

  // Joins the start of `attempt` and waits for machine 0's decision (made by this object on
  // machine 0). Throws Error when the job cannot continue (a machine lost without --min-nproc,
  // too few ranks left, machine 0 gone).
  NodeMembership join(int attempt);

 private:
  void beat_until_stopped();
  std::string decide(int attempt);

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Store> beat_store_;  // the beat thread's own connection
  int node_rank_;
  NodePlanRules rules_;
  std::atomic<bool> stop_{false};
  std::thread beat_;
};

}  // namespace trainyard
