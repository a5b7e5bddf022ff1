#include "trainyard/parallel/distributed.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <sstream>
#include <vector>

#include "trainyard/api/error.hpp"
#include "trainyard/parallel/flight_recorder.hpp"
#include "trainyard/runtime/heartbeat.hpp"

namespace trainyard {

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kBeatInterval{200};
// How long a rank that another rank reported as failed may take to end by itself before its
// monitor ends it (it may be stuck in a collective that never returns).
constexpr std::chrono::milliseconds kStopGrace{3000};

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (!value || !*value) return std::nullopt;
  return std::string(value);
}

int env_int(const char* name, const std::string& text) {
  try {
    std::size_t used = 0;
    int value = std::stoi(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw Error(std::string("environment variable ") + name + " must be an integer, got '" + text +
              "'");
}

// Slurm writes tasks per node as "2", "2(x3)" or "2,1": this node's count is not recoverable
// from the list alone, the first entry is right for the uniform layouts launchers use.
int leading_int(const char* name, const std::string& text) {
  std::size_t end = 0;
  while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
  return env_int(name, text.substr(0, end));
}

std::vector<uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }
std::string text_of(const std::vector<uint8_t>& value) { return {value.begin(), value.end()}; }

std::string first_line(const std::string& text) {
  auto end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

std::string message_of(const std::exception& error) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&error)) {
    return first_line(c10->what_without_backtrace());
  }
  return first_line(error.what());
}

std::atomic<int> g_waiting{0};
std::atomic<bool> g_collective_failed{false};

const std::string kFailureKey = "trainyard/failure";
std::string beat_key(int rank) { return "trainyard/heartbeat/" + std::to_string(rank); }

using Beat = Heartbeat;

Beat parse_beat(const std::vector<uint8_t>& value) {
  Beat beat;
  std::istringstream in(text_of(value));
  int waiting = 0, finished = 0;
  if (in >> beat.counter >> beat.step >> waiting >> finished) {
    beat.present = true;
    beat.waiting = waiting != 0;
    beat.finished = finished != 0;
  }
  return beat;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  return out;
}

}  // namespace

std::optional<Rendezvous> rendezvous_from_environment() {
  Rendezvous out;
  if (auto rank = env("RANK")) {
    auto world = env("WORLD_SIZE");
    if (!world) throw Error("RANK is set but WORLD_SIZE is not");
    out.rank = env_int("RANK", *rank);
    out.world_size = env_int("WORLD_SIZE", *world);
    out.local_rank = env("LOCAL_RANK") ? env_int("LOCAL_RANK", *env("LOCAL_RANK")) : out.rank;
    out.local_world_size = env("LOCAL_WORLD_SIZE")
                               ? env_int("LOCAL_WORLD_SIZE", *env("LOCAL_WORLD_SIZE"))
                               : out.world_size;
  } else if (auto procid = env("SLURM_PROCID")) {
    auto tasks = env("SLURM_NTASKS");
    if (!tasks) tasks = env("SLURM_STEP_NUM_TASKS");
    if (!tasks) throw Error("SLURM_PROCID is set but neither SLURM_NTASKS nor SLURM_STEP_NUM_TASKS");
    out.rank = env_int("SLURM_PROCID", *procid);
    out.world_size = env_int("SLURM_NTASKS", *tasks);
    out.local_rank = env("SLURM_LOCALID") ? env_int("SLURM_LOCALID", *env("SLURM_LOCALID")) : 0;
    if (auto per_node = env("SLURM_NTASKS_PER_NODE")) {
      out.local_world_size = leading_int("SLURM_NTASKS_PER_NODE", *per_node);
    } else if (auto step_tasks = env("SLURM_STEP_TASKS_PER_NODE")) {
      out.local_world_size = leading_int("SLURM_STEP_TASKS_PER_NODE", *step_tasks);
    } else {
      out.local_world_size = out.world_size;
    }
  } else {
    return std::nullopt;
  }
  if (auto addr = env("MASTER_ADDR")) out.master_addr = *addr;
  if (auto port = env("MASTER_PORT")) out.master_port = env_int("MASTER_PORT", *port);
  if (out.world_size < 1) throw Error("WORLD_SIZE must be >= 1, got " + std::to_string(out.world_size));
  if (out.rank < 0 || out.rank >= out.world_size) {
    throw Error("RANK " + std::to_string(out.rank) + " is outside the world of " +
                std::to_string(out.world_size) + " ranks");
  }
  if (out.local_world_size < 1 || out.local_rank < 0 || out.local_rank >= out.local_world_size) {
    throw Error("LOCAL_RANK " + std::to_string(out.local_rank) + " is outside LOCAL_WORLD_SIZE " +
                std::to_string(out.local_world_size));
  }
  if (out.master_port < 1 || out.master_port > 65535) {
    throw Error("MASTER_PORT must be in 1..65535, got " + std::to_string(out.master_port));
  }
  return out;
}

ListeningSocket listen_on(const std::string& address, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int code = getaddrinfo(address.c_str(), service.c_str(), &hints, &found); code != 0) {
    throw Error("cannot resolve the master address '" + address + "': " + gai_strerror(code));
  }
  std::string failure = "no usable address";
  for (addrinfo* item = found; item; item = item->ai_next) {
    int fd = ::socket(item->ai_family, item->ai_socktype | SOCK_CLOEXEC, item->ai_protocol);
    if (fd < 0) continue;
    int on = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (::bind(fd, item->ai_addr, item->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      sockaddr_storage bound{};
      socklen_t length = sizeof bound;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
      int bound_port = bound.ss_family == AF_INET
                           ? ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port)
                           : ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
      freeaddrinfo(found);
      return {fd, bound_port};
    }
    failure = std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(found);
  throw Error("cannot listen on " + address + ":" + std::to_string(port) + ": " + failure);
}

namespace {

c10::intrusive_ptr<c10d::TCPStore> make_store(const std::string& address, int port, bool host,
                                              std::chrono::milliseconds timeout, int& bound) {
  c10d::TCPStoreOptions options;
  options.isServer = host;
  options.waitWorkers = false;
  options.timeout = timeout;
  bound = port;
  if (host) {
    // c10d's server listens on every interface unless handed a socket: it gets one bound to the
    // master address only.
    ListeningSocket socket = listen_on(address, port);
    options.masterListenFd = socket.fd;
    bound = socket.port;
  }
  options.port = static_cast<std::uint16_t>(bound);
  try {
    return c10::make_intrusive<c10d::TCPStore>(address, options);
  } catch (const std::exception& error) {
    throw Error("cannot " + std::string(host ? "start" : "reach") + " the rendezvous store at " +
                address + ":" + std::to_string(bound) + ": " + message_of(error));
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Store> store_for_attempt(c10::intrusive_ptr<c10d::Store> store,
                                                  int attempt) {
  if (attempt == 0) return store;
  return c10::make_intrusive<c10d::PrefixStore>("trainyard/attempt" + std::to_string(attempt),
                                                std::move(store));
}

int restart_attempt_from_environment() {
  const char* text = std::getenv(kRestartAttemptVariable);
  if (!text || !*text) return 0;
  char* end = nullptr;
  const long attempt = std::strtol(text, &end, 10);
  if (*end != '\0' || attempt < 0 || attempt > 1000000) {
    throw Error(std::string(kRestartAttemptVariable) + " must be a count >= 0, got '" + text + "'");
  }
  return static_cast<int>(attempt);
}

c10::intrusive_ptr<c10d::Store> open_store(const Rendezvous& rendezvous, bool host) {
  int bound = 0;
  return store_for_attempt(make_store(rendezvous.master_addr, rendezvous.master_port, host,
                                      rendezvous.timeout, bound),
                           restart_attempt_from_environment());
}

std::pair<c10::intrusive_ptr<c10d::Store>, int> host_store(const std::string& address, int port,
                                                           std::chrono::milliseconds timeout) {
  int bound = 0;
  auto store = make_store(address, port, true, timeout, bound);
  return {store, bound};
}

CollectiveWait::CollectiveWait() : exceptions_(std::uncaught_exceptions()) { ++g_waiting; }

CollectiveWait::~CollectiveWait() {
  --g_waiting;
  if (std::uncaught_exceptions() > exceptions_) g_collective_failed = true;
}

bool collective_failed() { return g_collective_failed.load(); }

struct FailureMonitor::Peers {
  std::vector<Beat> last;
  std::vector<Clock::time_point> changed;
  std::optional<Clock::time_point> failure_seen;
  std::optional<std::string> failure;  // the last failure read from the store
};

FailureMonitor::FailureMonitor(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                               std::chrono::milliseconds timeout, bool hosts_store)
    : store_(store->clone()), rank_(rank), world_size_(world_size), timeout_(timeout),
      hosts_store_(hosts_store), peers_(std::make_unique<Peers>()) {
  peers_->last.resize(static_cast<std::size_t>(world_size));
  peers_->changed.assign(static_cast<std::size_t>(world_size), Clock::now());
  beat();
  thread_ = std::thread([this] { run(); });
}

FailureMonitor::~FailureMonitor() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void FailureMonitor::beat() {
  std::ostringstream value;
  value << ++beats_ << " " << step_.load() << " " << (g_waiting.load() > 0 ? 1 : 0) << " "
        << (finished_.load() ? 1 : 0);
  store_->set(beat_key(rank_), bytes(value.str()));
}

void FailureMonitor::run() {
  int store_errors = 0;
  while (!stop_) {
    try {
      beat();
      watch();
      store_errors = 0;
    } catch (const std::exception&) {
      // A store client does not reconnect: twice in a row means its host (rank 0 or the
      // launcher) has ended, and with it the job.
      if (++store_errors >= 2 && !stop_) {
        const std::string cause = peers_->failure.value_or(
            "the rendezvous store is unreachable (rank 0 or the launcher that hosts it has "
            "ended)");
        std::cerr << "trainyard: error: rank " << rank_ << ": stopping because " << cause
                  << std::endl;
        dump_flight_record(cause);
        std::_Exit(1);
      }
    }
    std::this_thread::sleep_for(kBeatInterval);
  }
}

void FailureMonitor::watch() {
  if (finished_) return;
  if (store_->check({kFailureKey})) {
    std::string recorded = text_of(store_->get(kFailureKey));
    auto bar = recorded.find('|');
    int reporter = std::atoi(recorded.substr(0, bar).c_str());
    peers_->failure = recorded.substr(bar + 1);
    if (reporter != rank_) {
      auto now = Clock::now();
      if (!peers_->failure_seen) peers_->failure_seen = now;
      if (now - *peers_->failure_seen > kStopGrace) {
        std::cerr << "trainyard: error: rank " << rank_ << ": stopping because "
                  << recorded.substr(bar + 1) << std::endl;
        dump_flight_record(recorded.substr(bar + 1));
        std::_Exit(1);
      }
    }
    return;
  }
  std::vector<std::string> keys;
  for (int r = 0; r < world_size_; ++r) keys.push_back(beat_key(r));
  // multiGet waits for missing keys: read only those that exist.
  auto now = Clock::now();
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    auto index = static_cast<std::size_t>(r);
    Beat beat;
    if (store_->check({keys[index]})) beat = parse_beat(store_->get(keys[index]));
    if (beat.finished) {
      peers_->changed[index] = now;
    } else if (beat.counter != peers_->last[index].counter) {
      peers_->changed[index] = now;
    } else if (now - peers_->changed[index] > timeout_) {
      const auto seconds =
          std::chrono::duration_cast<std::chrono::seconds>(now - peers_->changed[index]).count();
      std::string message = "rank " + std::to_string(r) + " failed: no heartbeat for " +
                            std::to_string(seconds) + " s (process died or froze)";
      report(message + " (detected by rank " + std::to_string(rank_) + ")");
      std::cerr << "trainyard: error: rank " << rank_ << ": stopping because " << message
                << std::endl;
      dump_flight_record(message);
      std::_Exit(1);
    }
    peers_->last[index] = beat;
  }
}

void FailureMonitor::report(const std::string& message) {
  try {
    store_->compareSet(kFailureKey, {}, bytes(std::to_string(rank_) + "|" + message));
  } catch (const std::exception&) {
    // Without a store there is no one to tell; the error still reaches this rank's output.
  }
}

std::optional<std::string> FailureMonitor::failure() {
  if (!store_->check({kFailureKey})) return std::nullopt;
  std::string recorded = text_of(store_->get(kFailureKey));
  return recorded.substr(recorded.find('|') + 1);
}

std::string FailureMonitor::diagnose() {
  // The monitor's own connection (a TCPStore client serialises its operations): a new one would
  // wait the whole timeout for a store that is gone.
  auto& store = store_;
  auto read_failure = [&]() -> std::optional<std::string> {
    if (!store->check({kFailureKey})) return std::nullopt;
    std::string recorded = text_of(store->get(kFailureKey));
    return recorded.substr(recorded.find('|') + 1);
  };
  auto read_beats = [&] { return read_heartbeats(*store, world_size_); };
  try {
    if (auto recorded = read_failure()) return *recorded;
    std::vector<Beat> before = read_beats();
    // Long enough for every live rank to beat a few times, even on a loaded machine.
    std::this_thread::sleep_for(8 * kBeatInterval);
    if (auto recorded = read_failure()) return *recorded;
    std::vector<Beat> after = read_beats();
    std::vector<int> dead, idle;
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank_) continue;
      const Beat& a = before[static_cast<std::size_t>(r)];
      const Beat& b = after[static_cast<std::size_t>(r)];
      if (b.finished) continue;
      if (!b.present || a.counter == b.counter) {
        dead.push_back(r);
      } else if (!b.waiting) {
        idle.push_back(r);
      }
    }
    if (!dead.empty()) return rank_list(dead) + " failed: process ended or froze (no heartbeat)";
    if (!idle.empty()) {
      return rank_list(idle) + " stopped calling collectives (alive, at step " +
             std::to_string(after[static_cast<std::size_t>(idle.front())].step) +
             ", not waiting in a collective)";
    }
    return {};
  } catch (const std::exception& error) {
    return "the rendezvous store is unreachable (" + message_of(error) +
           "): rank 0 or the launcher hosting it has ended";
  }
}

void FailureMonitor::linger() {
  // The other ranks' monitors read the failure from this process's store before it goes.
  if (hosts_store_) std::this_thread::sleep_for(kStopGrace + std::chrono::seconds(1));
}

void FailureMonitor::finish() {
  finished_ = true;
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  try {
    beat();
  } catch (const std::exception&) {
  }
}

void rethrow_naming_failed_rank(FailureMonitor& monitor, int rank) {
  std::string message;
  try {
    throw;
  } catch (const std::exception& error) {
    message = message_of(error);
  } catch (...) {
    message = "unknown exception";
  }
  const std::string me = "rank " + std::to_string(rank);
  if (collective_failed()) {
    std::string cause = monitor.diagnose();
    if (cause.empty()) cause = "a peer failed (no rank could be identified)";
    monitor.report(cause + " (detected by " + me + ")");
    dump_flight_record(me + ": a collective failed because " + cause);
    monitor.linger();
    throw Error(me + ": a collective failed because " + cause + " [" + message + "]");
  }
  monitor.report(me + " failed: " + message);
  dump_flight_record(me + " failed: " + message);
  monitor.linger();
  throw Error(me + ": " + message);
}

std::vector<Heartbeat> read_heartbeats(c10d::Store& store, int world_size) {
  std::vector<Heartbeat> beats(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    // get() waits for a missing key: read only those that exist.
    if (store.check({beat_key(r)})) beats[static_cast<std::size_t>(r)] = parse_beat(store.get(beat_key(r)));
  }
  return beats;
}

namespace {

// Whether the test plan "attempt:rank:step,..." names this start, rank and step.
bool planned_failure(const std::string& plan, int rank, std::int64_t step) {
  static const int attempt = restart_attempt_from_environment();
  std::istringstream entries(plan);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    int planned_attempt = -1, planned_rank = -1;
    long long planned_step = -1;
    if (std::sscanf(entry.c_str(), "%d:%d:%lld", &planned_attempt, &planned_rank,
                    &planned_step) == 3 &&
        planned_attempt == attempt && planned_rank == rank && planned_step == step) {
      return true;
    }
  }
  return false;
}

}  // namespace

void test_failure_hook(int rank, std::int64_t step) {
  static const std::optional<std::string> fail_rank = env("TRAINYARD_TEST_FAIL_RANK");
  static const std::optional<std::string> fail_step = env("TRAINYARD_TEST_FAIL_AT_STEP");
  static const std::optional<std::string> fail_plan = env("TRAINYARD_TEST_FAIL_PLAN");
  const bool planned = fail_plan && planned_failure(*fail_plan, rank, step);
  const bool named = fail_rank && fail_step && std::atoi(fail_rank->c_str()) == rank &&
                     std::atoll(fail_step->c_str()) == step;
  if (!planned && !named) return;
  const std::string mode = env("TRAINYARD_TEST_FAIL_MODE").value_or("exit");
  std::cerr << "rank " << rank << ": test hook: " << mode << " at step " << step << std::endl;
  if (mode == "hang") {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (mode == "kill") ::raise(SIGKILL);
  // Frozen, every thread with it, until SIGCONT.
  if (mode == "stop") ::raise(SIGSTOP);
  if (mode == "term") {
    // As a scheduler's warning before preemption: the run goes on and stops at a step boundary.
    ::raise(SIGTERM);
    return;
  }
  if (mode == "crash") {
    // A write to an unmapped page, as a memory bug in a plugin would make.
    static volatile std::uintptr_t unmapped_address = 0x10;
    *reinterpret_cast<volatile int*>(unmapped_address) = 1;
  }
  std::_Exit(3);
}

void write_tensor_file(const std::filesystem::path& file, const TensorMap& tensors) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : tensors) dict.insert(name, tensor.detach().cpu().contiguous());
  std::vector<char> data = torch::jit::pickle_save(c10::IValue(dict));
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!out) throw Error("cannot write " + file.string());
}

TensorMap read_tensor_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error("cannot read " + file.string());
  std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value = torch::jit::pickle_load(data);
  TensorMap out;
  for (const auto& item : value.toGenericDict()) {
    out[item.key().toStringRef()] = item.value().toTensor();
  }
  return out;
}

}  // namespace trainyard
