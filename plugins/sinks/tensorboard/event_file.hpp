#pragma once
// A TensorBoard event file of scalars. Every append reaches the operating system before it
// returns, so a live TensorBoard sees it and a process killed at any moment leaves a file that
// reads up to its last whole record.

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace trainyard::tensorboard {

class EventFile {
 public:
  // Creates (truncates) `path` and writes the file-version event TensorBoard expects first.
  explicit EventFile(const std::filesystem::path& path);
  ~EventFile();
  EventFile(const EventFile&) = delete;
  EventFile& operator=(const EventFile&) = delete;

  // One event at `step` holding every (tag, value) as a scalar summary.
  void append_scalars(std::int64_t step, double wall_time,
                      const std::vector<std::pair<std::string, float>>& scalars);

  const std::filesystem::path& path() const { return path_; }

 private:
  void append_record(const std::string& event_bytes);

  std::filesystem::path path_;
  int fd_ = -1;
};

// Seconds since the Unix epoch, as event wall times count them.
double wall_time_now();

}  // namespace trainyard::tensorboard
