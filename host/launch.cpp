#include "launch.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <iostream>
#include <optional>
#include <thread>

#include "group_resize.hpp"
#include "launch_options.hpp"
#include "node_rendezvous.hpp"
#include "progress_watch.hpp"
#include "trainyard/parallel/distributed.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/runtime/heartbeat.hpp"

extern char** environ;

namespace trainyard {
namespace {

using Clock = std::chrono::steady_clock;
// How long the ranks have to write their flight records before the watchdog kills hung ones.
constexpr std::chrono::milliseconds kFlightRecordWait{1500};
constexpr std::chrono::milliseconds kMachinesWatchPeriod{500};

volatile std::sig_atomic_t g_signal = 0;
void on_signal(int signal) { g_signal = signal; }

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  int out = -1;  // read ends of its stdout and stderr
  int err = -1;
  std::string out_partial;
  std::string err_partial;
  bool running = true;
};

// Writes complete lines of `data` (appended to `partial`) to `fd`, each prefixed.
void forward_lines(std::string& partial, const char* data, std::size_t size, const std::string& prefix,
                   int fd, bool flush_all) {
  partial.append(data, size);
  std::size_t start = 0;
  for (;;) {
    std::size_t end = partial.find('\n', start);
    if (end == std::string::npos) break;
    std::string line = prefix + partial.substr(start, end - start + 1);
    [[maybe_unused]] auto written = ::write(fd, line.data(), line.size());
    start = end + 1;
  }
  partial.erase(0, start);
  if (flush_all && !partial.empty()) {
    std::string line = prefix + partial + "\n";
    [[maybe_unused]] auto written = ::write(fd, line.data(), line.size());
    partial.clear();
  }
}

// The signal a rank stopped on, having saved a checkpoint (it exits with 128 + the signal, see
// run.stop_signals), or 0.
int stop_signal_of(int status) {
  if (!WIFEXITED(status) || WEXITSTATUS(status) <= 128) return 0;
  const int signal = WEXITSTATUS(status) - 128;
  for (int stop : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGXCPU}) {
    if (signal == stop) return signal;
  }
  return 0;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "ended";
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// The environment every rank inherits, without the variables each rank gets its own value of.
std::vector<std::string> inherited_environment() {
  std::vector<std::string> env;
  for (char** entry = environ; *entry; ++entry) {
    std::string text = *entry;
    std::string key = text.substr(0, text.find('='));
    if (key == "RANK" || key == "LOCAL_RANK" || key == "WORLD_SIZE" || key == "LOCAL_WORLD_SIZE" ||
        key == "MASTER_ADDR" || key == "MASTER_PORT" || key == "GROUP_RANK" ||
        key == kAgentStoreVariable || key == kRestartAttemptVariable) {
      continue;
    }
    env.push_back(text);
  }
  return env;
}

// One start of the group.
struct GroupStart {
  int attempt = 0;
  int nproc = 0;  // ranks on this machine, and on each other one
  int port = 0;
  int node_rank = 0;  // this machine's place among those taking part
  int nnodes = 1;
  std::vector<std::string> run_args;
};

struct GroupOutcome {
  std::optional<std::pair<int, int>> first_failure;  // rank, wait status
  std::string failure;  // what the failing rank recorded in the store, if anything
  int forwarded_signal = 0;
  // The signal the ranks stopped on, saving a checkpoint (they exit with 128 + it).
  int stopped_by = 0;
  // Ranks that failed on their own (not stopped by the launcher): on a restart that shrinks, the
  // ranks taken as lost.
  int lost = 0;
  // Another machine's group failed (what it reported): this one was stopped for the restart.
  std::string remote_failure;
};

void start_rank(Rank& r, const LaunchOptions& options, const GroupStart& start,
                const std::vector<std::string>& base_env, int local) {
  r.rank = start.node_rank * start.nproc + local;
  std::vector<std::string> env = base_env;
  env.push_back("RANK=" + std::to_string(r.rank));
  env.push_back("LOCAL_RANK=" + std::to_string(local));
  env.push_back("WORLD_SIZE=" + std::to_string(start.nproc * start.nnodes));
  env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(start.nproc));
  env.push_back("GROUP_RANK=" + std::to_string(start.node_rank));
  env.push_back("MASTER_ADDR=" + options.address);
  env.push_back("MASTER_PORT=" + std::to_string(start.port));
  env.push_back(std::string(kAgentStoreVariable) + "=True");
  if (start.attempt > 0) {
    env.push_back(std::string(kRestartAttemptVariable) + "=" + std::to_string(start.attempt));
  }
  std::vector<std::string> argv = {"trainyard", "run"};
  argv.insert(argv.end(), start.run_args.begin(), start.run_args.end());

  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    throw Error(std::string("launch: cannot create pipes: ") + std::strerror(errno));
  }
  std::vector<char*> c_argv, c_env;
  for (auto& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  for (auto& e : env) c_env.push_back(e.data());
  c_env.push_back(nullptr);
  const char* self = "/proc/self/exe";
  pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("launch: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    for (int signal : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::signal(signal, SIG_DFL);
    // The launcher asks for flight records with SIGUSR2: a rank that records none, or has not
    // yet installed its handler, must not die of it. Ignoring is inherited across exec.
    ::signal(SIGUSR2, SIG_IGN);
    ::execve(self, c_argv.data(), c_env.data());
    std::fprintf(stderr, "launch: cannot run %s: %s\n", self, std::strerror(errno));
    std::_Exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  r.pid = pid;
  r.out = out[0];
  r.err = err[0];
}

std::string recorded_failure(const c10::intrusive_ptr<c10d::Store>& store) {
  if (!store) return {};
  try {
    if (store->check({"trainyard/failure"})) {
      auto value = store->get("trainyard/failure");
      std::string text(value.begin(), value.end());
      return text.substr(text.find('|') + 1);
    }
  } catch (const std::exception&) {
  }
  return {};
}

// One start's ranks while the launcher waits for them, and what its rounds over them share: the
// outcome so far, whether it has asked the ranks to stop, and when it kills those that have not.
class GroupRun {
 public:
  GroupRun(const LaunchOptions& options, const GroupStart& start,
           const c10::intrusive_ptr<c10d::Store>& store, NodeRendezvous* nodes)
      : options_(options), start_(start), store_(store), nodes_(nodes) {
    const std::vector<std::string> base_env = inherited_environment();
    ranks_.resize(static_cast<std::size_t>(start.nproc));
    for (int local = 0; local < start.nproc; ++local) {
      start_rank(ranks_[static_cast<std::size_t>(local)], options, start, base_env, local);
    }
    // After the ranks are started: every rank's heartbeat period counts from here.
    if (options.watchdog_s > 0 && store) {
      watch_.emplace(
          std::chrono::milliseconds(static_cast<std::int64_t>(options.watchdog_s * 1000)),
          start.nproc * start.nnodes);
    }
    last_watch_ = Clock::now();
  }

  // Forwards the ranks' output and the launcher's signals until every rank has ended. Each round
  // polls for at most 100 ms, so signals, the watchdog and the grace period are seen in time.
  GroupOutcome wait() {
    for (;;) {
      forward_launcher_signal();
      forward_ready_output();
      if (!reap_ended_ranks()) break;
      watch_other_machines();
      watch_for_hangs();
      kill_past_grace_period();
    }
    for (auto& r : ranks_) drain_rest(r);
    return outcome_;
  }

 private:
  void stop_others(int signal, int grace_s) {
    stopping_ = true;
    for (auto& r : ranks_) {
      if (r.running) ::kill(r.pid, signal);
    }
    if (!kill_at_) kill_at_ = Clock::now() + std::chrono::seconds(grace_s);
  }

  // Forwards what `fd` holds: one read while the rank runs (so that one chatty rank does not hold
  // up the others), everything up to the end once it has ended (final), closing it then.
  void drain(Rank& r, int& fd, std::string& partial, int target, bool final) {
    if (fd < 0) return;
    const std::string prefix = "[rank " + std::to_string(r.rank) + "] ";
    for (;;) {
      ssize_t n = ::read(fd, buffer_, sizeof buffer_);
      if (n > 0) {
        forward_lines(partial, buffer_, static_cast<std::size_t>(n), prefix, target, false);
        if (!final) return;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || final) {
        forward_lines(partial, "", 0, prefix, target, true);
        ::close(fd);
        fd = -1;
      }
      return;
    }
  }

  void drain_rest(Rank& r) {
    drain(r, r.out, r.out_partial, STDOUT_FILENO, true);
    drain(r, r.err, r.err_partial, STDERR_FILENO, true);
  }

  void forward_launcher_signal() {
    if (g_signal != 0 && outcome_.forwarded_signal == 0) {
      outcome_.forwarded_signal = g_signal;
      std::cerr << "trainyard launch: " << strsignal(outcome_.forwarded_signal)
                << ": forwarding to the ranks" << std::endl;
      // The ranks stop at the next step boundary with a checkpoint (run.stop_signals).
      stop_others(outcome_.forwarded_signal, options_.stop_grace_s);
    }
  }

  void forward_ready_output() {
    std::vector<pollfd> fds;
    std::vector<std::pair<Rank*, bool>> owners;  // rank, is stderr
    for (auto& r : ranks_) {
      if (r.out >= 0) {
        fds.push_back({r.out, POLLIN, 0});
        owners.emplace_back(&r, false);
      }
      if (r.err >= 0) {
        fds.push_back({r.err, POLLIN, 0});
        owners.emplace_back(&r, true);
      }
    }
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 100);
    for (std::size_t k = 0; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Rank& r = *owners[k].first;
      if (owners[k].second) {
        drain(r, r.err, r.err_partial, STDERR_FILENO, false);
      } else {
        drain(r, r.out, r.out_partial, STDOUT_FILENO, false);
      }
    }
  }

  // False once no rank is running.
  bool reap_ended_ranks() {
    bool any_running = false;
    for (auto& r : ranks_) {
      if (!r.running) continue;
      int status = 0;
      pid_t done = ::waitpid(r.pid, &status, WNOHANG);
      if (done == 0) {
        any_running = true;
        continue;
      }
      r.running = false;
      drain_rest(r);
      on_rank_ended(r, status);
    }
    return any_running;
  }

  void on_rank_ended(const Rank& r, int status) {
    if (const int signal = stop_signal_of(status)) {
      // Stopped on a signal after saving: the others agreed to stop at the same step.
      outcome_.stopped_by = signal;
      std::cerr << "trainyard launch: rank " << r.rank << " stopped on SIG" << sigabbrev_np(signal)
                << " after saving a checkpoint" << std::endl;
      return;
    }
    const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    // Lost: it failed before the launcher asked anything of it, or was ended by a signal the
    // launcher never sends (SIGKILL from outside, a crash).
    const bool signal_from_outside = WIFSIGNALED(status) && WTERMSIG(status) != SIGTERM &&
                                     WTERMSIG(status) != SIGINT && WTERMSIG(status) != SIGHUP &&
                                     !(kill_at_ && Clock::now() > *kill_at_);
    if (failed && outcome_.forwarded_signal == 0 && (!stopping_ || signal_from_outside)) {
      ++outcome_.lost;
    }
    if (failed && !outcome_.first_failure && outcome_.forwarded_signal == 0) {
      stop_after_first_failure(r, status);
    }
  }

  void stop_after_first_failure(const Rank& r, int status) {
    outcome_.first_failure = std::make_pair(r.rank, status);
    std::cerr << "trainyard launch: rank " << r.rank << " " << describe(status) << std::endl;
    if (nodes_) {
      nodes_->report_failure(start_.attempt, "machine " + std::to_string(options_.node_rank) +
                                                 ": rank " + std::to_string(r.rank) + " " +
                                                 describe(status));
    }
    if (std::string recorded = recorded_failure(store_); !recorded.empty()) {
      outcome_.failure = recorded;
    }
    if (!outcome_.failure.empty()) {
      std::cerr << "trainyard launch: failure: " << outcome_.failure << std::endl;
    }
    std::cerr << "trainyard launch: stopping the other ranks" << std::endl;
    // Their flight records first: one may be stuck in a collective the failed rank never joined.
    for (auto& other : ranks_) {
      if (other.running) ::kill(other.pid, SIGUSR2);
    }
    // A rank that catches SIGTERM (run.stop_signals) ends when its next collective finds the
    // failed rank gone; one that does not within the grace period is killed.
    stop_others(SIGTERM, options_.grace_s);
  }

  // A multi-machine job: another machine's group failed, so this one stops for the restart.
  // Every 500 ms, as the heartbeats.
  void watch_other_machines() {
    if (!nodes_ || stopping_ || !(Clock::now() - last_machines_watch_ > kMachinesWatchPeriod)) {
      return;
    }
    last_machines_watch_ = Clock::now();
    if (auto failure = nodes_->failure(start_.attempt)) {
      outcome_.remote_failure = *failure;
      std::cerr << "trainyard launch: " << *failure << "; stopping this machine's ranks"
                << std::endl;
      stop_others(SIGTERM, options_.grace_s);
    }
  }

  // Every 500 ms rather than every round: reading the heartbeats takes store round trips for each
  // rank. Not once the launcher is stopping the ranks: they stop beating then as expected.
  void watch_for_hangs() {
    if (pending_hang_ && Clock::now() >= *kill_hung_at_) {
      kill_hung_ranks(*pending_hang_);
      pending_hang_.reset();
      return;
    }
    if (pending_hang_ || !watch_ || stopping_ ||
        !(Clock::now() - last_watch_ > std::chrono::milliseconds(500))) {
      return;
    }
    last_watch_ = Clock::now();
    std::optional<Hang> hang;
    try {
      hang = watch_->observe(read_heartbeats(*store_, start_.nproc * start_.nnodes), last_watch_);
    } catch (const std::exception&) {
      // The store answers again on the next round, or the ranks' own monitors end the job.
    }
    if (hang) ask_for_flight_records(*hang);
  }

  // Every rank still running writes its flight record on SIGUSR2 (a frozen one cannot); the
  // hung ones are killed once the others have had time to write.
  void ask_for_flight_records(const Hang& hang) {
    std::cerr << "trainyard launch: watchdog: " << hang.reason
              << "; asking every rank for its flight record (SIGUSR2)" << std::endl;
    for (auto& r : ranks_) {
      if (r.running) ::kill(r.pid, SIGUSR2);
    }
    pending_hang_ = hang;
    kill_hung_at_ = Clock::now() + kFlightRecordWait;
  }

  // SIGKILL, not SIGTERM: a frozen or stuck rank would not get to its next step boundary to stop.
  void kill_hung_ranks(const Hang& hang) {
    std::cerr << "trainyard launch: watchdog: " << hang.reason << "; killing rank"
              << (hang.ranks.size() == 1 ? " " : "s ");
    for (std::size_t k = 0; k < hang.ranks.size(); ++k) {
      std::cerr << (k ? ", " : "") << hang.ranks[k];
    }
    std::cerr << std::endl;
    outcome_.failure = "watchdog: " + hang.reason;
    for (int blamed : hang.ranks) {
      for (auto& r : ranks_) {
        if (r.rank == blamed && r.running) ::kill(r.pid, SIGKILL);
      }
    }
  }

  void kill_past_grace_period() {
    if (kill_at_ && Clock::now() > *kill_at_) {
      for (auto& r : ranks_) {
        if (r.running) {
          std::cerr << "trainyard launch: rank " << r.rank << " did not stop within "
                    << options_.grace_s << " s; killing it" << std::endl;
          ::kill(r.pid, SIGKILL);
        }
      }
      // Killed once: the ranks end now, and the rounds until they are reaped do not repeat it.
      kill_at_ = Clock::now() + std::chrono::hours(1);
    }
  }

  const LaunchOptions& options_;
  const GroupStart& start_;
  const c10::intrusive_ptr<c10d::Store>& store_;
  NodeRendezvous* nodes_;  // a multi-machine job that restarts; null otherwise
  Clock::time_point last_machines_watch_;
  std::vector<Rank> ranks_;
  GroupOutcome outcome_;
  std::optional<ProgressWatch> watch_;
  Clock::time_point last_watch_;
  std::optional<Clock::time_point> kill_at_;
  std::optional<Hang> pending_hang_;  // found by the watchdog, killed at kill_hung_at_
  std::optional<Clock::time_point> kill_hung_at_;
  bool stopping_ = false;  // the launcher has asked the ranks to stop
  char buffer_[65536];
};

// Starts the ranks of one start, forwards their output and signals, and waits for all of them.
GroupOutcome run_group(const LaunchOptions& options, const GroupStart& start,
                       const c10::intrusive_ptr<c10d::Store>& store, NodeRendezvous* nodes) {
  return GroupRun(options, start, store, nodes).wait();
}

// The run arguments of a restart: resume from the newest valid checkpoint (a --resume PATH of
// the first start would go back to where the job began), and the accumulation of a shrunk
// group.
std::vector<std::string> restart_arguments(const std::vector<std::string>& run_args,
                                           std::optional<std::int64_t> grad_accumulation) {
  std::vector<std::string> args;
  for (std::size_t i = 0; i < run_args.size(); ++i) {
    if (run_args[i] == "--resume") {
      ++i;
      continue;
    }
    if (run_args[i].rfind("--resume=", 0) == 0) continue;
    args.push_back(run_args[i]);
  }
  args.insert(args.end(), {"--resume", "auto"});
  if (grad_accumulation) {
    args.insert(args.end(), {"--set", "run.grad_accumulation=" + std::to_string(*grad_accumulation)});
  }
  return args;
}

int exit_code_of(const GroupOutcome& outcome) {
  if (outcome.first_failure) return exit_code_of(outcome.first_failure->second);
  if (outcome.forwarded_signal != 0) return 128 + outcome.forwarded_signal;
  if (!outcome.remote_failure.empty()) return 1;
  if (outcome.stopped_by != 0) return 128 + outcome.stopped_by;
  return 0;
}

// What ended a start, for the restart's log line.
std::string failure_text(const GroupOutcome& outcome) {
  if (!outcome.first_failure) return outcome.remote_failure;
  const auto [rank, status] = *outcome.first_failure;
  return "rank " + std::to_string(rank) + " " + describe(status) +
         (outcome.failure.empty() ? "" : ": " + outcome.failure);
}

}  // namespace

int command_launch(const std::vector<std::string>& args) {
  std::optional<LaunchOptions> parsed = parse_launch_options(args);
  if (!parsed) return 0;
  const LaunchOptions& options = *parsed;

  // Machine 0's launcher hosts the store (as torchrun's agent does), so it outlives any rank and
  // can tell what failed. It serves every start of the group, each under its own prefix. The
  // other machines' launchers join it when they must agree on restarts.
  c10::intrusive_ptr<c10d::Store> store;
  int port = options.port;
  if (options.node_rank == 0) {
    auto [hosted, bound] = host_store(options.address, port, std::chrono::minutes(5));
    store = hosted;
    port = bound;
  } else if (options.max_restarts > 0) {
    Rendezvous meet;
    meet.master_addr = options.address;
    meet.master_port = port;
    store = open_store(meet, false);
  }
  std::unique_ptr<NodeRendezvous> machines;
  if (options.nnodes > 1 && options.max_restarts > 0) {
    machines = std::make_unique<NodeRendezvous>(
        store, options.node_rank,
        NodePlanRules{options.nnodes, options.nproc, options.min_nproc, options.run_args});
  }

  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) sigaction(signal, &action, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  GroupStart start{0, options.nproc, port, options.node_rank, options.nnodes, options.run_args};
  double backoff_s = options.restart_backoff_s;
  for (;;) {
    GroupOutcome outcome =
        run_group(options, start, store_for_attempt(store, start.attempt), machines.get());
    const bool failed = outcome.first_failure || !outcome.remote_failure.empty();
    if (!failed || outcome.forwarded_signal != 0) return exit_code_of(outcome);
    if (start.attempt >= options.max_restarts) {
      if (options.max_restarts > 0) {
        std::cerr << "trainyard launch: giving up after " << options.max_restarts << " restart"
                  << (options.max_restarts == 1 ? "" : "s") << std::endl;
      }
      return exit_code_of(outcome);
    }
    std::optional<std::int64_t> accumulation;
    if (machines) {
      const NodeMembership next = machines->join(start.attempt + 1);
      if (!next.included) {
        std::cerr << "trainyard launch: the restart goes on without this machine ("
                  << next.description << ")" << std::endl;
        return exit_code_of(outcome);
      }
      if (next.nnodes != start.nnodes || next.nproc != start.nproc) {
        std::cerr << "trainyard launch: continuing on " << next.description
                  << " with grad_accumulation " << next.grad_accumulation.value_or(1)
                  << " (the same global batch)" << std::endl;
      }
      start.node_rank = next.node_rank;
      start.nnodes = next.nnodes;
      start.nproc = next.nproc;
      accumulation = next.grad_accumulation;
    } else if (options.min_nproc > 0) {
      const int survivors = start.nproc - std::max(outcome.lost, 1);
      GroupSize size = resize_group(options.run_args, options.nproc, survivors, options.min_nproc);
      if (size.world_size != start.nproc) {
        std::cerr << "trainyard launch: " << outcome.lost << " rank"
                  << (outcome.lost == 1 ? "" : "s") << " lost; continuing on " << size.world_size
                  << " of " << options.nproc << " ranks with grad_accumulation "
                  << size.grad_accumulation << " (the same global batch)" << std::endl;
      }
      start.nproc = size.world_size;
      accumulation = size.grad_accumulation;
    }
    ++start.attempt;
    start.run_args = restart_arguments(options.run_args, accumulation);
    std::cerr << "trainyard launch: restart " << start.attempt << " of " << options.max_restarts
              << " in " << backoff_s << " s (" << failure_text(outcome)
              << "), resuming from the newest valid checkpoint" << std::endl;
    const auto wake = Clock::now() + std::chrono::duration<double>(backoff_s);
    while (Clock::now() < wake && g_signal == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (g_signal != 0) return 128 + g_signal;
    backoff_s = std::min(backoff_s * 2, 60.0);
  }
}

}  // namespace trainyard
