#include "shared_memory_segment.hpp"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <sstream>
#include <string>

namespace trainyard {
namespace {

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

}  // namespace

std::vector<std::uint8_t> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }
std::string text_of(const std::vector<std::uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

std::uint64_t fresh_nonce() {
  std::random_device random;
  return (static_cast<std::uint64_t>(random()) << 32) ^ random();
}

int usable_cores() {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  return sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? std::max(1, CPU_COUNT(&cpus)) : 1;
}

std::string fresh_segment_name(std::uint64_t nonce) {
  remove_stale_names();
  std::ostringstream named;
  named << "/trainyard-" << getpid() << "-" << std::hex << nonce;
  return named.str();
}

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

std::uint64_t pid_namespace() {
  struct stat status {};
  return stat("/proc/self/ns/pid", &status) == 0 ? status.st_ino : 0;
}

// Readable even before the ended process is reaped.
int watch_process(int pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

bool process_has_ended(int pidfd) {
  if (pidfd < 0) return false;
  pollfd watch{pidfd, POLLIN, 0};
  return poll(&watch, 1, 0) > 0;
}

namespace {

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

std::int64_t staging_capacity(std::int64_t bytes) {
  return round_up(std::max<std::int64_t>(bytes, 4096), kCacheLine);
}

namespace {

const std::string kNameKey = "trainyard_shared_memory";
std::string mapped_key(int rank) { return kNameKey + "_mapped_" + std::to_string(rank); }

}  // namespace

SegmentSetup::SegmentSetup(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                           std::int64_t capacity)
    : store_(std::move(store)), rank_(rank), size_(size), answers_(size, -1) {
  segment_.reset(new SharedSegment());
  segment_->mapped_ = layout_of(size, capacity).total;
  segment_->capacity_ = capacity;
  if (rank_ != 0) return;
  const std::uint64_t nonce = fresh_nonce();
  name_ = fresh_segment_name(nonce);
  segment_->base_ = create_segment(name_, nonce, size, capacity);
  store_->set(kNameKey,
              bytes_of(segment_->base_ ? name_ + " " + std::to_string(nonce) : std::string()));
}

SegmentSetup::~SegmentSetup() {
  // Rank 0 given up on before every rank answered: nobody else removes the name.
  if (rank_ == 0 && segment_ && segment_->base_ && outcome_ == Outcome::kPending) {
    shm_unlink(name_.c_str());
  }
}

SegmentSetup::Outcome SegmentSetup::step() {
  if (outcome_ != Outcome::kPending) return outcome_;
  SharedSegment& segment = *segment_;
  if (!answered_) {
    if (rank_ != 0) {
      if (!store_->check({kNameKey})) return outcome_;
      std::istringstream named(text_of(store_->get(kNameKey)));
      std::uint64_t nonce = 0;
      if (named >> name_ >> nonce) {
        segment.base_ = open_segment(name_, nonce, size_, segment.capacity_);
      }
    }
    if (segment.base_) {
      const Layout layout = layout_of(size_, segment.capacity_);
      segment.controls_ =
          reinterpret_cast<RankControl*>(static_cast<std::byte*>(segment.base_) + layout.controls);
      segment.staging_ = static_cast<std::byte*>(segment.base_) + layout.staging;
      segment.control(rank_).pid = getpid();
      segment.control(rank_).pid_namespace = pid_namespace();
    }
    store_->set(mapped_key(rank_), bytes_of(segment.base_ ? "1" : "0"));
    answered_ = true;
  }
  for (int of = 0; of < size_; ++of) {
    auto& answer = answers_[static_cast<std::size_t>(of)];
    if (answer >= 0) continue;
    if (!store_->check({mapped_key(of)})) return outcome_;
    answer = text_of(store_->get(mapped_key(of))) == "1" ? 1 : 0;
  }
  if (rank_ == 0 && segment.base_) shm_unlink(name_.c_str());
  if (std::find(answers_.begin(), answers_.end(), 0) != answers_.end()) {
    segment_.reset();
    return outcome_ = Outcome::kRefused;
  }
  const std::uint64_t own_namespace = pid_namespace();
  for (int of = 0; of < size_; ++of) {
    const RankControl& peer = segment.control(of);
    const bool watchable =
        of != rank_ && peer.pid != getpid() && peer.pid_namespace == own_namespace;
    segment.processes_.push_back(watchable ? watch_process(peer.pid) : -1);
  }
  return outcome_ = Outcome::kShared;
}

std::unique_ptr<SharedSegment> SegmentSetup::take() { return std::move(segment_); }

namespace {

// Ranks that can map each other's segments: one boot of one machine, one /dev/shm.
const std::string& host_identity() {
  static const std::string identity = [] {
    std::ifstream boot("/proc/sys/kernel/random/boot_id");
    std::string id;
    std::getline(boot, id);
    struct stat shm {};
    if (id.empty() || stat("/dev/shm", &shm) != 0) return std::string();
    return id + " " + std::to_string(shm.st_dev) + " " + std::to_string(shm.st_ino);
  }();
  return identity;
}

std::string host_key(int rank) { return "trainyard_host_" + std::to_string(rank); }

}  // namespace

void announce_host(c10d::Store& store, int rank) {
  store.set(host_key(rank), bytes_of(host_identity() + "|" + std::to_string(getpid()) + " " +
                                     std::to_string(pid_namespace())));
}

AnnouncedRank announced_rank(c10d::Store& store, int rank) {
  const std::string text = text_of(store.get(host_key(rank)));
  const auto bar = text.rfind('|');
  AnnouncedRank announced;
  announced.on_this_host = !host_identity().empty() && bar != std::string::npos &&
                           text.substr(0, bar) == host_identity();
  int pid = 0;
  std::uint64_t name_space = 0;
  if (bar != std::string::npos) std::istringstream(text.substr(bar + 1)) >> pid >> name_space;
  if (announced.on_this_host && name_space == pid_namespace() && pid != getpid()) {
    announced.pid = pid;
  }
  return announced;
}

SharedSegment::~SharedSegment() {
  for (int fd : processes_) {
    if (fd >= 0) close(fd);
  }
  if (base_) munmap(base_, static_cast<std::size_t>(mapped_));
}

bool SharedSegment::process_ended(int of) const {
  return process_has_ended(processes_[static_cast<std::size_t>(of)]);
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
