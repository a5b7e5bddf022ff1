#include "launch_options.hpp"

#include <iostream>

#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

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
                           resuming from the newest valid checkpoint (--resume auto; default 0).
                           With --nnodes > 1 every machine's launcher stops and restarts its
                           ranks together (they agree through machine 0's store)
  --restart-backoff S      seconds before the first restart, doubled for each next one, at
                           most 60 (default 1)
  --min-nproc N            with --max-restarts: a rank that fails is taken as lost and the group
                           restarts on the survivors, down to N ranks, with the gradient
                           accumulation raised to keep the global batch (default: restart at
                           full size). With --nnodes > 1 a machine is lost when its launcher
                           stops beating for 5 s; the job continues on the others (N counts
                           the ranks of all machines)
)";

int parse_int(const std::string& option, const std::string& text) {
  try {
    std::size_t used = 0;
    int value = std::stoi(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw Error("launch: " + option + " needs an integer, got '" + text + "'");
}

double parse_seconds(const std::string& option, const std::string& text) {
  try {
    std::size_t used = 0;
    double value = std::stod(text, &used);
    if (used == text.size() && value >= 0) return value;
  } catch (const std::exception&) {
  }
  throw Error("launch: " + option + " needs a number of seconds >= 0, got '" + text + "'");
}

}  // namespace

std::optional<LaunchOptions> parse_launch_options(const std::vector<std::string>& args) {
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
  if (options.min_nproc < 0 || options.min_nproc > options.nproc * options.nnodes) {
    throw Error("launch: --min-nproc must be in 1..--nproc-per-node x --nnodes");
  }
  if (options.min_nproc > 0 && options.max_restarts == 0) {
    throw Error(
        "launch: --min-nproc needs --max-restarts (the restarts that may shrink the group)");
  }
  options.run_args.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return options;
}

}  // namespace trainyard
