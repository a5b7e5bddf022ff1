// The plugin API as a binary sees it: one exported function whose parameters reach every type a
// plugin and the host exchange. Built with full debug information for those types, it is what
// libabigail's abidw records and abidiff compares against the last release's record
// (tools/abi/check): a virtual function added, removed or reordered, a field moved, a parameter
// changed, all show up as changes to this function's parameter types.

#include "trainyard/batch.hpp"
#include "trainyard/build_context.hpp"
#include "trainyard/checkpoint.hpp"
#include "trainyard/communicator.hpp"
#include "trainyard/component.hpp"
#include "trainyard/config.hpp"
#include "trainyard/dataset.hpp"
#include "trainyard/device.hpp"
#include "trainyard/metrics.hpp"
#include "trainyard/model.hpp"
#include "trainyard/optimizer.hpp"
#include "trainyard/plugin.hpp"
#include "trainyard/precision.hpp"
#include "trainyard/registry.hpp"
#include "trainyard/scheduler.hpp"
#include "trainyard/state.hpp"
#include "trainyard/strategy.hpp"

extern "C" __attribute__((visibility("default"))) void trainyard_plugin_api_surface(
    trainyard::PluginDescriptor*, trainyard::Registry*, trainyard::ComponentInfo*,
    trainyard::Config*, trainyard::OptionSpec*, trainyard::BuildContext*, trainyard::Batch*,
    trainyard::StateDict*, trainyard::CheckpointState*, trainyard::DeviceBackend*,
    trainyard::DeviceEvent*, trainyard::DeviceMemory*, trainyard::DeviceUtilisation*,
    trainyard::Communicator*, trainyard::Rendezvous*, trainyard::Dataset*, trainyard::MapSource*,
    trainyard::StreamSource*, trainyard::SampleStream*, trainyard::Model*, trainyard::Block*,
    trainyard::Optimizer*, trainyard::LrScheduler*, trainyard::Strategy*,
    trainyard::StrategyContext*, trainyard::StepResult*, trainyard::EvalResult*,
    trainyard::Precision*, trainyard::CheckpointBackend*, trainyard::MetricsSink*,
    trainyard::RunInfo*, trainyard::MetricRecord*) {}
