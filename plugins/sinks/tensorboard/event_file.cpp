#include "event_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "tensorboard_event.pb.h"
#include "tfrecord.hpp"

namespace trainyard::tensorboard {

EventFile::EventFile(const std::filesystem::path& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw std::runtime_error("cannot write event file " + path.string() + ": " +
                             std::strerror(errno));
  }
  Event event;
  event.set_wall_time(wall_time_now());
  event.set_file_version("brain.Event:2");
  append_record(event.SerializeAsString());
}

EventFile::~EventFile() {
  if (fd_ >= 0) ::close(fd_);
}

void EventFile::append_scalars(std::int64_t step, double wall_time,
                               const std::vector<std::pair<std::string, float>>& scalars) {
  Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    Summary::Value* entry = summary->add_value();
    entry->set_tag(tag);
    entry->set_simple_value(value);
  }
  append_record(event.SerializeAsString());
}

// One write call per record, straight to the operating system (no user-space buffer to lose).
void EventFile::append_record(const std::string& event_bytes) {
  const std::string record = tfrecord(event_bytes);
  std::size_t done = 0;
  while (done < record.size()) {
    const ssize_t wrote = ::write(fd_, record.data() + done, record.size() - done);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("cannot write event file " + path_.string() + ": " +
                               std::strerror(errno));
    }
    done += static_cast<std::size_t>(wrote);
  }
}

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace trainyard::tensorboard
