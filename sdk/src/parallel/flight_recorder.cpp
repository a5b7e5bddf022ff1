#include "trainyard/parallel/flight_recorder.hpp"

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <thread>

#include "trainyard/api/error.hpp"
#include "trainyard/support/files.hpp"
#include "trainyard/support/json_quote.hpp"

namespace trainyard {

namespace {

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out = "[";
  for (std::size_t k = 0; k < ranks.size(); ++k) {
    out += (k ? "," : "") + std::to_string(ranks[k]);
  }
  return out + "]";
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t k = 0; k < shape.size(); ++k) {
    out += (k ? ", " : "") + std::to_string(shape[k]);
  }
  return out + "]";
}

void write_record(std::ostream& out, const CollectiveRecord& record) {
  out << "{\"id\":" << record.id
      << ",\"group\":" << json_quote(record.group ? record.group->name : std::string())
      << ",\"ranks\":" << ranks_text(record.group ? record.group->ranks : std::vector<int>{})
      << ",\"sequence\":" << record.sequence << ",\"operation\":" << json_quote(record.operation)
      << ",\"dtype\":" << json_quote(record.dtype) << ",\"shapes\":[";
  for (std::size_t k = 0; k < record.shapes.size(); ++k) {
    out << (k ? "," : "");
    out << "[";
    for (std::size_t d = 0; d < record.shapes[k].size(); ++d) {
      out << (d ? "," : "") << record.shapes[k][d];
    }
    out << "]";
  }
  out << "],\"peer\":" << record.peer << ",\"step\":" << record.step
      << ",\"issued_us\":" << record.issued_us << ",\"finished_us\":" << record.finished_us
      << ",\"state\":\"" << collective_state_name(record.state) << "\"}";
}

// The dump a multi-process run set, leaked so that a late signal thread never finds it destroyed.
struct DumpSlot {
  std::mutex mutex;
  std::function<void(const std::string&)> dump;
};

DumpSlot& dump_slot() {
  static auto* slot = new DumpSlot();
  return *slot;
}

std::atomic<bool> g_dump_requested{false};
std::terminate_handler g_previous_terminate = nullptr;

// An exception no one caught, on any thread (a communication library's own thread throwing on
// a collective gone wrong): the record is written before the process aborts.
void dump_then_terminate() {
  std::string what = "an uncaught exception";
  if (std::exception_ptr current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const std::exception& error) {
      what = std::string("an uncaught exception: ") + error.what();
    } catch (...) {
    }
  }
  dump_flight_record(what.substr(0, what.find('\n')));
  if (g_previous_terminate) g_previous_terminate();
  std::abort();
}

void request_dump(int) { g_dump_requested = true; }

}  // namespace

const char* collective_state_name(CollectiveState state) {
  switch (state) {
    case CollectiveState::kIssued:
      return "issued";
    case CollectiveState::kCompleted:
      return "completed";
    case CollectiveState::kFailed:
      return "failed";
  }
  return "issued";
}

bool CollectiveRecord::point_to_point() const {
  return operation == "send" || operation == "recv" || operation == "recvAnysource";
}

std::string CollectiveRecord::describe() const {
  std::string out = operation;
  if (point_to_point() && group && peer >= 0 && peer < static_cast<int>(group->ranks.size())) {
    out += (operation == "send" ? " to rank " : " from rank ") +
           std::to_string(group->ranks[static_cast<std::size_t>(peer)]);
  }
  out += " #" + std::to_string(sequence);
  if (group) out += " on " + group->name + " " + ranks_text(group->ranks);
  out += " (" + dtype;
  for (const auto& shape : shapes) out += " " + shape_text(shape);
  return out + ", step " + std::to_string(step) + ")";
}

FlightRecorder::FlightRecorder(std::size_t capacity) : capacity_(capacity) {
  if (capacity == 0) throw Error("a flight recorder keeps at least one collective");
  ring_.reserve(capacity);
}

std::int64_t FlightRecorder::issued(CollectiveRecord record) {
  record.step = step_;
  record.issued_us = wall_clock_us();
  record.finished_us = 0;
  record.state = CollectiveState::kIssued;
  std::lock_guard<std::mutex> lock(mutex_);
  record.id = next_id_++;
  if (ring_.size() < capacity_) {
    ring_.push_back(std::move(record));
  } else {
    ring_[static_cast<std::size_t>(record.id) % capacity_] = std::move(record);
  }
  return next_id_ - 1;
}

void FlightRecorder::finished(std::int64_t id, bool ok) {
  const std::int64_t now = wall_clock_us();
  std::lock_guard<std::mutex> lock(mutex_);
  const std::size_t slot = static_cast<std::size_t>(id) % capacity_;
  if (slot >= ring_.size() || ring_[slot].id != id) return;
  CollectiveRecord& record = ring_[slot];
  if (record.state != CollectiveState::kIssued) return;
  record.state = ok ? CollectiveState::kCompleted : CollectiveState::kFailed;
  record.finished_us = now;
}

std::vector<CollectiveRecord> FlightRecorder::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<CollectiveRecord> out;
  out.reserve(ring_.size());
  // Once full, the oldest record sits where the next one will go.
  const std::size_t first =
      ring_.size() < capacity_ ? 0 : static_cast<std::size_t>(next_id_) % capacity_;
  for (std::size_t k = 0; k < ring_.size(); ++k) out.push_back(ring_[(first + k) % ring_.size()]);
  return out;
}

std::int64_t wall_clock_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void write_flight_record(const std::filesystem::path& file, const FlightRecorder& recorder,
                         int rank, int world_size, const std::string& reason) {
  std::ostringstream out;
  out << "{\"format\":\"trainyard-flight-record\",\"version\":1,\"rank\":" << rank
      << ",\"world_size\":" << world_size << ",\"reason\":" << json_quote(reason)
      << ",\"dumped_us\":" << wall_clock_us() << ",\"step\":" << recorder.step()
      << ",\"capacity\":" << recorder.capacity() << ",\"records\":[";
  const std::vector<CollectiveRecord> records = recorder.snapshot();
  for (std::size_t k = 0; k < records.size(); ++k) {
    out << (k ? ",\n" : "\n");
    write_record(out, records[k]);
  }
  out << "\n]}\n";
  std::filesystem::create_directories(file.parent_path());
  write_file_whole(file, out.str(), "flight record");
}

void set_flight_record_dump(std::function<void(const std::string& reason)> dump) {
  DumpSlot& slot = dump_slot();
  std::lock_guard<std::mutex> lock(slot.mutex);
  slot.dump = std::move(dump);
}

void dump_flight_record(const std::string& reason) {
  DumpSlot& slot = dump_slot();
  std::lock_guard<std::mutex> lock(slot.mutex);
  if (!slot.dump) return;
  try {
    slot.dump(reason);
  } catch (const std::exception&) {
    // The dump serves a diagnosis; it never replaces the failure being reported.
  }
}

void dump_flight_record_on_terminate() {
  static std::once_flag installed;
  std::call_once(installed, [] { g_previous_terminate = std::set_terminate(dump_then_terminate); });
}

void dump_flight_record_on_sigusr2() {
  static std::once_flag installed;
  std::call_once(installed, [] {
    std::thread([] {
      for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (g_dump_requested.exchange(false)) dump_flight_record("SIGUSR2");
      }
    }).detach();
    struct sigaction action {};
    action.sa_handler = request_dump;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(SIGUSR2, &action, nullptr);
  });
}

}  // namespace trainyard
