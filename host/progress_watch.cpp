#include "progress_watch.hpp"

namespace trainyard {
namespace {

std::string seconds(std::chrono::milliseconds period) {
  return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(period).count()) + " s";
}

}  // namespace

ProgressWatch::ProgressWatch(std::chrono::milliseconds period, int world_size)
    : period_(period), last_(static_cast<std::size_t>(world_size)),
      beat_changed_(static_cast<std::size_t>(world_size), Clock::now()) {}

std::optional<Hang> ProgressWatch::observe(const std::vector<Heartbeat>& beats,
                                           Clock::time_point now) {
  bool stepped = false;
  bool all_finished = true;
  for (std::size_t r = 0; r < beats.size() && r < last_.size(); ++r) {
    const Heartbeat& beat = beats[r];
    if (beat.counter != last_[r].counter || beat.finished) beat_changed_[r] = now;
    if (beat.present && beat.step != last_[r].step) stepped = true;
    all_finished = all_finished && beat.finished;
    last_[r] = beat;
  }
  if (all_finished) return std::nullopt;
  for (std::size_t r = 0; r < beats.size(); ++r) {
    // A rank that has never beaten is still starting; its peers' rendezvous time-out covers it.
    if (beats[r].present && now - beat_changed_[r] > period_) {
      return Hang{"rank " + std::to_string(r) + "'s heartbeat stopped " + seconds(period_) +
                      " ago (the process is frozen or stopped)",
                  {static_cast<int>(r)}};
    }
  }
  if (stepped) step_changed_ = now;
  if (!step_changed_ || now - *step_changed_ <= period_) return std::nullopt;
  // Every process beats, no step moves: blame the ranks that are not waiting on the others.
  Hang hang;
  std::string steps;
  for (std::size_t r = 0; r < beats.size(); ++r) {
    steps += (r ? ", " : "") + std::to_string(beats[r].step);
    if (!beats[r].waiting && !beats[r].finished) hang.ranks.push_back(static_cast<int>(r));
  }
  if (hang.ranks.empty()) {
    for (std::size_t r = 0; r < beats.size(); ++r) hang.ranks.push_back(static_cast<int>(r));
  }
  std::string blamed;
  for (int r : hang.ranks) blamed += (blamed.empty() ? "" : ", ") + std::to_string(r);
  hang.reason = "no rank began a step for " + seconds(period_) + " (steps by rank: " + steps +
                "); stuck outside a collective: rank " + blamed;
  return hang;
}

}  // namespace trainyard
