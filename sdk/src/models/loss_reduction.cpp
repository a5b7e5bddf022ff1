#include "trainyard/models/loss_reduction.hpp"

namespace trainyard {

OptionSpec loss_reduction_option(std::string help) {
  return option("loss_reduction", "mean", std::move(help)).one_of({"mean", "sum"});
}

LossReduction loss_reduction_from(const Config& options) {
  const std::string name = options.get_string("loss_reduction");
  if (name == "mean") return LossReduction::kMean;
  if (name == "sum") return LossReduction::kSum;
  options.fail("loss_reduction", "must be mean or sum, got \"" + name + "\"");
}

}  // namespace trainyard
