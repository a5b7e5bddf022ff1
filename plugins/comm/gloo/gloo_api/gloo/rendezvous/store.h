#pragma once
// Declarations only; see gloo_api/README.md. The Store base matches the virtual functions that
// ProcessGroupGloo::GlooStore overrides; this plugin never creates a GlooStore itself.

#include <chrono>
#include <string>
#include <vector>

namespace gloo {
// Named by an inline function of ProcessGroupGloo that only libtorch_cpu instantiates.
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
namespace rendezvous {
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) = 0;
};
}  // namespace rendezvous
}  // namespace gloo
