// The plugin API as a binary sees it: exported functions whose parameters reach every type a
// plugin and the host exchange. Built with full debug information for those types, it is what
// libabigail's abidw records and abidiff compares against the last release's record
// (tools/abi/check): a virtual function added, removed or reordered, a field moved, a parameter
// changed, all show up as changes to these functions' parameter types.
//
// Every installed header is included, and every one's types or free functions reach one of the
// two functions: trainyard_plugin_api_surface takes the interfaces a plugin implements, and
// trainyard_plugin_api_helpers the SDK's helper classes, and pointers to its free functions (a
// pointer to a function records its signature). InstalledHeaders.AllReachTheAbiSurface checks
// that every installed header is included here.

#include "trainyard/api/activation_checkpoint.hpp"
#include "trainyard/api/activations.hpp"
#include "trainyard/api/batch.hpp"
#include "trainyard/parallel/block_norms.hpp"
#include "trainyard/parallel/block_selection.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/parallel/c10d_communicator.hpp"
#include "trainyard/api/checkpoint.hpp"
#include "trainyard/api/checkpoint_file.hpp"
#include "trainyard/models/classification.hpp"
#include "trainyard/parallel/collective_counter.hpp"
#include "trainyard/api/communicator.hpp"
#include "trainyard/api/component.hpp"
#include "trainyard/api/config.hpp"
#include "trainyard/api/dataset.hpp"
#include "trainyard/api/sample_timing.hpp"
#include "trainyard/api/skipped_samples.hpp"
#include "trainyard/parallel/declared_schedule.hpp"
#include "trainyard/api/device.hpp"
#include "trainyard/parallel/mesh_layout.hpp"
#include "trainyard/parallel/distributed.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/gradient_compression.hpp"
#include "trainyard/parallel/flight_diagnosis.hpp"
#include "trainyard/parallel/flight_recorder.hpp"
#include "trainyard/support/files.hpp"
#include "trainyard/parallel/gradient_reducer.hpp"
#include "trainyard/parallel/gradient_verdict.hpp"
#include "trainyard/parallel/gradients.hpp"
#include "trainyard/parallel/held_blocks.hpp"
#include "trainyard/api/held_bytes.hpp"
#include "trainyard/support/host_cpu.hpp"
#include "trainyard/support/json_quote.hpp"
#include "trainyard/support/libtorch_build.hpp"
#include "trainyard/support/mapped_file.hpp"
#include "trainyard/models/pretrained_weights.hpp"
#include "trainyard/support/safetensors_dtype.hpp"
#include "trainyard/support/safetensors_layout.hpp"
#include "trainyard/models/loss_reduction.hpp"
#include "trainyard/api/metrics.hpp"
#include "trainyard/parallel/micro_batch.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/support/module_state.hpp"
#include "trainyard/api/optimizer.hpp"
#include "trainyard/models/deferred_parameters.hpp"
#include "trainyard/models/parameter_init.hpp"
#include "trainyard/api/parameter_pieces.hpp"
#include "trainyard/parallel/pipeline_schedule.hpp"
#include "trainyard/parallel/pipeline_stages.hpp"
#include "trainyard/parallel/pipeline_timeline.hpp"
#include "trainyard/api/placed_state.hpp"
#include "trainyard/api/plugin.hpp"
#include "trainyard/api/precision.hpp"
#include "trainyard/parallel/process_mesh.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/parallel/replicated_step.hpp"
#include "trainyard/api/sample_index.hpp"
#include "trainyard/api/scheduler.hpp"
#include "trainyard/models/sequential_block.hpp"
#include "trainyard/models/sequential_classifier.hpp"
#include "trainyard/parallel/sharded_optimizer_state.hpp"
#include "trainyard/parallel/sharded_units.hpp"
#include "trainyard/parallel/split_backward.hpp"
#include "trainyard/api/state.hpp"
#include "trainyard/api/step_phases.hpp"
#include "trainyard/api/strategy.hpp"
#include "trainyard/support/strict_json.hpp"
#include "trainyard/parallel/tensor_parallel.hpp"
#include "trainyard/parallel/tensor_parallel_step.hpp"
#include "trainyard/api/version.hpp"

#include <functional>
#include <optional>

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
    trainyard::RunInfo*, trainyard::MetricRecord*, trainyard::GradientCompression*,
    trainyard::BucketCompressor*, trainyard::GradientBucket*, trainyard::BucketShapes*) {}

namespace trainyard::abi {

// The signatures of the SDK's free functions, one member per function (overloads each named).
struct FreeFunctions {
  decltype(&classification_sums) classification_sums_fn;
  torch::Tensor (*classification_loss_fn)(const torch::Tensor&, const Batch&);
  torch::Tensor (*classification_loss_reduced_fn)(const torch::Tensor&, const Batch&,
                                                  LossReduction);
  decltype(&remove_tree) remove_tree_fn;
  decltype(&sync_to_disk) sync_to_disk_fn;
  decltype(&held_blocks) held_blocks_fn;
  decltype(&json_quote) json_quote_fn;
  decltype(&libtorch_build_settings) libtorch_build_settings_fn;
  decltype(&libtorch_build_setting) libtorch_build_setting_fn;
  decltype(&libtorch_built_with) libtorch_built_with_fn;
  decltype(&loss_reduction_option) loss_reduction_option_fn;
  decltype(&loss_reduction_from) loss_reduction_from_fn;
  torch::Tensor (*forward_backward_fn)(Model&, const std::vector<Block>&, const Batch&,
                                       std::int64_t, const StrategyContext&,
                                       std::optional<torch::ScalarType>);
  torch::Tensor (*forward_backward_observed_fn)(Model&, const std::vector<Block>&, const Batch&,
                                                std::int64_t, const StrategyContext&,
                                                std::optional<torch::ScalarType>,
                                                const std::function<void()>&);
  decltype(&save_module_state) save_module_state_fn;
  decltype(&load_module_state) load_module_state_fn;
  decltype(&named_stages) named_stages_fn;
  decltype(&balanced_stages) balanced_stages_fn;
  decltype(&describe_stages) describe_stages_fn;
  decltype(&stage_cut_key) stage_cut_key_fn;
  decltype(&finish_replicated_step) finish_replicated_step_fn;
  decltype(&judge_gradients) judge_gradients_fn;
  decltype(&first_nonfinite_parameter) first_nonfinite_parameter_fn;
  decltype(&test_nonfinite_hook) test_nonfinite_hook_fn;
  decltype(&set_test_hook_step) set_test_hook_step_fn;
  decltype(&table_option) table_option_fn;
  decltype(&evaluate_blocks) evaluate_blocks_fn;
  decltype(&parse_strict_json) parse_strict_json_fn;
  decltype(&squares_over_group) squares_over_group_fn;
  decltype(&agree_on_found_inf) agree_on_found_inf_fn;
  decltype(&gather_whole_tensors) gather_whole_tensors_fn;
  decltype(&on_gradient_ready) on_gradient_ready_fn;
  decltype(&gradients_of) gradients_of_fn;
  decltype(&global_norm) global_norm_fn;
  decltype(&clip_to_norm) clip_to_norm_fn;
  decltype(&safetensors::read_layout) safetensors_read_layout_fn;
  decltype(&safetensors::known_dtypes) safetensors_known_dtypes_fn;
  decltype(&safetensors::dtype_name) safetensors_dtype_name_fn;
  decltype(&safetensors::scalar_type) safetensors_scalar_type_fn;
  decltype(&collective_state_name) collective_state_name_fn;
  decltype(&wall_clock_us) wall_clock_us_fn;
  decltype(&write_flight_record) write_flight_record_fn;
  decltype(&set_flight_record_dump) set_flight_record_dump_fn;
  decltype(&dump_flight_record) dump_flight_record_fn;
  decltype(&dump_flight_record_on_sigusr2) dump_flight_record_on_sigusr2_fn;
  decltype(&dump_flight_record_on_terminate) dump_flight_record_on_terminate_fn;
  decltype(&read_flight_record) read_flight_record_fn;
  decltype(&read_flight_records) read_flight_records_fn;
  decltype(&diagnose_flight_records) diagnose_flight_records_fn;
  decltype(&rank_set_text) rank_set_text_fn;
  decltype(&sample_stage_name) sample_stage_name_fn;
  decltype(&add_sample_time) add_sample_time_fn;
  decltype(&take_sample_times) take_sample_times_fn;
  decltype(&report_skipped_sample) report_skipped_sample_fn;
  decltype(&skipped_samples) skipped_samples_fn;
  decltype(&block_squares) block_squares_fn;
  decltype(&set_block_norms) set_block_norms_fn;
};

}  // namespace trainyard::abi

extern "C" __attribute__((visibility("default"))) void trainyard_plugin_api_helpers(
    trainyard::abi::FreeFunctions*, trainyard::ActivationCheckpointing*, trainyard::Activations*,
    trainyard::BlockSelection*, trainyard::C10dCommunicator*, trainyard::CheckpointFileInfo*,
    trainyard::CheckpointFileWriter*, trainyard::CollectiveCount*, trainyard::CollectiveCounter*,
    trainyard::MeshRequest*, trainyard::MeshCoordinates*, trainyard::MeshLayout*,
    trainyard::ListeningSocket*, trainyard::CollectiveWait*, trainyard::FailureMonitor*,
    trainyard::Error*, trainyard::GradientReducerOptions*, trainyard::UnusedParametersError*,
    trainyard::GradientReducer*, trainyard::HeldBytes*, trainyard::ProcessCpuUsage*,
    trainyard::ParameterInit*, trainyard::GlobalGeneratorGuard*, trainyard::ParameterPiece*,
    trainyard::PipelineAction*, trainyard::PipelineShape*, trainyard::PipelineSchedule*,
    trainyard::PipelineCosts*, trainyard::TimedAction*, trainyard::RankSimulation*,
    trainyard::PipelineSimulation*, trainyard::IdleShareFormula*, trainyard::MeasuredAction*,
    trainyard::RankTimeline*, trainyard::MeasuredPipelineTimeline*, trainyard::TensorPlacement*,
    trainyard::PlacedState*, trainyard::ProcessMesh*, trainyard::SequentialClassifier*,
    trainyard::ShardedOptimizerState*, trainyard::ShardedUnitsOptions*,
    trainyard::ShardedUnitLayout*, trainyard::ShardedUnits*, trainyard::PhaseSpan*,
    trainyard::PhaseRollup*, trainyard::PhaseClock*, trainyard::TensorParallelGroup*,
    trainyard::ColumnParallelLinearImpl*, trainyard::RowParallelLinearImpl*,
    trainyard::VocabParallelEmbeddingImpl*, trainyard::DeclaredSchedule*, trainyard::MappedFile*,
    trainyard::PretrainedWeights*, trainyard::PretrainedWeights::TensorInfo*,
    trainyard::safetensors::Layout*, trainyard::DeferredParameters*, trainyard::SplitBackward*,
    trainyard::CollectiveGroup*, trainyard::CollectiveRecord*, trainyard::FlightRecorder*,
    trainyard::FlightRecordFile*, trainyard::SampleDraws*, trainyard::SampleTimes*,
    trainyard::SampleTimer*, trainyard::SkippedSamples*, trainyard::ParameterBlocks*) {}
