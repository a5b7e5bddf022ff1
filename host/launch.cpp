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
#include "progress_watch.hpp"
#include "trainyard/distributed.hpp"
#include "trainyard/error.hpp"
#include "trainyard/runtime/heartbeat.hpp"

extern char** environ;

namespace trainyard {
namespace {

using Clock = std::chrono::steady_clock;

const char* kUsage =
    R"(usage: trainyard launch --nproc-per-node N [options] RECIPE [run options]

Starts N ranks of 'trainyard run RECIPE [run options]' on this machine with the torchrun
variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Each output
line is prefixed with its rank; the first rank that fails stops the others and its exit status
is the launcher's.

options:
  -n, --nproc-per-node N   ranks on this machine (required)
  --nnodes M               machines in the job (default 1)
  --node-rank R            this machine's index (default 0; machine 0 hosts the store)
  --master-addr A          address of machine 0; the store listens there only (default 127.0.0.1)
  --master-port P          port of the store (default: a free port; required when --nnodes > 1)
  --grace-period S         seconds the other ranks get to stop before SIGKILL (default 5)
  --stop-grace-period S    seconds the ranks get to save and stop after the launcher forwards
                           SIGTERM, SIGINT or SIGHUP to them, before SIGKILL (default 120)
  --watchdog S             a rank whose heartbeat stops (frozen, SIGSTOP) or a group in which
                           no rank begins a step for S seconds is a failure: the launcher kills
                           the stuck ranks (then restarts with --max-restarts). Longer than the
                           longest evaluation or checkpoint save (default 0: off)
  --max-restarts K         when a rank fails, stop the group and start it again, up to K times,
                           resuming from the newest valid checkpoint (--resume auto; default 0)
  --restart-backoff S      seconds before the first restart, doubled for each next one, at
                           most 60 (default 1)
  --min-nproc N            with --max-restarts: a rank that fails is taken as lost and the group
                           restarts on the survivors, down to N ranks, with the gradient
                           accumulation raised to keep the global batch (default: restart at
                           full size)
)";

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

int parse_int(const std::string& option, const std::string& text) {
  try {
    std::size_t used = 0;
    int value = std::stoi(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw Error("launch: " + option + " needs an integer, got '" + text + "'");
}

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

struct LaunchOptions {
  int nproc = 0;
  int nnodes = 1;
  int node_rank = 0;
  std::string address = "127.0.0.1";
  int port = 0;
  int grace_s = 5;
  int stop_grace_s = 120;
  double watchdog_s = 0;  // 0: off
  int max_restarts = 0;
  double restart_backoff_s = 1;
  int min_nproc = 0;  // 0: restart at full size
  std::vector<std::string> run_args;
};

double parse_seconds(const std::string& option, const std::string& text) {
  try {
    std::size_t used = 0;
    double value = std::stod(text, &used);
    if (used == text.size() && value >= 0) return value;
  } catch (const std::exception&) {
  }
  throw Error("launch: " + option + " needs a number of seconds >= 0, got '" + text + "'");
}

// nullopt: --help was printed.
std::optional<LaunchOptions> parse_options(const std::vector<std::string>& args) {
  LaunchOptions options;
  std::size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      return std::nullopt;
    }
    if (arg.rfind("-", 0) != 0) break;
    std::string name = arg, value;
    if (auto equals = arg.find('='); equals != std::string::npos) {
      name = arg.substr(0, equals);
      value = arg.substr(equals + 1);
    } else {
      if (i + 1 >= args.size()) throw Error("launch: " + arg + " needs a value (see --help)");
      value = args[++i];
    }
    if (name == "-n" || name == "--nproc-per-node" || name == "--nproc_per_node") {
      options.nproc = parse_int(name, value);
    } else if (name == "--nnodes") {
      options.nnodes = parse_int(name, value);
    } else if (name == "--node-rank" || name == "--node_rank") {
      options.node_rank = parse_int(name, value);
    } else if (name == "--master-addr" || name == "--master_addr") {
      options.address = value;
    } else if (name == "--master-port" || name == "--master_port") {
      options.port = parse_int(name, value);
    } else if (name == "--grace-period") {
      options.grace_s = parse_int(name, value);
    } else if (name == "--stop-grace-period") {
      options.stop_grace_s = parse_int(name, value);
    } else if (name == "--watchdog") {
      options.watchdog_s = parse_seconds(name, value);
    } else if (name == "--max-restarts" || name == "--max_restarts") {
      options.max_restarts = parse_int(name, value);
    } else if (name == "--restart-backoff") {
      options.restart_backoff_s = parse_seconds(name, value);
    } else if (name == "--min-nproc" || name == "--min_nproc") {
      options.min_nproc = parse_int(name, value);
    } else {
      throw Error("launch: unknown option '" + name + "' (see --help)");
    }
  }
  if (i >= args.size()) throw Error("launch: no recipe given (see --help)");
  if (options.nproc < 1) throw Error("launch: --nproc-per-node must be >= 1");
  if (options.nnodes < 1) throw Error("launch: --nnodes must be >= 1");
  if (options.node_rank < 0 || options.node_rank >= options.nnodes) {
    throw Error("launch: --node-rank must be in [0, --nnodes)");
  }
  if (options.port < 0 || options.port > 65535) {
    throw Error("launch: --master-port must be in 0..65535");
  }
  if (options.nnodes > 1 && options.port == 0) {
    throw Error("launch: --master-port is required when --nnodes > 1");
  }
  if (options.grace_s < 0) throw Error("launch: --grace-period must be >= 0");
  if (options.stop_grace_s < 0) throw Error("launch: --stop-grace-period must be >= 0");
  if (options.max_restarts < 0) throw Error("launch: --max-restarts must be >= 0");
  if (options.min_nproc < 0 || options.min_nproc > options.nproc) {
    throw Error("launch: --min-nproc must be in 1..--nproc-per-node");
  }
  if (options.min_nproc > 0 && options.max_restarts == 0) {
    throw Error("launch: --min-nproc needs --max-restarts (the restarts that may shrink the group)");
  }
  if (options.nnodes > 1 && options.max_restarts > 0) {
    throw Error("launch: --max-restarts restarts the ranks of one machine; with --nnodes > 1 "
                "restart the job from the scheduler (--resume auto continues it)");
  }
  options.run_args.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return options;
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
  int nproc = 0;  // ranks on this machine
  int port = 0;
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
};

void start_rank(Rank& r, const LaunchOptions& options, const GroupStart& start,
                const std::vector<std::string>& base_env, int local) {
  r.rank = options.node_rank * start.nproc + local;
  std::vector<std::string> env = base_env;
  env.push_back("RANK=" + std::to_string(r.rank));
  env.push_back("LOCAL_RANK=" + std::to_string(local));
  env.push_back("WORLD_SIZE=" + std::to_string(start.nproc * options.nnodes));
  env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(start.nproc));
  env.push_back("GROUP_RANK=" + std::to_string(options.node_rank));
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

// Starts the ranks of one start, forwards their output and signals, and waits for all of them.
GroupOutcome run_group(const LaunchOptions& options, const GroupStart& start,
                       const c10::intrusive_ptr<c10d::Store>& store) {
  const std::vector<std::string> base_env = inherited_environment();
  std::vector<Rank> ranks(static_cast<std::size_t>(start.nproc));
  for (int local = 0; local < start.nproc; ++local) {
    start_rank(ranks[static_cast<std::size_t>(local)], options, start, base_env, local);
  }

  GroupOutcome outcome;
  std::optional<ProgressWatch> watch;
  if (options.watchdog_s > 0 && store) {
    watch.emplace(std::chrono::milliseconds(static_cast<std::int64_t>(options.watchdog_s * 1000)),
                  start.nproc * options.nnodes);
  }
  auto last_watch = Clock::now();
  std::optional<Clock::time_point> kill_at;
  bool stopping = false;  // the launcher has asked the ranks to stop
  auto stop_others = [&](int signal, int grace_s) {
    stopping = true;
    for (auto& r : ranks) {
      if (r.running) ::kill(r.pid, signal);
    }
    if (!kill_at) kill_at = Clock::now() + std::chrono::seconds(grace_s);
  };
  char buffer[65536];
  auto drain = [&](Rank& r, int& fd, std::string& partial, int target, bool final) {
    if (fd < 0) return;
    const std::string prefix = "[rank " + std::to_string(r.rank) + "] ";
    for (;;) {
      ssize_t n = ::read(fd, buffer, sizeof buffer);
      if (n > 0) {
        forward_lines(partial, buffer, static_cast<std::size_t>(n), prefix, target, false);
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
  };

  for (;;) {
    if (g_signal != 0 && outcome.forwarded_signal == 0) {
      outcome.forwarded_signal = g_signal;
      std::cerr << "trainyard launch: " << strsignal(outcome.forwarded_signal)
                << ": forwarding to the ranks" << std::endl;
      // The ranks stop at the next step boundary with a checkpoint (run.stop_signals).
      stop_others(outcome.forwarded_signal, options.stop_grace_s);
    }
    std::vector<pollfd> fds;
    std::vector<std::pair<Rank*, bool>> owners;  // rank, is stderr
    for (auto& r : ranks) {
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
    bool any_running = false;
    for (auto& r : ranks) {
      if (!r.running) continue;
      int status = 0;
      pid_t done = ::waitpid(r.pid, &status, WNOHANG);
      if (done == 0) {
        any_running = true;
        continue;
      }
      r.running = false;
      drain(r, r.out, r.out_partial, STDOUT_FILENO, true);
      drain(r, r.err, r.err_partial, STDERR_FILENO, true);
      if (const int signal = stop_signal_of(status)) {
        // Stopped on a signal after saving: the others agreed to stop at the same step.
        outcome.stopped_by = signal;
        std::cerr << "trainyard launch: rank " << r.rank << " stopped on SIG" << sigabbrev_np(signal)
                  << " after saving a checkpoint" << std::endl;
        continue;
      }
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      // Lost: it failed before the launcher asked anything of it, or was ended by a signal the
      // launcher never sends (SIGKILL from outside, a crash).
      const bool signal_from_outside =
          WIFSIGNALED(status) && WTERMSIG(status) != SIGTERM && WTERMSIG(status) != SIGINT &&
          WTERMSIG(status) != SIGHUP && !(kill_at && Clock::now() > *kill_at);
      if (failed && outcome.forwarded_signal == 0 && (!stopping || signal_from_outside)) {
        ++outcome.lost;
      }
      if (failed && !outcome.first_failure && outcome.forwarded_signal == 0) {
        outcome.first_failure = std::make_pair(r.rank, status);
        std::cerr << "trainyard launch: rank " << r.rank << " " << describe(status) << std::endl;
        if (std::string recorded = recorded_failure(store); !recorded.empty()) {
          outcome.failure = recorded;
        }
        if (!outcome.failure.empty()) {
          std::cerr << "trainyard launch: failure: " << outcome.failure << std::endl;
        }
        std::cerr << "trainyard launch: stopping the other ranks" << std::endl;
        // A rank that catches SIGTERM (run.stop_signals) ends when its next collective finds the
        // failed rank gone; one that does not within the grace period is killed.
        stop_others(SIGTERM, options.grace_s);
      }
    }
    if (!any_running) break;
    if (watch && !stopping && Clock::now() - last_watch > std::chrono::milliseconds(500)) {
      last_watch = Clock::now();
      std::optional<Hang> hang;
      try {
        hang = watch->observe(read_heartbeats(*store, start.nproc * options.nnodes), last_watch);
      } catch (const std::exception&) {
        // The store answers again on the next round, or the ranks' own monitors end the job.
      }
      if (hang) {
        std::cerr << "trainyard launch: watchdog: " << hang->reason << "; killing rank"
                  << (hang->ranks.size() == 1 ? " " : "s ");
        for (std::size_t k = 0; k < hang->ranks.size(); ++k) {
          std::cerr << (k ? ", " : "") << hang->ranks[k];
        }
        std::cerr << std::endl;
        outcome.failure = "watchdog: " + hang->reason;
        for (int blamed : hang->ranks) {
          for (auto& r : ranks) {
            if (r.rank == blamed && r.running) ::kill(r.pid, SIGKILL);
          }
        }
      }
    }
    if (kill_at && Clock::now() > *kill_at) {
      for (auto& r : ranks) {
        if (r.running) {
          std::cerr << "trainyard launch: rank " << r.rank << " did not stop within "
                    << options.grace_s << " s; killing it" << std::endl;
          ::kill(r.pid, SIGKILL);
        }
      }
      kill_at = Clock::now() + std::chrono::hours(1);
    }
  }
  for (auto& r : ranks) {
    drain(r, r.out, r.out_partial, STDOUT_FILENO, true);
    drain(r, r.err, r.err_partial, STDERR_FILENO, true);
  }
  return outcome;
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
  if (outcome.stopped_by != 0) return 128 + outcome.stopped_by;
  return 0;
}

}  // namespace

int command_launch(const std::vector<std::string>& args) {
  std::optional<LaunchOptions> parsed = parse_options(args);
  if (!parsed) return 0;
  const LaunchOptions& options = *parsed;

  // Machine 0's launcher hosts the store (as torchrun's agent does), so it outlives any rank and
  // can tell what failed. It serves every start of the group, each under its own prefix.
  c10::intrusive_ptr<c10d::Store> store;
  int port = options.port;
  if (options.node_rank == 0) {
    auto [hosted, bound] = host_store(options.address, port, std::chrono::minutes(5));
    store = hosted;
    port = bound;
  }

  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) sigaction(signal, &action, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  GroupStart start{0, options.nproc, port, options.run_args};
  double backoff_s = options.restart_backoff_s;
  for (;;) {
    GroupOutcome outcome = run_group(options, start, store_for_attempt(store, start.attempt));
    if (!outcome.first_failure || outcome.forwarded_signal != 0) return exit_code_of(outcome);
    if (start.attempt >= options.max_restarts) {
      if (options.max_restarts > 0) {
        std::cerr << "trainyard launch: giving up after " << options.max_restarts << " restart"
                  << (options.max_restarts == 1 ? "" : "s") << std::endl;
      }
      return exit_code_of(outcome);
    }
    const auto [failed_rank, status] = *outcome.first_failure;
    std::optional<std::int64_t> accumulation;
    if (options.min_nproc > 0) {
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
              << " in " << backoff_s << " s (rank " << failed_rank << " " << describe(status)
              << (outcome.failure.empty() ? "" : ": " + outcome.failure)
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
