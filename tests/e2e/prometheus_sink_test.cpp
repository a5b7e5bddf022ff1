// The prometheus sink on a real run: its endpoint, scraped during the run and parsed by
// prometheus_client, serves the documented metrics with their types, labels and sane values;
// it listens on loopback only by default; bad options fail at start with one line.

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_support.hpp"
#include "venv_python.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Connects to address:port over TCP; returns 0 on success, else the errno of connect().
int connect_error(const std::string& address, int port, int* socket_out = nullptr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in target{};
  target.sin_family = AF_INET;
  target.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, address.c_str(), &target.sin_addr);
  const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&target), sizeof target);
  const int error = rc == 0 ? 0 : errno;
  if (rc == 0 && socket_out) {
    *socket_out = fd;
  } else {
    ::close(fd);
  }
  return error;
}

// GET /metrics from 127.0.0.1:port; the body, or nullopt when the request fails.
std::optional<std::string> scrape(int port) {
  int fd = -1;
  if (connect_error("127.0.0.1", port, &fd) != 0) return std::nullopt;
  const std::string request =
      "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return std::nullopt;
  }
  std::string response;
  char buffer[8192];
  ssize_t got = 0;
  while ((got = ::recv(fd, buffer, sizeof buffer, 0)) > 0) response.append(buffer, got);
  ::close(fd);
  const auto body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.1 200", 0) != 0 && response.rfind("HTTP/1.0 200", 0) != 0) {
    return std::nullopt;
  }
  if (body == std::string::npos) return std::nullopt;
  return response.substr(body + 4);
}

// Waits for the port file the sink writes at start; 0 when it does not come.
int wait_for_port(const fs::path& file, const std::atomic<bool>& run_over) {
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < deadline && !run_over) {
    std::ifstream in(file);
    int port = 0;
    if (in >> port && port > 0) return port;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

// Polls the endpoint until a scrape holds `needle`; that scrape, or "" at the deadline.
// The first scrape that holds every one of `needles`. The sink sets a record's figures one
// after another, so a scrape can land between them while the first record is written.
std::string scrape_until(int port, const std::vector<std::string>& needles,
                         const std::atomic<bool>& run_over) {
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < deadline && !run_over) {
    if (auto body = scrape(port)) {
      bool all = true;
      for (const auto& needle : needles) all = all && body->find(needle) != std::string::npos;
      if (all) return *body;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return {};
}

// One sample as prometheus_client parsed it.
struct Sample {
  std::string family;
  std::string type;
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Parses exposition text with prometheus_client; one line per sample:
// family, type, sample name, labels as k=v;..., value.
std::vector<Sample> parse_exposition(const TempDir& dir, const std::string& text) {
  const fs::path file = dir.write("scrape.txt", text);
  auto result = run_venv_python(R"(
import sys
from prometheus_client.parser import text_string_to_metric_families
for family in text_string_to_metric_families(open(sys.argv[1]).read()):
    for sample in family.samples:
        labels = ';'.join('%s=%s' % item for item in sorted(sample.labels.items()))
        print('\t'.join([family.name, family.type, sample.name, labels, repr(sample.value)]))
)",
                                {file.string()});
  EXPECT_EQ(result.exit_code, 0) << describe(result);
  std::vector<Sample> out;
  std::istringstream lines(result.out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    Sample sample;
    std::string labels, value;
    std::getline(fields, sample.family, '\t');
    std::getline(fields, sample.type, '\t');
    std::getline(fields, sample.name, '\t');
    std::getline(fields, labels, '\t');
    std::getline(fields, value, '\t');
    std::istringstream pairs(labels);
    std::string pair;
    while (std::getline(pairs, pair, ';')) {
      const auto equals = pair.find('=');
      sample.labels[pair.substr(0, equals)] = pair.substr(equals + 1);
    }
    sample.value = std::stod(value);
    out.push_back(sample);
  }
  return out;
}

// The sample called `name` whose labels include `labels`, or nullptr.
const Sample* find_sample(const std::vector<Sample>& samples, const std::string& name,
                          const std::map<std::string, std::string>& labels = {}) {
  for (const auto& sample : samples) {
    if (sample.name != name) continue;
    bool match = true;
    for (const auto& [key, value] : labels) {
      auto it = sample.labels.find(key);
      match = match && it != sample.labels.end() && it->second == value;
    }
    if (match) return &sample;
  }
  return nullptr;
}

fs::path write_recipe(const TempDir& dir, int max_steps, const std::string& sink_options) {
  return dir.write("watched.toml", "extends = \"" +
                                       (source_dir() / "recipes/fashion_mnist_mlp.toml").string() +
                                       "\"\n[run]\nmax_steps = " + std::to_string(max_steps) +
                                       "\nlog_every = 5\neval_max_batches = 5\noutput_dir = \"" +
                                       (dir / "out").string() +
                                       "\"\n[sinks.prometheus]\nport = 0\n" + sink_options);
}

// A run of the host in the background, killed when the test is done with it.
class BackgroundRun {
 public:
  explicit BackgroundRun(const fs::path& recipe)
      : result_(std::async(std::launch::async, [this, recipe] {
          auto result = run_command({host_binary().string(), "run", recipe.string()}, source_dir(),
                                    300, {}, [this] { return stop_.load(); });
          over_ = true;
          return result;
        })) {}
  ~BackgroundRun() {
    if (result_.valid()) finish();
  }
  const std::atomic<bool>& over() const { return over_; }
  CommandResult finish() {
    stop_ = true;
    return result_.get();
  }
  CommandResult wait() { return result_.get(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<bool> over_{false};
  std::future<CommandResult> result_;
};

TEST(PrometheusSinkTest, ScrapeDuringTheRunServesTheDocumentedMetrics) {
  TempDir dir;
  constexpr int kSteps = 600;
  BackgroundRun run(write_recipe(dir, kSteps, "linger_s = 30\n"));
  const int port = wait_for_port(dir / "out" / "prometheus.port", run.over());
  ASSERT_GT(port, 0) << describe(run.finish());

  const std::string live = scrape_until(
      port, {"trainyard_loss{", "trainyard_memory_bytes{", "trainyard_held_bytes{"}, run.over());
  ASSERT_FALSE(live.empty()) << describe(run.finish());
  const auto samples = parse_exposition(dir, live);
  ASSERT_FALSE(samples.empty()) << live;
  for (const auto& sample : samples) {
    EXPECT_EQ(sample.labels.count("rank"), 1u) << sample.name;
    EXPECT_EQ(sample.labels.count("run"), 1u) << sample.name;
    EXPECT_EQ(sample.labels.at("rank"), "0");
    EXPECT_EQ(sample.labels.at("run"), "watched") << "the recipe's name";
  }
  auto type_of = [&](const std::string& name) {
    const Sample* sample = find_sample(samples, name);
    return sample ? sample->type : std::string("missing");
  };
  auto value_of = [&](const std::string& name,
                      const std::map<std::string, std::string>& labels = {}) {
    const Sample* sample = find_sample(samples, name, labels);
    EXPECT_NE(sample, nullptr) << name << " missing in\n" << live;
    return sample ? sample->value : -1.0;
  };
  EXPECT_EQ(type_of("trainyard_steps_total"), "counter");
  for (const char* gauge :
       {"trainyard_loss", "trainyard_step_seconds", "trainyard_samples_per_second",
        "trainyard_epoch", "trainyard_learning_rate", "trainyard_phase_seconds",
        "trainyard_memory_bytes", "trainyard_held_bytes", "trainyard_data_wait_ratio",
        "trainyard_total_steps", "trainyard_run_finished"}) {
    EXPECT_EQ(type_of(gauge), "gauge") << gauge;
  }
  const double steps = value_of("trainyard_steps_total");
  EXPECT_GE(steps, 5);
  EXPECT_LE(steps, kSteps);
  EXPECT_EQ(std::fmod(steps, 5.0), 0.0) << "counted at logging boundaries";
  EXPECT_GT(value_of("trainyard_loss"), 0);
  EXPECT_LT(value_of("trainyard_loss"), 10);
  EXPECT_GT(value_of("trainyard_step_seconds"), 0);
  EXPECT_LT(value_of("trainyard_step_seconds"), 10);
  EXPECT_GT(value_of("trainyard_samples_per_second"), 0);
  EXPECT_GT(value_of("trainyard_learning_rate"), 0);
  EXPECT_GE(value_of("trainyard_epoch"), 0);
  EXPECT_LT(value_of("trainyard_epoch"), 1);
  EXPECT_EQ(value_of("trainyard_total_steps"), kSteps);
  EXPECT_EQ(value_of("trainyard_run_finished"), 0);
  for (const char* phase : {"data_wait", "h2d", "forward", "backward", "comm_wait", "optimizer"}) {
    const double seconds = value_of("trainyard_phase_seconds", {{"phase", phase}});
    EXPECT_GE(seconds, 0) << phase;
    EXPECT_LT(seconds, 10) << phase;
  }
  EXPECT_GT(value_of("trainyard_phase_seconds", {{"phase", "forward"}}), 0);
  const double current = value_of("trainyard_memory_bytes", {{"kind", "current"}});
  const double peak = value_of("trainyard_memory_bytes", {{"kind", "peak"}});
  EXPECT_GT(current, 0);
  EXPECT_GE(peak, current);
  EXPECT_GT(value_of("trainyard_held_bytes", {{"kind", "parameters"}}), 0);

  // After the run, linger_s keeps the endpoint up with the evaluation and the end marked.
  const std::string final_scrape =
      scrape_until(port, {"trainyard_run_finished{rank=\"0\",run=\"watched\"} 1"}, run.over());
  ASSERT_FALSE(final_scrape.empty()) << describe(run.finish());
  const auto after = parse_exposition(dir, final_scrape);
  const Sample* accuracy = find_sample(after, "trainyard_eval_accuracy");
  ASSERT_NE(accuracy, nullptr) << final_scrape;
  EXPECT_GT(accuracy->value, 0.3);
  EXPECT_LE(accuracy->value, 1.0);
  ASSERT_NE(find_sample(after, "trainyard_eval_loss"), nullptr) << final_scrape;
  ASSERT_NE(find_sample(after, "trainyard_steps_total"), nullptr);
  EXPECT_EQ(find_sample(after, "trainyard_steps_total")->value, kSteps);
  run.finish();
}

// The machine's first non-loopback IPv4 address that is up, or "".
std::string non_loopback_ipv4() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  std::string found;
  for (ifaddrs* entry = list; entry && found.empty(); entry = entry->ifa_next) {
    if (!entry->ifa_addr || entry->ifa_addr->sa_family != AF_INET) continue;
    if ((entry->ifa_flags & IFF_LOOPBACK) || !(entry->ifa_flags & IFF_UP)) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* address = reinterpret_cast<const sockaddr_in*>(entry->ifa_addr);
    if (::inet_ntop(AF_INET, &address->sin_addr, text, sizeof text)) found = text;
  }
  ::freeifaddrs(list);
  return found;
}

// The local addresses (hex, as /proc/net/tcp writes them) of sockets listening on `port`.
std::vector<std::string> listening_addresses(int port) {
  char port_hex[8];
  std::snprintf(port_hex, sizeof port_hex, "%04X", port);
  std::vector<std::string> out;
  std::ifstream table("/proc/net/tcp");
  std::string line;
  std::getline(table, line);  // header
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    const auto colon = local.find(':');
    if (state == "0A" && local.substr(colon + 1) == port_hex) out.push_back(local.substr(0, colon));
  }
  return out;
}

TEST(PrometheusSinkTest, ListensOnLoopbackOnlyByDefault) {
  TempDir dir;
  BackgroundRun run(write_recipe(dir, 5000, ""));
  const int port = wait_for_port(dir / "out" / "prometheus.port", run.over());
  ASSERT_GT(port, 0) << describe(run.finish());
  EXPECT_EQ(connect_error("127.0.0.1", port), 0) << "the endpoint is up on loopback";
  EXPECT_EQ(listening_addresses(port), std::vector<std::string>{"0100007F"})
      << "one listening socket, bound to 127.0.0.1";
  const std::string other = non_loopback_ipv4();
  if (!other.empty()) {
    EXPECT_EQ(connect_error(other, port), ECONNREFUSED) << "connecting through " << other;
  }
  const auto result = run.finish();
  EXPECT_TRUE(result.killed) << describe(result);
}

// Runs the host on a recipe with these prometheus options and expects a one-line error.
std::string start_error(const std::string& sink_options) {
  TempDir dir;
  auto result = run_host(
      {"run",
       dir.write("bad.toml", "extends = \"" +
                                 (source_dir() / "recipes/fashion_mnist_mlp.toml").string() +
                                 "\"\n[run]\nmax_steps = 5\noutput_dir = \"" +
                                 (dir / "out").string() + "\"\n[sinks.prometheus]\n" + sink_options)
           .string()},
      {}, 120);
  EXPECT_EQ(result.exit_code, 1) << describe(result);
  EXPECT_EQ(result.err.rfind("trainyard: error: ", 0), 0u) << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  EXPECT_EQ(result.out.find("step 5/5"), std::string::npos) << "no training happened";
  return result.err;
}

TEST(PrometheusSinkTest, BadOptionsAreOneLineErrorsAtStart) {
  EXPECT_HAS(start_error("port = 70000\n"),
             "sinks.prometheus.port must be >= 0 and <= 65535, got 70000");
  EXPECT_HAS(start_error("port = -1\n"), "sinks.prometheus.port must be >= 0 and <= 65535, got -1");
  EXPECT_HAS(start_error("address = \"localhost:80\"\n"),
             "address must be an IPv4 address, got 'localhost:80'");
  EXPECT_HAS(start_error("linger_s = -1.0\n"), "linger_s must be >= 0");
}

TEST(PrometheusSinkTest, BusyPortIsAOneLineErrorAtStart) {
  // Hold a loopback port, then ask the sink for it.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  const int port = ntohs(address.sin_port);
  EXPECT_HAS(start_error("port = " + std::to_string(port) + "\n"),
             "sinks.prometheus: cannot listen on 127.0.0.1:" + std::to_string(port));
  ::close(fd);
}

}  // namespace
}  // namespace trainyard::testing
