#pragma once
// What a collective costs on this machine, for the planner's step time: the communicator's fixed
// time per collective and its seconds per byte each rank moves, measured once per host,
// communicator plugin and rank count with that many ranks as processes over the loopback (ring
// all-gathers and all-reduces of a small and a large tensor, each after some compute, as in a
// step), and cached in a small file that later plans reuse. All-reduces and messages between two
// ranks get figures of their own: a communicator may run them on a faster path than the link
// (among ranks of one host, through shared memory), and the plan prices each on the path it
// takes.

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace trainyard {

class Registry;

struct LinkCost {
  double latency_seconds = 0;   // a collective that moves (almost) nothing
  double seconds_per_byte = 0;  // per byte a rank moves (ring: 2 (n-1)/n of an all-reduce's,
                                // (n-1)/n of an all-gather's result)
  double reduce_latency_seconds = 0;  // the same two of all-reduces
  double reduce_seconds_per_byte = 0;
  double message_latency_seconds = 0;  // and of a message from one rank to another
  double message_seconds_per_byte = 0;
  int ranks = 0;                // measured with (0: no link, one process)
  bool cached = false;          // read from the cache rather than measured now
  std::filesystem::path cache_file;

  double seconds(double calls, double bytes) const {
    return calls * latency_seconds + bytes * seconds_per_byte;
  }
  double reduce_seconds(double calls, double bytes) const {
    return calls * reduce_latency_seconds + bytes * reduce_seconds_per_byte;
  }
  double message_seconds(double calls, double bytes) const {
    return calls * message_latency_seconds + bytes * message_seconds_per_byte;
  }
};

// Where link costs are cached: $TRAINYARD_CACHE/links, else ~/.cache/trainyard/links.
std::filesystem::path link_cache_folder();

// Measures the link of `ranks` ranks (at least 2) of communicator `plugin`, loaded in
// `registry`: starts this binary's `link-probe` command once per rank. Throws Error when a rank
// fails or the ranks cannot connect.
LinkCost measure_link(const Registry& registry, const std::string& plugin, int ranks);

// The cached cost for (this host, plugin, ranks) in `folder`, or measured and cached (written
// atomically; a folder that cannot be written only costs the cache, `warn` says so).
LinkCost cached_or_measured_link(const Registry& registry, const std::string& plugin, int ranks,
                                 const std::filesystem::path& folder,
                                 const std::function<void(const std::string&)>& warn);

// One rank of measure_link's probe, in a process of its own (the `link-probe` command, which
// only measure_link starts): connects, times the all-gathers, all-reduces and messages, and rank
// 0 writes their mean times to --out.
int command_link_probe(const std::vector<std::string>& args, Registry& registry);

}  // namespace trainyard
