#pragma once
// A minimal HTTP endpoint serving a prometheus-cpp registry's text exposition at GET /metrics.
//
// prometheus::Exposer cannot serve inside a LibTorch process: Debian's civetweb starts its
// threads with a fixed 100 KiB stack, smaller than the static TLS that LibTorch's CUDA libraries
// bring, so every thread creation fails. This endpoint's thread has the default stack. Scrapes
// are answered one at a time, each on its own connection (HTTP/1.0, closed after the answer).

#include <atomic>
#include <memory>
#include <string>
#include <thread>

namespace prometheus {
class Registry;
}

namespace trainyard {

class MetricsEndpoint {
 public:
  // Listens on `address` (IPv4) and `port` (0: any free port); throws Error with the reason
  // when it cannot.
  MetricsEndpoint(std::shared_ptr<prometheus::Registry> registry, const std::string& address,
                  int port);
  ~MetricsEndpoint();  // stops serving and closes the port
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const { return port_; }

 private:
  void serve();
  void answer(int connection) const;

  std::shared_ptr<prometheus::Registry> registry_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace trainyard
