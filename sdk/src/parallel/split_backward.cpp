#include "trainyard/parallel/split_backward.hpp"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/ones_like.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "trainyard/api/error.hpp"

namespace trainyard {

namespace {

using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::variable_list;

// The gradients that reached each branch point during the input half (the weight half calls
// the branch points directly, which runs no hook). Shared with the hooks, which hold no node, so
// nothing here keeps the graph alive in a cycle.
struct Kept {
  std::unordered_map<const Node*, variable_list> gradients;
};

class KeepGradients final : public torch::autograd::FunctionPreHook {
 public:
  KeepGradients(std::shared_ptr<Kept> kept, const Node* node)
      : kept_(std::move(kept)), node_(node) {}
  variable_list operator()(const variable_list& grads) override {
    kept_->gradients[node_] = grads;
    return grads;
  }

 private:
  std::shared_ptr<Kept> kept_;
  const Node* node_;
};

// For every node reachable from `roots`: whether one of `inputs` and whether one of
// `parameters` can be reached from it (bit 1 and bit 2). Iterative, for deep graphs.
class Reach {
 public:
  static constexpr std::uint8_t kInput = 1;
  static constexpr std::uint8_t kParameter = 2;

  Reach(const std::vector<Edge>& roots, const std::unordered_set<const Node*>& inputs,
        const std::unordered_set<const Node*>& parameters) {
    for (const Edge& root : roots) {
      if (root.is_valid()) visit(root.function.get(), inputs, parameters);
    }
  }

  std::uint8_t of(const Node* node) const {
    auto it = flags_.find(node);
    return it == flags_.end() ? 0 : it->second;
  }
  const std::vector<Node*>& nodes() const { return order_; }

 private:
  std::unordered_map<const Node*, std::uint8_t> flags_;
  std::vector<Node*> order_;

  void visit(Node* start, const std::unordered_set<const Node*>& inputs,
             const std::unordered_set<const Node*>& parameters) {
    if (flags_.count(start)) return;
    // Post-order: a node's flags are its own target bits and its children's.
    std::vector<std::pair<Node*, std::size_t>> stack{{start, 0}};
    flags_[start] = 0;
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->num_outputs()) {
        const Edge& edge = node->next_edge(next++);
        Node* child = edge.function.get();
        if (child && !flags_.count(child)) {
          flags_[child] = 0;
          stack.emplace_back(child, 0);
        }
        continue;
      }
      std::uint8_t flags = 0;
      if (inputs.count(node)) flags |= kInput;
      if (parameters.count(node)) flags |= kParameter;
      for (const Edge& edge : node->next_edges()) {
        if (edge.is_valid()) flags |= flags_[edge.function.get()];
      }
      flags_[node] = flags;
      order_.push_back(node);
      stack.pop_back();
    }
  }
};

}  // namespace

namespace {

// Whether `edge` is one of `branches` (the same node and input).
bool is_branch_of(const std::vector<Edge>& branches, const Edge& edge) {
  for (const Edge& branch : branches) {
    if (branch.function == edge.function && branch.input_nr == edge.input_nr) return true;
  }
  return false;
}

}  // namespace

struct SplitBackward::State {
  enum class Stage { kNew, kInputDone, kWeightDone };
  Stage stage = Stage::kNew;
  std::shared_ptr<Kept> kept = std::make_shared<Kept>();
  // Each branch point (kept alive with the graph below it) and its parameter branches.
  struct BranchPoint {
    std::shared_ptr<Node> node;
    std::vector<Edge> branches;
  };
  std::vector<BranchPoint> branch_points;
  std::size_t branch_count = 0;
  // Root edges that lead to parameters without passing the inputs' path, and their gradients:
  // the weight half starts there too.
  std::vector<Edge> direct_roots;
  variable_list direct_gradients;
};

SplitBackward::SplitBackward() : state_(std::make_unique<State>()) {}
SplitBackward::~SplitBackward() = default;
SplitBackward::SplitBackward(SplitBackward&&) noexcept = default;
SplitBackward& SplitBackward::operator=(SplitBackward&&) noexcept = default;

std::vector<at::Tensor> SplitBackward::input_half(const std::vector<at::Tensor>& roots,
                                                  const std::vector<at::Tensor>& root_grads,
                                                  const std::vector<at::Tensor>& inputs,
                                                  const std::vector<at::Tensor>& parameters) {
  if (state_->stage != State::Stage::kNew) throw Error("SplitBackward: input_half runs once");
  state_->stage = State::Stage::kInputDone;
  std::vector<at::Tensor> input_grads(inputs.size());
  std::vector<Edge> root_edges;
  variable_list root_values;
  for (std::size_t i = 0; i < roots.size(); ++i) {
    if (!roots[i].requires_grad()) continue;
    root_edges.push_back(torch::autograd::impl::gradient_edge(roots[i]));
    root_values.push_back(i < root_grads.size() && root_grads[i].defined()
                              ? root_grads[i]
                              : at::ones_like(roots[i], at::MemoryFormat::Preserve));
  }
  if (root_edges.empty()) return input_grads;

  std::vector<Edge> input_edges;
  std::vector<std::size_t> input_positions;
  std::unordered_set<const Node*> input_nodes;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requires_grad()) continue;
    input_edges.push_back(torch::autograd::impl::gradient_edge(inputs[i]));
    input_positions.push_back(i);
    input_nodes.insert(input_edges.back().function.get());
  }
  std::unordered_set<const Node*> parameter_nodes;
  for (const auto& parameter : parameters) {
    if (!parameter.requires_grad()) continue;
    if (auto accumulator = torch::autograd::impl::try_get_grad_accumulator(parameter)) {
      parameter_nodes.insert(accumulator.get());
    }
  }
  const Reach reach(root_edges, input_nodes, parameter_nodes);
  const auto on_input_path = [&](const Node* node) {
    return (reach.of(node) & Reach::kInput) != 0;
  };
  const auto leads_to_parameters = [&](const Node* node) {
    return (reach.of(node) & Reach::kParameter) != 0;
  };
  // Parameter branches leaving the inputs' path: kept gradients at their nodes.
  for (Node* node : reach.nodes()) {
    if (!on_input_path(node) || !leads_to_parameters(node)) continue;
    State::BranchPoint point;
    for (const Edge& edge : node->next_edges()) {
      if (edge.is_valid() && leads_to_parameters(edge.function.get()) &&
          !on_input_path(edge.function.get())) {
        point.branches.push_back(edge);
      }
    }
    if (point.branches.empty()) continue;
    node->add_pre_hook(std::make_unique<KeepGradients>(state_->kept, node));
    point.node = node->getptr();
    state_->branch_points.push_back(std::move(point));
  }
  for (std::size_t i = 0; i < root_edges.size(); ++i) {
    const Node* node = root_edges[i].function.get();
    if (leads_to_parameters(node) && !on_input_path(node)) {
      state_->direct_roots.push_back(root_edges[i]);
      state_->direct_gradients.push_back(root_values[i]);
    }
  }
  if (!input_edges.empty()) {
    // Only what leads to the inputs runs: the engine computes a node's outputs along needed
    // edges alone, so no weight-gradient product runs here.
    const variable_list grads = torch::autograd::Engine::get_default_engine().execute(
        root_edges, root_values, /*keep_graph=*/true, /*create_graph=*/false,
        /*accumulate_grad=*/false, input_edges);
    for (std::size_t k = 0; k < input_positions.size(); ++k) {
      input_grads[input_positions[k]] = grads[k];
    }
  }
  state_->branch_count = state_->branch_points.size();
  return input_grads;
}

void SplitBackward::weight_half() {
  if (state_->stage != State::Stage::kInputDone) {
    throw Error("SplitBackward: weight_half runs once, after input_half");
  }
  state_->stage = State::Stage::kWeightDone;
  auto& engine = torch::autograd::Engine::get_default_engine();
  const auto is_branch = [](const State::BranchPoint& point, const Edge& edge) {
    return edge.is_valid() && is_branch_of(point.branches, edge);
  };
  std::vector<Edge> starts = std::move(state_->direct_roots);
  variable_list gradients = std::move(state_->direct_gradients);
  // A branch point that gives large parameter gradients (a recomputed block's node gives the
  // whole block's at once) has those its branches alone reach accumulated as soon as it has
  // run: held until the final run, the stage's would all be alive together, beside those
  // accumulated already. Small ones wait, an engine run costing more than they hold, as do
  // accumulators reached more than once, which the final run sums before they run (their hooks
  // fire once).
  constexpr std::int64_t kAccumulatedAtOnce = 256 << 10;
  std::unordered_map<const Node*, int> reaching;
  for (const Edge& start : starts) ++reaching[start.function.get()];
  for (const auto& point : state_->branch_points) {
    for (const Edge& edge : point.branches) ++reaching[edge.function.get()];
  }
  const auto accumulates_alone = [&](const Edge& edge) {
    return reaching[edge.function.get()] == 1 &&
           dynamic_cast<const torch::autograd::AccumulateGrad*>(edge.function.get()) != nullptr;
  };
  // Each branch point once more, for its parameter branches alone, from the gradient it got:
  // called directly with its edges towards the inputs cut for the call, so that it computes only
  // the outputs its parameter branches take (outside an engine run a node computes the outputs
  // of its valid edges; an engine run per node would walk the graph below it each time).
  for (auto& point : state_->branch_points) {
    auto kept = state_->kept->gradients.find(point.node.get());
    if (kept == state_->kept->gradients.end()) continue;  // no gradient reached it
    Node& node = *point.node;
    std::vector<std::pair<std::size_t, Edge>> cut;
    for (std::size_t i = 0; i < node.num_outputs(); ++i) {
      if (!node.next_edge(i).is_valid() || is_branch(point, node.next_edge(i))) continue;
      cut.emplace_back(i, node.next_edge(i));
      // Written in place: set_next_edge would re-rank the node in a graph that has run.
      node.next_edges()[i] = Edge();
    }
    variable_list outputs;
    {
      at::NoGradGuard no_grad;
      outputs = node(variable_list(kept->second));
    }
    for (auto& [i, edge] : cut) node.next_edges()[i] = std::move(edge);
    node.release_variables();
    std::vector<Edge> accumulators;
    variable_list accumulated;
    for (std::size_t i = 0; i < outputs.size() && i < node.num_outputs(); ++i) {
      const Edge& edge = node.next_edge(i);
      if (!outputs[i].defined() || !is_branch(point, edge)) continue;
      const bool alone = accumulates_alone(edge);
      (alone ? accumulators : starts).push_back(edge);
      (alone ? accumulated : gradients).push_back(std::move(outputs[i]));
    }
    outputs.clear();
    state_->kept->gradients.erase(kept);
    std::int64_t accumulated_bytes = 0;
    for (const at::Tensor& gradient : accumulated) {
      accumulated_bytes += static_cast<std::int64_t>(gradient.nbytes());
    }
    if (accumulated_bytes < kAccumulatedAtOnce) {
      starts.insert(starts.end(), accumulators.begin(), accumulators.end());
      gradients.insert(gradients.end(), accumulated.begin(), accumulated.end());
    } else {
      engine.execute(accumulators, accumulated, /*keep_graph=*/true, /*create_graph=*/false,
                     /*accumulate_grad=*/true);
    }
  }
  state_->branch_points.clear();
  // Then every branch down to the parameters, accumulating (branches that meet, such as a
  // weight cast once and used twice, are summed before their shared node runs).
  if (!starts.empty()) {
    engine.execute(starts, gradients, /*keep_graph=*/false, /*create_graph=*/false,
                   /*accumulate_grad=*/true);
  }
}

std::size_t SplitBackward::branch_points() const { return state_->branch_count; }

}  // namespace trainyard
