// The classifiers' FLOPs per sample (what mfu divides by) against PyTorch's own count: the
// venv's torch.utils.flop_counter.FlopCounterMode over one forward and backward of the same
// layers on a batch, which counts every matrix multiply and convolution that runs, and no
// input gradient for the layer that reads the batch.

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "test_support.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/model.hpp"

namespace trainyard::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kBatch = 8;

// The same layers as the mlp's and the cnn's built below
// on Fashion-MNIST's shapes; prints the FLOPs of one forward and backward of kBatch samples.
const char* kCountScript = R"(
import sys, torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
kind = sys.argv[1]
if kind == "mlp":
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                          nn.Linear(32, 10))
else:
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(8 * 7 * 7, 16), nn.ReLU(), nn.Linear(16, 10))
x = torch.randn(int(sys.argv[2]), 1, 28, 28)
target = torch.randint(0, 10, (x.shape[0],))
with FlopCounterMode(display=False) as counter:
    nn.functional.cross_entropy(model(x), target).backward()
print(counter.get_total_flops())
)";

double trainyard_flops(const std::string& plugin, const std::map<std::string, Value>& options) {
  auto table = std::make_shared<Table>();
  for (const auto& [key, value] : options) table->set(key, value);
  BuildContext context;
  context.data.input_shape = {1, 28, 28};
  context.data.num_classes = 10;
  return bundled_registry().create<Model>(plugin, Config(table, "model"), context)->flops_per_sample() *
         kBatch;
}

double pytorch_flops(const std::string& kind) {
  const fs::path python = source_dir() / ".venv" / "bin" / "python";
  if (!fs::exists(python)) {
    ADD_FAILURE() << "no " << python << " (run tools/setup --tests)";
    return -1;
  }
  const CommandResult counted =
      run_command({python.string(), "-c", kCountScript, kind, std::to_string(kBatch)}, {}, 120);
  EXPECT_EQ(counted.exit_code, 0) << describe(counted);
  return std::stod(counted.out);
}

TEST(ClassifierFlops, TheMlpCountsWhatPyTorchsFlopCounterCounts) {
  const double ours = trainyard_flops("mlp", {{"hidden", Value(Array{Value(64), Value(32)})}});
  EXPECT_DOUBLE_EQ(ours, pytorch_flops("mlp"));
}

TEST(ClassifierFlops, TheCnnCountsWhatPyTorchsFlopCounterCounts) {
  const double ours = trainyard_flops("cnn", {{"channels", Value(Array{Value(4), Value(8)})},
                                              {"hidden", Value(16)},
                                              {"batch_norm", Value(false)}});
  EXPECT_DOUBLE_EQ(ours, pytorch_flops("cnn"));
}

}  // namespace
}  // namespace trainyard::testing
