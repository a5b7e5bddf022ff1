#include "launch.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <iostream>
#include <optional>
#include <thread>

#include "trainyard/distributed.hpp"
#include "trainyard/error.hpp"

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

}  // namespace

int command_launch(const std::vector<std::string>& args) {
  int nproc = 0, nnodes = 1, node_rank = 0, port = 0, grace_s = 5;
  std::string address = "127.0.0.1";
  std::size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      return 0;
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
      nproc = parse_int(name, value);
    } else if (name == "--nnodes") {
      nnodes = parse_int(name, value);
    } else if (name == "--node-rank" || name == "--node_rank") {
      node_rank = parse_int(name, value);
    } else if (name == "--master-addr" || name == "--master_addr") {
      address = value;
    } else if (name == "--master-port" || name == "--master_port") {
      port = parse_int(name, value);
    } else if (name == "--grace-period") {
      grace_s = parse_int(name, value);
    } else {
      throw Error("launch: unknown option '" + name + "' (see --help)");
    }
  }
  if (i >= args.size()) throw Error("launch: no recipe given (see --help)");
  if (nproc < 1) throw Error("launch: --nproc-per-node must be >= 1");
  if (nnodes < 1) throw Error("launch: --nnodes must be >= 1");
  if (node_rank < 0 || node_rank >= nnodes) throw Error("launch: --node-rank must be in [0, --nnodes)");
  if (port < 0 || port > 65535) throw Error("launch: --master-port must be in 0..65535");
  if (nnodes > 1 && port == 0) throw Error("launch: --master-port is required when --nnodes > 1");
  if (grace_s < 0) throw Error("launch: --grace-period must be >= 0");
  std::vector<std::string> run_args(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());

  // Machine 0's launcher hosts the store (as torchrun's agent does), so it outlives any rank and
  // can tell what failed.
  c10::intrusive_ptr<c10d::Store> store;
  if (node_rank == 0) {
    auto [hosted, bound] = host_store(address, port, std::chrono::minutes(5));
    store = hosted;
    port = bound;
  }

  const int world = nproc * nnodes;
  std::vector<std::string> base_env;
  for (char** entry = environ; *entry; ++entry) {
    std::string text = *entry;
    std::string key = text.substr(0, text.find('='));
    if (key == "RANK" || key == "LOCAL_RANK" || key == "WORLD_SIZE" || key == "LOCAL_WORLD_SIZE" ||
        key == "MASTER_ADDR" || key == "MASTER_PORT" || key == "GROUP_RANK" ||
        key == kAgentStoreVariable) {
      continue;
    }
    base_env.push_back(text);
  }

  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) sigaction(signal, &action, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  const std::string self = "/proc/self/exe";
  std::vector<Rank> ranks(static_cast<std::size_t>(nproc));
  for (int local = 0; local < nproc; ++local) {
    Rank& r = ranks[static_cast<std::size_t>(local)];
    r.rank = node_rank * nproc + local;
    std::vector<std::string> env = base_env;
    env.push_back("RANK=" + std::to_string(r.rank));
    env.push_back("LOCAL_RANK=" + std::to_string(local));
    env.push_back("WORLD_SIZE=" + std::to_string(world));
    env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(nproc));
    env.push_back("GROUP_RANK=" + std::to_string(node_rank));
    env.push_back("MASTER_ADDR=" + address);
    env.push_back("MASTER_PORT=" + std::to_string(port));
    env.push_back(std::string(kAgentStoreVariable) + "=True");
    std::vector<std::string> argv = {"trainyard", "run"};
    argv.insert(argv.end(), run_args.begin(), run_args.end());

    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      throw Error(std::string("launch: cannot create pipes: ") + std::strerror(errno));
    }
    std::vector<char*> c_argv, c_env;
    for (auto& a : argv) c_argv.push_back(a.data());
    c_argv.push_back(nullptr);
    for (auto& e : env) c_env.push_back(e.data());
    c_env.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) throw Error(std::string("launch: fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      for (int signal : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::signal(signal, SIG_DFL);
      ::execve(self.c_str(), c_argv.data(), c_env.data());
      std::fprintf(stderr, "launch: cannot run %s: %s\n", self.c_str(), std::strerror(errno));
      std::_Exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    r.pid = pid;
    r.out = out[0];
    r.err = err[0];
  }

  std::optional<std::pair<int, int>> first_failure;  // rank, wait status
  std::optional<Clock::time_point> kill_at;
  int forwarded_signal = 0;
  auto stop_others = [&](int signal) {
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
    if (g_signal != 0 && forwarded_signal == 0) {
      forwarded_signal = g_signal;
      std::cerr << "trainyard launch: " << strsignal(forwarded_signal)
                << ": forwarding to the ranks" << std::endl;
      stop_others(forwarded_signal);
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
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && !first_failure && forwarded_signal == 0) {
        first_failure = std::make_pair(r.rank, status);
        std::cerr << "trainyard launch: rank " << r.rank << " " << describe(status) << std::endl;
        if (store) {
          try {
            if (store->check({"trainyard/failure"})) {
              auto value = store->get("trainyard/failure");
              std::string text(value.begin(), value.end());
              std::cerr << "trainyard launch: failure: " << text.substr(text.find('|') + 1)
                        << std::endl;
            }
          } catch (const std::exception&) {
          }
        }
        std::cerr << "trainyard launch: stopping the other ranks" << std::endl;
        stop_others(SIGTERM);
      }
    }
    if (!any_running) break;
    if (kill_at && Clock::now() > *kill_at) {
      for (auto& r : ranks) {
        if (r.running) {
          std::cerr << "trainyard launch: rank " << r.rank << " did not stop within "
                    << grace_s << " s; killing it" << std::endl;
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
  if (first_failure) return exit_code_of(first_failure->second);
  if (forwarded_signal != 0) return 128 + forwarded_signal;
  return 0;
}

}  // namespace trainyard
