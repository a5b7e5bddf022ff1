// What the engine does after a step that went wrong: a non-finite step under
// on_nonfinite = "rollback", or a loss spike (run.spike). Both go back to the last checkpoint and
// never train on the step's batches again.

#include <limits>
#include <utility>

#include "engine_state.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/precision.hpp"

namespace trainyard {
namespace {

// "(loader batches E:B,E:B)": the batches of the step, as run.skip_batches spells them.
std::string describe_batches(const std::vector<std::pair<std::int64_t, std::int64_t>>& batches) {
  SkippedBatches listed;
  for (const auto& [epoch, batch] : batches) listed.add(epoch, batch);
  return " (loader batches " + listed.save() + ")";
}

}  // namespace

void Engine::set_up_guards() {
  State& s = *state_;
  if (rolls_back() && !s.checkpointing) {
    const std::string setting = s.spike.enabled() && s.spike.rolls_back()
                                    ? "run.spike.action = \"rollback\""
                                    : "run.on_nonfinite = \"rollback\"";
    throw Error(setting +
                " rolls back to the last checkpoint, and the recipe has no [checkpoint] section: "
                "add one (checkpoint.every_steps bounds how far back a rollback goes), or stop "
                "instead");
  }
  NonfiniteSettings nonfinite;
  nonfinite.action = s.run.on_nonfinite == "skip"       ? NonfiniteSettings::Action::kSkip
                     : s.run.on_nonfinite == "rollback" ? NonfiniteSettings::Action::kRollback
                                                        : NonfiniteSettings::Action::kStop;
  nonfinite.max_in_a_row = s.run.max_nonfinite_in_a_row;
  nonfinite.precision_scales = s.components.precision->scales_loss();
  // Every rank stops alike; a skip is told once.
  s.nonfinite = std::make_unique<NonfiniteGuard>(
      nonfinite, s.runtime->rank() == 0 ? s.logger() : [](const std::string&) {});
}

void Engine::record_step_event(const std::string& phase, std::int64_t step, double loss,
                               std::int64_t epoch) {
  State& s = *state_;
  const auto& [batch_epoch, batch] = s.step_batches.front();
  s.reporter->write_event(phase, step, epoch, s.elapsed(),
                          {{"loss", loss},
                           {"epoch_index", static_cast<double>(batch_epoch)},
                           {"batch_index", static_cast<double>(batch)},
                           {"batch_count", static_cast<double>(s.step_batches.size())}});
}

std::optional<std::string> Engine::loss_spike(const StepResult& result, std::int64_t epoch) {
  State& s = *state_;
  if (!s.spike.enabled()) return std::nullopt;
  // The global batch's loss, the mean over the ranks that hold one: every rank judges alike.
  const bool held = result.loss.defined();
  std::vector<double> losses = {held ? result.loss.item<double>() : 0.0, held ? 1.0 : 0.0};
  if (s.runtime->multi_process()) losses = s.runtime->sum(std::move(losses));
  const double loss = losses[1] > 0 ? losses[0] / losses[1] : 0.0;
  const std::optional<std::string> spike = s.spike.check(s.step, loss);
  if (!spike) return std::nullopt;
  s.reporter->flush_train(s.step, epoch, s.elapsed());
  record_step_event("spike", s.step, loss, epoch);
  const std::string where = *spike + describe_batches(s.step_batches);
  if (!s.spike.rolls_back()) {
    throw Error(where +
                "; run.spike.action = \"rollback\" would reload the last checkpoint "
                "and skip them");
  }
  return where;
}

std::optional<TrainingPosition> Engine::roll_back_if_needed(const StepResult& result,
                                                            std::int64_t epoch) {
  State& s = *state_;
  std::optional<std::string> why = std::exchange(s.rollback_reason, std::nullopt);
  if (why) {
    s.reporter->flush_train(s.step, epoch, s.elapsed());
    *why += describe_batches(s.step_batches);
  } else {
    why = loss_spike(result, epoch);
  }
  if (!why) return std::nullopt;
  for (const auto& [epoch_index, batch] : s.step_batches) s.skipped_batches.add(epoch_index, batch);
  s.checkpointing->commit_pending();
  const std::optional<TrainingPosition> saved =
      s.checkpointing->resume("auto", [](const std::string&) {});
  if (!saved) {
    // A run resumed from a checkpoint outside its folder has saved none there yet.
    throw Error(*why + ", and " + s.checkpointing->policy().folder.string() +
                " holds no checkpoint to roll back to yet");
  }
  TrainingPosition back = *saved;
  s.rollbacks_to_target = back.step == s.rollback_target ? s.rollbacks_to_target + 1 : 1;
  s.rollback_target = back.step;
  if (s.rollbacks_to_target > s.run.max_rollbacks) {
    throw Error(*why + "; that is " + std::to_string(s.rollbacks_to_target) +
                " rollbacks to the checkpoint of step " + std::to_string(back.step) +
                " (run.max_rollbacks), so the trouble is not in single batches: stopping");
  }
  s.step = back.step;
  s.restore(back);  // adds the checkpoint's skipped batches to these
  s.spike.rewind(back.step);
  // The checkpoint rolled back to is written again with the batches to skip, so that a run
  // resumed from it before the next save skips them too.
  s.checkpointing->save(s.position_at(back.epoch, back.batch_in_epoch));
  if (s.runtime->rank() == 0) {
    s.log("trainyard: " + *why + ": rolled back to the checkpoint of step " +
          std::to_string(back.step) + "; those batches are never trained on");
  }
  return back;
}

bool Engine::rolls_back() const {
  const State& s = *state_;
  return (s.spike.enabled() && s.spike.rolls_back()) || s.run.on_nonfinite == "rollback";
}

}  // namespace trainyard
