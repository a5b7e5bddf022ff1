// A classifier of one hidden layer (model "paced_mlp") whose step is made `slowdown` times longer
// on purpose, for compare's verdicts: its last block waits `slowdown` times the time the rest of
// the previous step took (from its previous call to this one, less that call's own wait), so a
// run with slowdown 0.1 is 10% slower than one with 0, whatever the machine's speed. One forward
// per optimizer step (single strategy, no accumulation) is what it measures.

#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <chrono>
#include <optional>

#include "trainyard/api/plugin.hpp"
#include "trainyard/models/sequential_classifier.hpp"

namespace trainyard {
namespace {

using Clock = std::chrono::steady_clock;

struct PaceImpl : torch::nn::Module {
  explicit PaceImpl(double slowdown) : slowdown(slowdown) {}

  torch::Tensor forward(torch::Tensor x) {
    const auto now = Clock::now();
    if (previous_call && is_training() && slowdown > 0) {
      const auto worked = (now - *previous_call) - waited;
      waited = std::chrono::duration_cast<Clock::duration>(worked * slowdown);
      // Spinning, not sleeping: a sleeping process gives its core away and waits for it again,
      // which on a busy machine costs more than the sleep itself.
      const auto until = now + waited;
      while (Clock::now() < until) {
      }
    }
    previous_call = now;
    return x;
  }

  double slowdown;
  std::optional<Clock::time_point> previous_call;
  Clock::duration waited{0};
};
TORCH_MODULE(Pace);

class PacedMlp final : public SequentialClassifier {
 public:
  PacedMlp(const Config& options, const BuildContext& context)
      : SequentialClassifier("paced_mlp", context, {"layers", "pace"}) {
    std::int64_t features = 1;
    for (auto d : context.data.input_shape) features *= d;
    const std::int64_t hidden = options.get_int("hidden");
    const std::int64_t classes = context.data.num_classes;
    const auto multiply_adds = static_cast<double>((features + classes) * hidden);
    const auto reading_input = static_cast<double>(features * hidden);
    add_block(
        "layers", multiply_adds,
        [&] {
          torch::nn::Sequential layers;
          layers->push_back(torch::nn::Flatten());
          layers->push_back(torch::nn::Linear(features, hidden));
          layers->push_back(torch::nn::ReLU());
          layers->push_back(torch::nn::Linear(hidden, classes));
          return layers;
        },
        reading_input);
    const double slowdown = options.get_float("slowdown");
    add_block("pace", 0, [&] { return Pace(slowdown); });
  }
};

void register_components(Registry& registry) {
  registry.add<Model>(
      "paced_mlp",
      {option("slowdown", 0.0, "extra share of each step spent waiting").at_least(0),
       option("hidden", std::int64_t{64}, "hidden layer width").at_least(1)},
      "a linear classifier whose steps are slowed on purpose",
      [](const Config& options, const BuildContext& context) {
        return std::make_unique<PacedMlp>(options, context);
      });
}

}  // namespace
}  // namespace trainyard

TRAINYARD_PLUGIN("paced_mlp", "1.0.0", trainyard::register_components)
