#include "shared_memory_segment.hpp"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <csignal>
#include <filesystem>
#include <new>
#include <random>
#include <sstream>
#include <string>

namespace trainyard {
namespace {

std::int64_t round_up(std::int64_t value, std::int64_t to) { return (value + to - 1) / to * to; }

struct alignas(kCacheLine) SegmentHeader {
  std::uint64_t nonce = 0;
  std::int64_t capacity = 0;
  std::int32_t size = 0;
};

struct Layout {
  std::int64_t controls;  // offset of the control blocks
  std::int64_t staging;   // offset of rank 0's staging area
  std::int64_t total;
};

Layout layout_of(int size, std::int64_t capacity) {
  Layout layout{};
  layout.controls = round_up(sizeof(SegmentHeader), kCacheLine);
  layout.staging =
      round_up(layout.controls + size * static_cast<std::int64_t>(sizeof(RankControl)), 4096);
  layout.total = layout.staging + size * capacity;
  return layout;
}

std::uint64_t pid_namespace() {
  struct stat status {};
  return stat("/proc/self/ns/pid", &status) == 0 ? status.st_ino : 0;
}

// A descriptor that becomes readable when process `pid` ends (even before it is reaped); -1
// where the kernel has no pidfd.
int watch_process(int pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

std::vector<std::uint8_t> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }
std::string text_of(const std::vector<std::uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

// Maps `name`, created or opened; null when it cannot.
void* map_named(const std::string& name, std::int64_t bytes, bool create) {
  const int fd = shm_open(name.c_str(), create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0) return nullptr;
  bool sized = true;
  if (create) sized = ftruncate(fd, bytes) == 0 && posix_fallocate(fd, 0, bytes) == 0;
  struct stat status {};
  sized = sized && fstat(fd, &status) == 0 && status.st_size == bytes;
  void* base = sized ? mmap(nullptr, static_cast<std::size_t>(bytes), PROT_READ | PROT_WRITE,
                            MAP_SHARED, fd, 0)
                     : MAP_FAILED;
  close(fd);
  if (base == MAP_FAILED) {
    if (create) shm_unlink(name.c_str());
    return nullptr;
  }
  return base;
}

// A segment's name is removed once every rank has mapped it; a rank 0 that died before that
// left its name behind. Names of processes that have ended, an hour old or more, are removed
// before a new one is made (the age keeps a live setup of another pid namespace's safe).
void remove_stale_names() {
  namespace fs = std::filesystem;
  std::error_code error;
  const auto hour_ago = fs::file_time_type::clock::now() - std::chrono::hours(1);
  for (const auto& entry : fs::directory_iterator("/dev/shm", error)) {
    const std::string file = entry.path().filename().string();
    const std::string prefix = "trainyard-";
    if (file.rfind(prefix, 0) != 0) continue;
    const int pid = std::atoi(file.c_str() + prefix.size());
    std::error_code unread;
    const auto written = fs::last_write_time(entry.path(), unread);
    if (pid <= 0 || unread || written > hour_ago) continue;
    if (kill(pid, 0) == -1 && errno == ESRCH) shm_unlink(("/" + file).c_str());
  }
}

// Rank 0's segment, its header and control blocks constructed; null when it cannot.
void* create_segment(const std::string& name, std::uint64_t nonce, int size,
                     std::int64_t capacity) {
  const Layout layout = layout_of(size, capacity);
  void* base = map_named(name, layout.total, /*create=*/true);
  if (!base) return nullptr;
  auto* header = new (base) SegmentHeader();
  header->nonce = nonce;
  header->capacity = capacity;
  header->size = size;
  for (int of = 0; of < size; ++of) {
    new (static_cast<std::byte*>(base) + layout.controls + of * sizeof(RankControl)) RankControl();
  }
  return base;
}

// The segment rank 0 named, when it is the one rank 0 made for this group.
void* open_segment(const std::string& name, std::uint64_t nonce, int size, std::int64_t capacity) {
  const Layout layout = layout_of(size, capacity);
  void* base = map_named(name, layout.total, /*create=*/false);
  const auto* header = static_cast<const SegmentHeader*>(base);
  if (base && (header->nonce != nonce || header->size != size || header->capacity != capacity)) {
    munmap(base, static_cast<std::size_t>(layout.total));
    return nullptr;
  }
  return base;
}

}  // namespace

std::unique_ptr<SharedSegment> SharedSegment::map(c10d::Store& store, int rank, int size,
                                                  std::int64_t capacity) {
  capacity = round_up(std::max<std::int64_t>(capacity, 4096), kCacheLine);
  const Layout layout = layout_of(size, capacity);
  const std::string name_key = "trainyard_shared_memory";
  std::unique_ptr<SharedSegment> segment(new SharedSegment());
  std::string name;
  std::uint64_t nonce = 0;
  if (rank == 0) {
    remove_stale_names();
    std::random_device random;
    nonce = (static_cast<std::uint64_t>(random()) << 32) ^ random();
    std::ostringstream named;
    named << "/trainyard-" << getpid() << "-" << std::hex << nonce;
    name = named.str();
    segment->base_ = create_segment(name, nonce, size, capacity);
    store.set(name_key,
              bytes_of(segment->base_ ? name + " " + std::to_string(nonce) : std::string()));
  } else {
    std::istringstream named(text_of(store.get(name_key)));
    if (named >> name >> nonce) segment->base_ = open_segment(name, nonce, size, capacity);
  }
  void* base = segment->base_;
  segment->mapped_ = layout.total;
  segment->capacity_ = capacity;
  if (base) {
    segment->controls_ =
        reinterpret_cast<RankControl*>(static_cast<std::byte*>(base) + layout.controls);
    segment->staging_ = static_cast<std::byte*>(base) + layout.staging;
    segment->control(rank).pid = getpid();
    segment->control(rank).pid_namespace = pid_namespace();
  }
  store.set(name_key + "_mapped_" + std::to_string(rank), bytes_of(base ? "1" : "0"));
  bool everyone = true;
  for (int of = 0; of < size; ++of) {
    everyone = text_of(store.get(name_key + "_mapped_" + std::to_string(of))) == "1" && everyone;
  }
  if (rank == 0 && base) shm_unlink(name.c_str());
  if (!everyone) return nullptr;
  const std::uint64_t own_namespace = pid_namespace();
  for (int of = 0; of < size; ++of) {
    const RankControl& peer = segment->control(of);
    const bool watchable =
        of != rank && peer.pid != getpid() && peer.pid_namespace == own_namespace;
    segment->processes_.push_back(watchable ? watch_process(peer.pid) : -1);
  }
  return segment;
}

SharedSegment::~SharedSegment() {
  for (int fd : processes_) {
    if (fd >= 0) close(fd);
  }
  if (base_) munmap(base_, static_cast<std::size_t>(mapped_));
}

bool SharedSegment::process_ended(int of) const {
  const int pidfd = processes_[static_cast<std::size_t>(of)];
  if (pidfd < 0) return false;
  pollfd watch{pidfd, POLLIN, 0};
  return poll(&watch, 1, 0) > 0;
}

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t observed,
                std::chrono::nanoseconds timeout) {
  timespec interval{};
  interval.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
  interval.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, observed, &interval,
          nullptr, 0);
}

void futex_wake(std::atomic<std::uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
          0);
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace trainyard
