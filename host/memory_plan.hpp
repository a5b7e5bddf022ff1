#pragma once
// The bytes a rank of a layout holds, composed from the probe's figures (memory_probe.hpp): the
// parameters, gradients and optimizer state it keeps between steps, the activations a forward
// keeps for backward, and the step's peak with the phase it falls in, and the step's time. The
// phases are the engine's (step_phases.hpp), so that the plan lines up with what
// run.track_memory measures.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memory_probe.hpp"
#include "trainyard/parallel/pipeline_schedule.hpp"

namespace trainyard {

// How a strategy holds the model on a rank.
enum class ModelHolding {
  kWhole,         // one process: gradients made by each backward, freed when a step starts
  kReplicated,    // a replica per rank, gradients kept in flat buckets between steps
  kShardedUnits,  // units along the blocks, sharded as `sharding` says (sharded_units.hpp)
  kStages,        // consecutive blocks per pipeline stage, run by a schedule's actions
};

// How one rank of a layout holds the model.
struct PlanLayout {
  std::string strategy;  // the plugin's name, for messages
  ModelHolding holding = ModelHolding::kWhole;
  std::string sharding = "full";  // sharded units: full, grad_op or none
  bool prefetch = true;           // sharded units: the next unit gathered while one runs
  bool zero1 = false;             // replicated: optimizer state sharded
  std::int64_t shard_ranks = 1;   // the ranks state is sharded over
  std::int64_t micro_batch = 1;   // samples per micro-batch on the rank
  std::int64_t accumulation = 1;  // micro-batches per optimizer step
  int threads = 1;                // intra-op threads per rank
  int tp = 1;                     // tensor-parallel ranks each split layer is divided over
  int ranks = 1;                  // the layout's processes
  std::string comm_plugin;        // the communicator its collectives run on (ranks > 1)
  // The ranks' threads per core where they outnumber the cores (at least 1): the probe timed
  // one rank alone, and ranks sharing cores compute that much slower.
  double core_sharing = 1;
  // Stages: the schedule each pipeline rank runs, the recipe's named cut (empty: balanced by the
  // blocks' costs), the batch the step splits into micro-batches, and whether the stages are
  // replicated over data-parallel ranks (gradients kept in flat buckets).
  PipelineSchedule schedule;
  std::vector<std::string> stage_names;
  std::int64_t batch_samples = 1;
  bool replicated_stages = false;
};

struct PhasePeak {
  std::string phase;  // step_phase_name()
  std::int64_t bytes = 0;
};

struct PlannedMemory {
  std::int64_t parameters = 0;  // trainable, as held between steps
  std::int64_t gradients = 0;
  std::int64_t optimizer_state = 0;
  std::int64_t frozen = 0;  // parameters without gradients, and buffers
  std::int64_t activations = 0;
  // Whole parameters a forward leaves gathered (sharded units: the root and the last block's, or
  // every unit under grad_op): with the activations, what a forward allocates and keeps.
  std::int64_t gathered_forward = 0;
  // Pipeline stages: the inputs received from the previous stage that the micro-batches in
  // flight keep (communication buffers, posted before they are needed).
  std::int64_t received = 0;
  // What the forwards since the last backward allocate and keep, as run.track_memory measures
  // it: the activations and gathered parameters, or for a pipeline rank the forwards its
  // schedule runs in a row (fewer than it holds where older micro-batches wait for backward).
  std::int64_t forward_held = 0;
  std::int64_t step_start = 0;    // live when a step starts
  std::vector<PhasePeak> phases;  // each phase's peak, in step order
  PhasePeak peak;                 // the highest of them
  // The step's time on the host CPU: the probe's timed forwards and backwards of the rank's
  // micro-batches (through the schedule, for a pipeline rank) and its optimizer step, slowed by
  // the ranks' sharing of cores (PlanLayout::core_sharing).
  double compute_seconds = 0;
  double optimizer_seconds = 0;
  // Bytes a step's collectives and sends move per rank (ring algorithms: an all-reduce moves
  // 2 (n-1)/n of its buffer, an all-gather or reduce-scatter (n-1)/n), and how many calls.
  std::int64_t communication_bytes = 0;
  double communication_calls = 0;
  // Of those calls, the ones posted ahead of the compute that needs them, whose fixed cost
  // passes while the ranks compute: a pipeline's sends and receives, and fsdp's prefetched
  // gathers and its reductions but the last.
  double posted_calls = 0;
  // Of those bytes and calls, the all-reduces' (ddp's buckets, the tensor-parallel collectives, a
  // pipeline's norm): priced on the communicator's all-reduce path, which among ranks of one host
  // may be faster than the link (through shared memory).
  std::int64_t reduce_bytes = 0;
  double reduce_calls = 0;
  // Their time over the communicator's measured link (link_probe.hpp), none of the bytes' time
  // hidden behind compute: on the host CPU a collective's work takes the cores the compute needs.
  double communication_seconds = 0;
  // A pipeline rank: the schedule's forward and backward in the simulation's time units, the
  // bytes of its transfers between ranks (in communication_bytes) and of the largest message,
  // for time_communication to time those transfers through the schedule, where a message the
  // next action waits for delays the step by its whole latency.
  std::optional<PipelineCosts> schedule_costs;
  std::int64_t transfer_bytes = 0;
  std::int64_t message_bytes = 0;
  double step_seconds() const {
    return compute_seconds + optimizer_seconds + communication_seconds;
  }
  // The parameters as a run counts what it holds: trainable and frozen (buffers included).
  std::int64_t held_parameters() const { return parameters + frozen; }
};

// A rank of a data-parallel layout (every rank alike).
PlannedMemory plan_memory(const ModelFootprint& model, const PlanLayout& layout);

// Each pipeline rank of a kStages layout, in rank order: its stages' parameters (a tied
// parameter's copy with each stage that uses it), and the activations of the micro-batches its
// schedule holds in flight at most, each stage's received input included.
std::vector<PlannedMemory> plan_pipeline(const ModelFootprint& model, const PlanLayout& layout);

// What a pipeline rank's transfers between ranks add to its step when each message takes
// `message_seconds` from its send to its arrival: the schedule simulated with that delay less
// the schedule without, slowed by the ranks' sharing of cores as its compute is. 0 for a rank
// that is not a pipeline's.
double pipeline_transfer_seconds(const PlanLayout& layout, const PlannedMemory& rank,
                                 double message_seconds);

}  // namespace trainyard
