#include "layout_plan.hpp"

#include <algorithm>
#include <iostream>

#include "link_probe.hpp"
#include "memory_probe.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/device.hpp"
#include "trainyard/api/error.hpp"
#include "trainyard/api/registry.hpp"
#include "trainyard/parallel/mesh_layout.hpp"
#include "trainyard/runtime/cpu_binding.hpp"
#include "trainyard/runtime/default_plugins.hpp"
#include "trainyard/runtime/recipe.hpp"

namespace trainyard {

namespace {

// A pipeline's layout: the schedule its ranks run (from its file, or built by name), the
// micro-batches the batch splits into, the recipe's named cut, and how the stages are held over
// data-parallel ranks.
void plan_stages(const Config& strategy, const MeshLayout& mesh, PlanLayout& layout) {
  // Stages replicated over the data-parallel ranks, or sharded over dp_shard as fsdp's units.
  layout.sharding = strategy.has("dp_sharding") ? strategy.get_string("dp_sharding") : "none";
  layout.shard_ranks = mesh.size(MeshAxis::kDataShard);
  const int ranks = mesh.size(MeshAxis::kPipeline);
  std::int64_t micro_batches = strategy.get_int("micro_batches");
  if (micro_batches == 0) micro_batches = ranks;
  const std::filesystem::path file = strategy.get_path("schedule_file");
  layout.schedule =
      file.empty() ? build_pipeline_schedule(strategy.get_string("schedule"),
                                             {ranks, static_cast<int>(micro_batches),
                                              static_cast<int>(strategy.get_int("virtual_stages"))})
                   : read_schedule_file(file);
  layout.stage_names = strategy.get_string_list("stages");
  layout.batch_samples = layout.micro_batch;
  if (layout.batch_samples % micro_batches != 0) {
    throw Error("plan: a batch of " + std::to_string(layout.batch_samples) +
                " samples does not split into " + std::to_string(micro_batches) + " micro-batches");
  }
  layout.micro_batch = layout.batch_samples / micro_batches;
  layout.replicated_stages = mesh.size(MeshGroup::kData) > 1;
}

// The communicator the recipe's ranks would connect with: its [comm] plugin, or the host CPU's
// default (the planner times the layout on this machine's CPU).
std::string communicator_plugin(const Recipe& resolved, const Registry& registry) {
  const Config comm = resolved.section("comm");
  if (comm.has("plugin")) return comm.get_string("plugin");
  return registry
      .create<DeviceBackend>(default_plugins::kDevice, Config({}, "device"), BuildContext{})
      ->default_comm();
}

// The layout of the recipe's [strategy] and [parallel] on `nproc` processes (0: the product of
// the [parallel] sizes), as a rank of it holds the model.
PlanLayout layout_of(const Recipe& resolved, int nproc, const Registry& registry,
                     std::string& described) {
  const MeshRequest request = mesh_request(resolved.section("parallel"));
  if (nproc <= 0) {
    nproc = request.pp * request.dp_replicate * std::max(request.dp_shard, 1) * request.tp;
  }
  const MeshLayout mesh = MeshLayout::resolve(request, nproc);
  const Config strategy = resolved.section("strategy");
  PlanLayout layout;
  layout.strategy = strategy.get_string("plugin");
  // A tensor-parallel rank holds its pieces of the split layers: the probe builds the model as
  // such a rank, and the strategy holds those pieces as it holds a whole model.
  layout.tp = mesh.size(MeshAxis::kTensor);
  layout.ranks = nproc;
  if (nproc > 1) layout.comm_plugin = communicator_plugin(resolved, registry);
  // How the strategy holds the model, from the options it declares: units sharded as its
  // `sharding` says, or a replica whose optimizer state `zero1` may shard; the default strategy
  // holds the whole model in one process.
  const std::string name = layout.strategy;
  const int data_ranks = mesh.size(MeshGroup::kData);
  layout.micro_batch = resolved.section("loader").get_int("batch_size");
  layout.accumulation = resolved.section("run").get_int("grad_accumulation");
  // The intra-op threads each rank gets: the recipe's, or the cores shared by the ranks.
  const auto threads = resolved.section("run").get_int("threads");
  const auto cores = static_cast<int>(std::max<std::size_t>(1, allowed_cpus().size()));
  layout.threads = threads > 0 ? static_cast<int>(threads) : std::max(1, cores / nproc);
  layout.core_sharing =
      std::max(1.0, static_cast<double>(nproc * layout.threads) / static_cast<double>(cores));
  if (name == default_plugins::kStrategy) {
    layout.holding = ModelHolding::kWhole;
    if (nproc != 1) {
      throw Error("plan: " + name + " runs on one rank; choose a data-parallel strategy for " +
                  std::to_string(nproc));
    }
  } else if (strategy.has("schedule") && strategy.has("micro_batches")) {
    layout.holding = ModelHolding::kStages;
    plan_stages(strategy, mesh, layout);
  } else if (strategy.has("sharding") && strategy.has("prefetch")) {
    layout.holding = ModelHolding::kShardedUnits;
    layout.sharding = strategy.get_string("sharding");
    layout.prefetch = strategy.get_bool("prefetch");
    layout.shard_ranks = mesh.size(MeshAxis::kDataShard);
  } else if (strategy.has("zero1")) {
    layout.holding = ModelHolding::kReplicated;
    layout.zero1 = strategy.get_bool("zero1");
    layout.shard_ranks = data_ranks;
  } else {
    throw Error("plan: strategy '" + name +
                "' declares neither 'sharding' nor 'zero1': plan cannot tell how it holds the "
                "model");
  }
  if (layout.holding != ModelHolding::kStages && mesh.size(MeshAxis::kPipeline) > 1) {
    throw Error("plan: pp " + std::to_string(mesh.size(MeshAxis::kPipeline)) +
                " needs a strategy "
                "that cuts the model into stages; '" +
                name + "' does not");
  }
  described = name +
              (layout.holding == ModelHolding::kShardedUnits ? " (" + layout.sharding + ")" : "") +
              (layout.holding == ModelHolding::kStages && layout.sharding != "none"
                   ? " (stages sharded: " + layout.sharding + ")"
                   : "") +
              (layout.zero1 ? " (zero1)" : "") + " on " + mesh.describe() + ", micro-batch " +
              std::to_string(layout.micro_batch);
  return layout;
}

}  // namespace

const ModelFootprint& ProbeCache::probe(const std::filesystem::path& recipe,
                                        const std::vector<std::string>& overrides,
                                        std::int64_t micro_batch, int threads, int tp,
                                        const std::string& checkpointing,
                                        const Registry& registry) {
  const auto key = std::make_tuple(micro_batch, threads, tp, checkpointing);
  auto found = probes_.find(key);
  if (found == probes_.end()) {
    found = probes_.emplace(key, probe_model(recipe, overrides, micro_batch, threads, tp, registry))
                .first;
  }
  return found->second;
}

std::vector<std::string> with_settings(std::vector<std::string> settings,
                                       const std::vector<std::string>& more) {
  settings.insert(settings.end(), more.begin(), more.end());
  return settings;
}

LayoutPlan plan_layout(const std::filesystem::path& recipe,
                       const std::vector<std::string>& overrides, int nproc,
                       const Registry& registry, ProbeCache* cache) {
  const Recipe resolved = resolve_recipe(load_recipe(recipe, overrides), registry);
  LayoutPlan plan;
  plan.layout = layout_of(resolved, nproc, registry, plan.described);
  ProbeCache own;
  const ModelFootprint& footprint =
      (cache ? *cache : own)
          .probe(recipe, overrides, plan.layout.micro_batch, plan.layout.threads, plan.layout.tp,
                 resolved.section("run").get_string("activation_checkpointing"), registry);
  if (plan.layout.holding == ModelHolding::kStages) {
    plan.pipeline_ranks = plan_pipeline(footprint, plan.layout);
    plan.memory = *std::max_element(
        plan.pipeline_ranks.begin(), plan.pipeline_ranks.end(),
        [](const PlannedMemory& a, const PlannedMemory& b) { return a.peak.bytes < b.peak.bytes; });
  } else {
    plan.memory = plan_memory(footprint, plan.layout);
  }
  return plan;
}

void time_communication(LayoutPlan& plan, const Registry& registry) {
  if (plan.layout.ranks < 2 || plan.layout.comm_plugin.empty()) return;
  // The link is measured with no more ranks than cores (ranks that outnumber the cores time the
  // scheduler, not the communicator). Ranks that share cores then wait for them to copy and sum
  // the bytes, as in their compute, and for the fixed cost of each call over the link as well:
  // its helper threads need the cores the ranks compute on. An all-reduce's fixed cost on the
  // communicator's own path is the wait for the last member to arrive, run in the waiting
  // thread; sharing cores does not lengthen it as much (4 ranks on 2 cores, pipeline 2 x tp 2,
  // all-reduces in shared memory: planned at 1.45 of the measured step with it slowed, 1.05
  // not; fsdp 2 x tp 2: 0.92 and 0.80).
  const auto cores = static_cast<int>(std::max<std::size_t>(2, allowed_cpus().size()));
  const LinkCost link = cached_or_measured_link(
      registry, plan.layout.comm_plugin, std::min(plan.layout.ranks, cores), link_cache_folder(),
      [](const std::string& line) { std::cerr << line << "\n"; });
  // A pipeline's transfers between ranks are timed through its schedule: each message arrives
  // a message's latency and its bytes' time after its send, which delays the step where the next
  // action waits for it (the ramps, and 1F1B's steady state, whose receives are on its critical
  // path), and costs nothing where the rank computes meanwhile.
  const auto timed = [&](PlannedMemory& memory) {
    const double reduced = link.reduce_seconds(0, static_cast<double>(memory.reduce_bytes));
    const double reduce_calls = link.reduce_seconds(memory.reduce_calls, 0);
    const double over_link =
        link.seconds(memory.communication_calls - memory.posted_calls - memory.reduce_calls,
                     static_cast<double>(memory.communication_bytes - memory.transfer_bytes -
                                         memory.reduce_bytes));
    memory.communication_seconds =
        plan.layout.core_sharing * (over_link + reduced) + reduce_calls +
        pipeline_transfer_seconds(
            plan.layout, memory,
            link.message_seconds(1, static_cast<double>(memory.message_bytes)));
  };
  timed(plan.memory);
  for (auto& rank : plan.pipeline_ranks) timed(rank);
  plan.link = link;
}

}  // namespace trainyard
