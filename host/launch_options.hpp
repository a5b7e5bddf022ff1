#pragma once
// The options of `trainyard launch`, apart from the launcher that acts on them.

#include <optional>
#include <string>
#include <vector>

namespace trainyard {

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

// The options that come before the recipe, checked against each other; the recipe and what
// follows it are the run's arguments. nullopt: --help was printed.
std::optional<LaunchOptions> parse_launch_options(const std::vector<std::string>& args);

}  // namespace trainyard
