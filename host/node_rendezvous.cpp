#include "node_rendezvous.hpp"

#include <chrono>
#include <iostream>
#include <map>
#include <sstream>

#include "group_resize.hpp"
#include "trainyard/api/error.hpp"

namespace trainyard {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kBeatInterval{250};
// A launcher that has not beaten for this long is gone, with its machine's ranks.
constexpr std::chrono::seconds kLostAfter{5};
// How long a start waits for its machines and its decision before the job gives up.
constexpr std::chrono::seconds kJoinTimeout{180};

std::vector<uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }
std::string text_of(const std::vector<uint8_t>& value) { return {value.begin(), value.end()}; }

std::string beat_key(int node) { return "trainyard/launch/beat/" + std::to_string(node); }
std::string attempt_key(int attempt, const std::string& what) {
  return "trainyard/launch/" + std::to_string(attempt) + "/" + what;
}

std::string machines_text(const std::vector<int>& nodes) {
  std::string out = nodes.size() == 1 ? "machine " : "machines ";
  for (std::size_t k = 0; k < nodes.size(); ++k) out += (k ? ", " : "") + std::to_string(nodes[k]);
  return out;
}

// The ranks per machine and accumulation that keep the global batch on `machines` machines, the
// most ranks first; throws Error when none reaches rules.min_nproc in all.
std::pair<int, std::int64_t> shrunk_size(const NodePlanRules& rules, int machines) {
  std::string reason = "fewer than --min-nproc " + std::to_string(rules.min_nproc) + " ranks left";
  for (int per_machine = rules.nproc; per_machine >= 1; --per_machine) {
    const int world = per_machine * machines;
    if (world < rules.min_nproc) break;
    try {
      const GroupSize size = resize_group(rules.run_args, rules.nproc * rules.nnodes, world, world);
      return {per_machine, size.grad_accumulation};
    } catch (const Error& error) {
      reason = error.what();
    }
  }
  throw Error(reason);
}

}  // namespace

NodeRendezvous::NodeRendezvous(c10::intrusive_ptr<c10d::Store> store, int node_rank,
                               NodePlanRules rules)
    : store_(std::move(store)),
      beat_store_(store_->clone()),
      node_rank_(node_rank),
      rules_(std::move(rules)) {
  beat_ = std::thread([this] { beat_until_stopped(); });
}

NodeRendezvous::~NodeRendezvous() {
  stop_ = true;
  if (beat_.joinable()) beat_.join();
}

void NodeRendezvous::beat_until_stopped() {
  std::int64_t beats = 0;
  while (!stop_) {
    try {
      beat_store_->set(beat_key(node_rank_), bytes(std::to_string(++beats)));
    } catch (const std::exception&) {
      // Machine 0's launcher has gone: join() says so when it is next needed.
    }
    std::this_thread::sleep_for(kBeatInterval);
  }
}

void NodeRendezvous::report_failure(int attempt, const std::string& what) {
  try {
    store_->compareSet(attempt_key(attempt, "failed"), {}, bytes(what));
  } catch (const std::exception&) {
  }
}

std::optional<std::string> NodeRendezvous::failure(int attempt) {
  try {
    const std::string key = attempt_key(attempt, "failed");
    if (store_->check({key})) return text_of(store_->get(key));
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// Machine 0: waits until every machine has joined or stopped beating, then writes the plan
// ("ok NODES NPROC ACCUMULATION" or "error WHY").
std::string NodeRendezvous::decide(int attempt) {
  std::map<int, std::string> last_beat;
  std::map<int, Clock::time_point> changed;
  const auto deadline = Clock::now() + kJoinTimeout;
  std::vector<int> joined, lost;
  for (;;) {
    joined.clear();
    lost.clear();
    const auto now = Clock::now();
    for (int node = 0; node < rules_.nnodes; ++node) {
      if (store_->check({attempt_key(attempt, "join/" + std::to_string(node))})) {
        joined.push_back(node);
        continue;
      }
      const std::string beat =
          store_->check({beat_key(node)}) ? text_of(store_->get(beat_key(node))) : "";
      if (!changed.count(node) || beat != last_beat[node]) {
        last_beat[node] = beat;
        changed[node] = now;
      } else if (now - changed[node] > kLostAfter) {
        lost.push_back(node);
      }
    }
    if (joined.size() + lost.size() == static_cast<std::size_t>(rules_.nnodes)) break;
    if (now > deadline) return "error machines did not join the restart within 180 s";
    std::this_thread::sleep_for(kBeatInterval);
  }
  std::ostringstream nodes;
  for (std::size_t k = 0; k < joined.size(); ++k) nodes << (k ? "," : "") << joined[k];
  if (lost.empty()) return "ok " + nodes.str() + " " + std::to_string(rules_.nproc) + " 0";
  if (rules_.min_nproc == 0) {
    return "error " + machines_text(lost) +
           " lost (its launcher stopped); without --min-nproc the job restarts only whole";
  }
  try {
    const auto [per_machine, accumulation] = shrunk_size(rules_, static_cast<int>(joined.size()));
    return "ok " + nodes.str() + " " + std::to_string(per_machine) + " " +
           std::to_string(accumulation);
  } catch (const Error& error) {
    return "error " + machines_text(lost) +
           " lost and the rest cannot keep the global batch: " + error.what();
  }
}

NodeMembership NodeRendezvous::join(int attempt) {
  const std::string plan_key = attempt_key(attempt, "plan");
  std::string plan;
  try {
    store_->set(attempt_key(attempt, "join/" + std::to_string(node_rank_)), bytes("1"));
    if (node_rank_ == 0) store_->set(plan_key, bytes(decide(attempt)));
    store_->wait({plan_key}, std::chrono::duration_cast<std::chrono::milliseconds>(kJoinTimeout));
    plan = text_of(store_->get(plan_key));
  } catch (const std::exception& error) {
    throw Error(
        "launch: the restart's rendezvous failed (machine 0's launcher, which hosts the "
        "store, is gone?): " +
        std::string(error.what()).substr(0, 200));
  }
  if (plan.rfind("error ", 0) == 0) throw Error("launch: cannot restart: " + plan.substr(6));
  std::istringstream in(plan.substr(3));
  std::string nodes_text;
  NodeMembership out;
  std::int64_t accumulation = 0;
  in >> nodes_text >> out.nproc >> accumulation;
  std::vector<int> nodes;
  std::istringstream list(nodes_text);
  for (std::string node; std::getline(list, node, ',');) nodes.push_back(std::stoi(node));
  out.included = false;
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    if (nodes[k] == node_rank_) {
      out.included = true;
      out.node_rank = static_cast<int>(k);
    }
  }
  out.nnodes = static_cast<int>(nodes.size());
  if (accumulation > 0) out.grad_accumulation = accumulation;
  out.description = machines_text(nodes) + " x " + std::to_string(out.nproc) + " ranks";
  return out;
}

}  // namespace trainyard
