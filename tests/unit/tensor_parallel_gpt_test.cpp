// The `gpt` model split over a tp group of ranks as threads over gloo (tp 2 and 4): each rank
// holds exactly the boxes of the whole model's initial weights that parameter_layout names, and
// the loss on every rank, every parameter's gradient (assembled from the ranks' pieces) and the
// eval sums equal the whole model's, with and without sequence parallelism, with targets of -100
// among the tokens; pipeline stages of a split model continue each other as the whole model's
// blocks do; sizes that do not split are one-line errors.
//
// Dropout is 0 throughout: a split build draws other dropout masks than the whole model (fewer
// heads' attention masks per rank; with sequence parallelism, one mask per slice of the sequence
// from the same generator state on every rank), so only without dropout can it equal the whole
// model.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>

#include "step_harness.hpp"
#include "trainyard/api/build_context.hpp"
#include "trainyard/api/model.hpp"
#include "trainyard/models/parameter_init.hpp"
#include "trainyard/parallel/process_mesh.hpp"

namespace trainyard::testing {
namespace {

constexpr std::int64_t kVocab = 48;  // divides by 2 and 4
constexpr std::int64_t kLength = 8;
constexpr std::uint64_t kSeed = 11;
// Four heads: one per rank at tp 4.
const std::string kSmall = "n_layers = 2\nn_heads = 4\nd_model = 32\ndropout = 0.0\n";

BuildContext language_context(std::int64_t vocab, std::int64_t length) {
  BuildContext context;
  context.seed = kSeed;
  context.data.input_shape = {length};
  context.data.vocab_size = vocab;
  context.data.sequence_length = length;
  return context;
}

std::shared_ptr<Model> build_gpt(const std::string& options, const BuildContext& context) {
  // Building saves and restores the global generator (GlobalGeneratorGuard): one rank at a time.
  static std::mutex building;
  std::lock_guard<std::mutex> lock(building);
  return bundled_registry().create<Model>("gpt", options_section("model", options), context);
}

// Three sequences; targets are the next tokens, with five ignored in the first sequence and one
// in the last.
Batch train_batch() {
  at::Generator generator = at::detail::createCPUGenerator(3);
  const at::Tensor ids = at::randint(kVocab, {3, kLength}, generator, at::kLong);
  Batch batch;
  batch.size = 3;
  batch.tensors["input"] = ids;
  at::Tensor target = ids.roll(-1, 1).clone();
  target[0].narrow(0, 0, 5).fill_(-100);
  target[2].narrow(0, 3, 1).fill_(-100);
  batch.tensors["target"] = target;
  return batch;
}

// The train batch with every other scored target replaced by the token the whole model predicts
// there, so that its accuracy is far from zero and any other prediction by a split build shows.
Batch eval_batch(Model& whole) {
  Batch batch = train_batch();
  whole.module().eval();
  at::NoGradGuard no_grad;
  const at::Tensor predicted = run_blocks(whole, whole.blocks(), batch).argmax(-1);
  at::Tensor target = batch.at("target").clone();
  const at::Tensor every_other = at::arange(kLength).remainder(2).eq(0).expand_as(target);
  target = at::where(every_other.logical_and(target.ne(-100)), predicted, target);
  batch.tensors["target"] = target;
  return batch;
}

// What a build holds of one parameter: its initial values, its gradient after one backward and
// the pieces of the whole model's parameters it is.
struct Held {
  at::Tensor initial;
  at::Tensor gradient;
  HeldLayout layout;
};

struct Outcome {
  std::map<std::string, Held> parameters;  // by name in module()
  double loss = 0;
  TensorMap eval;
  double flops = 0;
};

void record_parameters(Model& model, Outcome& out) {
  for (const auto& item : model.module().named_parameters()) {
    Held& held = out.parameters[item.key()];
    held.initial = item.value().detach().clone();
    held.layout = model.parameter_layout(item.key(), item.value());
  }
}

void record_gradients(Model& model, Outcome& out) {
  for (const auto& item : model.module().named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key() << " got no gradient";
    out.parameters[item.key()].gradient = item.value().grad().clone();
  }
}

// One forward and backward on `train` in training mode, then eval_sums on `eval`.
Outcome run(Model& model, const Batch& train, const Batch& eval) {
  Outcome out;
  record_parameters(model, out);
  model.module().train();
  const auto blocks = model.blocks();
  const at::Tensor loss = model.loss(run_blocks(model, blocks, train), train);
  loss.backward();
  out.loss = loss.item<double>();
  record_gradients(model, out);
  model.module().eval();
  at::NoGradGuard no_grad;
  for (const auto& [name, sum] : model.eval_sums(run_blocks(model, blocks, eval), eval)) {
    out.eval[name] = sum.clone();
  }
  out.flops = model.flops_per_sample();
  return out;
}

// The whole model's parameters by name: their initial values, or their gradients.
TensorMap whole_values(const Outcome& whole, at::Tensor Held::*field) {
  TensorMap out;
  for (const auto& [name, held] : whole.parameters) out[name] = held.*field;
  return out;
}

// The part of `whole` that `piece` places (a box; a whole placement is the box of everything).
at::Tensor box_of(const at::Tensor& whole, const ParameterPiece& piece) {
  at::Tensor box = whole;
  for (std::size_t dim = 0; dim < piece.shape.size(); ++dim) {
    box =
        box.narrow(static_cast<std::int64_t>(dim), piece.placement.offsets[dim], piece.shape[dim]);
  }
  return box;
}

// Whether each piece every rank holds of `field` (initial values, bitwise when `exact`, or
// gradients, within fp32's tolerance) equals the same box of the whole model's parameter, and the
// ranks' pieces together cover every element of every whole parameter.
::testing::AssertionResult pieces_match(const std::vector<Outcome>& ranks, const TensorMap& whole,
                                        at::Tensor Held::*field, bool exact) {
  std::map<std::string, at::Tensor> covered;
  for (const auto& [name, tensor] : whole) covered[name] = at::zeros_like(tensor, at::kBool);
  for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
    for (const auto& [held_name, held] : ranks[rank].parameters) {
      const at::Tensor flat = (held.*field).reshape({-1});
      for (const ParameterPiece& piece : held.layout) {
        auto where =
            "rank " + std::to_string(rank) + "'s " + held_name + " (a piece of " + piece.name + ")";
        auto it = whole.find(piece.name);
        if (it == whole.end()) return ::testing::AssertionFailure() << where << ": no such whole";
        if (piece.placement.global_shape != it->second.sizes().vec() ||
            piece.placement.flat_offset >= 0) {
          return ::testing::AssertionFailure() << where << ": not a box of the whole's shape";
        }
        const at::Tensor actual = flat.narrow(0, piece.offset, piece.length).view(piece.shape);
        const at::Tensor expected = box_of(it->second, piece);
        const bool same =
            exact ? at::equal(actual, expected) : at::allclose(actual, expected, 1.3e-6, 1e-5);
        if (!same) {
          return ::testing::AssertionFailure()
                 << where << " differs by " << (actual - expected).abs().max().item<double>();
        }
        box_of(covered.at(piece.name), piece).fill_(true);
      }
    }
  }
  for (const auto& [name, mask] : covered) {
    if (!mask.all().item<bool>()) {
      return ::testing::AssertionFailure() << "no rank holds all of " << name;
    }
  }
  return ::testing::AssertionSuccess();
}

bool close(double actual, double expected) {
  return std::abs(actual - expected) <= 1e-5 + 1.3e-6 * std::abs(expected);
}

struct SplitCase {
  int tp;
  bool sequence_parallel;
  std::string reduction;
};

TEST(TensorParallelGpt, ShardsAreTheWholeModelsSlicesAndGiveItsLossGradientsAndAccuracy) {
  const BuildContext context = language_context(kVocab, kLength);
  const Batch train = train_batch();
  for (const SplitCase& split :
       {SplitCase{2, false, "mean"}, SplitCase{2, true, "mean"}, SplitCase{4, false, "mean"},
        SplitCase{4, true, "mean"}, SplitCase{2, true, "sum"}, SplitCase{4, false, "sum"}}) {
    const std::string options =
        kSmall + "loss_reduction = \"" + split.reduction +
        "\"\nsequence_parallel = " + (split.sequence_parallel ? "true" : "false") + "\n";
    const std::string what = "tp " + std::to_string(split.tp) +
                             (split.sequence_parallel ? " with" : " without") +
                             " sequence parallelism, loss " + split.reduction;
    auto whole_model = build_gpt(options, context);
    const Batch eval = eval_batch(*whole_model);
    const Outcome whole = run(*whole_model, train, eval);
    ASSERT_GT(whole.eval.at("accuracy").item<double>(), 1.0) << "the eval batch must score";

    const auto ranks = on_tp_ranks<Outcome>(split.tp, context, [&](const BuildContext& rank) {
      return run(*build_gpt(options, rank), train, eval);
    });
    EXPECT_TRUE(pieces_match(ranks, whole_values(whole, &Held::initial), &Held::initial, true))
        << what << ": initial values";
    EXPECT_TRUE(pieces_match(ranks, whole_values(whole, &Held::gradient), &Held::gradient, false))
        << what << ": gradients";
    for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
      EXPECT_TRUE(close(ranks[rank].loss, whole.loss))
          << what << ": rank " << rank << "'s loss " << ranks[rank].loss << ", whole "
          << whole.loss;
      EXPECT_TRUE(close(ranks[rank].eval.at("accuracy").item<double>(),
                        whole.eval.at("accuracy").item<double>()))
          << what << ": rank " << rank << "'s accuracy sum "
          << ranks[rank].eval.at("accuracy").item<double>() << ", whole "
          << whole.eval.at("accuracy").item<double>();
      EXPECT_DOUBLE_EQ(ranks[rank].flops * split.tp, whole.flops) << what;
    }
  }
}

// The whole model's weights are its parameters' own streams' draws (GPT-2's N(0, 0.02), the
// residual projections' N(0, 0.02 / sqrt(2 n_layers))): what pins the fused q/k/v weight's rows
// to q, k and v in that order, whose boxes the split builds are checked against.
TEST(TensorParallelGpt, TheWholeModelsWeightsAreTheirStreamsDraws) {
  auto model = build_gpt(kSmall, language_context(kVocab, kLength));
  const ParameterInit init(kSeed);
  const double residual_std = 0.02 / std::sqrt(2.0 * 2);
  std::map<std::string, double> drawn = {{"embed.token.weight", 0.02},
                                         {"embed.position.weight", 0.02}};
  for (const std::string layer : {"layer0", "layer1"}) {
    drawn[layer + ".qkv.weight"] = 0.02;
    drawn[layer + ".attention_out.weight"] = residual_std;
    drawn[layer + ".mlp_in.weight"] = 0.02;
    drawn[layer + ".mlp_out.weight"] = residual_std;
  }
  const auto parameters = model->module().named_parameters();
  for (const auto& [name, std] : drawn) {
    const at::Tensor& held = parameters[name];
    at::Tensor expected = at::empty(held.sizes());
    init.normal(expected, name, 0.0, std);
    EXPECT_TRUE(at::equal(held, expected)) << name;
  }
}

TEST(TensorParallelGpt, SequenceParallelIsANoOpWithoutTp) {
  const BuildContext context = language_context(kVocab, kLength);
  auto plain = build_gpt(kSmall, context);
  auto with_option = build_gpt(kSmall + "sequence_parallel = true\n", context);
  const Batch eval = eval_batch(*plain);
  const Outcome a = run(*plain, train_batch(), eval);
  const Outcome b = run(*with_option, train_batch(), eval);
  EXPECT_EQ(a.loss, b.loss);
  for (const auto& [name, held] : a.parameters) {
    EXPECT_TRUE(at::equal(held.gradient, b.parameters.at(name).gradient)) << name;
    EXPECT_EQ(held.layout.size(), 1u) << name << " is held whole";
  }
}

// Two stages of a split model on every tp rank, (embed, layer0) and (layer1, head), the second
// holding its own copy of the tied weight: run one after the other they give the whole model's
// loss and gradients, the copy holding this rank's vocabulary rows of the whole model's weight.
TEST(TensorParallelGpt, StagesOfASplitModelContinueEachOther) {
  const BuildContext context = language_context(kVocab, kLength);
  const Batch train = train_batch();
  for (const bool sequence_parallel : {false, true}) {
    const std::string options =
        kSmall + "sequence_parallel = " + (sequence_parallel ? "true" : "false") + "\n";
    auto whole_model = build_gpt(options, context);
    const Outcome whole = run(*whole_model, train, eval_batch(*whole_model));

    struct Stages {
      Outcome held;       // both stages' parameters, the tied copy's gradient added to the tie's
      Outcome tied_copy;  // the head's copy alone: its initial values
      double loss = 0;
    };
    const auto ranks = on_tp_ranks<Stages>(2, context, [&](const BuildContext& rank) {
      BuildContext first_context = rank, second_context = rank;
      first_context.blocks = BlockRange{0, 2};
      second_context.blocks = BlockRange{2, -1};
      auto first = build_gpt(options, first_context);
      auto second = build_gpt(options, second_context);
      Stages out;
      record_parameters(*first, out.held);
      Outcome second_held;
      record_parameters(*second, second_held);
      Activations x(first->input(train));
      for (const auto& block : first->blocks()) x = block.forward(x);
      for (const auto& block : second->blocks()) x = block.forward(x);
      const at::Tensor loss = second->loss(x.hidden(), train);
      loss.backward();
      out.loss = loss.item<double>();
      record_gradients(*first, out.held);
      record_gradients(*second, second_held);
      Held copy = second_held.parameters.at("head_token_weight");
      second_held.parameters.erase("head_token_weight");
      out.tied_copy.parameters["head_token_weight"] = copy;
      Held& tie = out.held.parameters.at("embed.token.weight");
      EXPECT_EQ(copy.layout.size(), 1u);
      EXPECT_EQ(copy.layout[0].placement.offsets, tie.layout[0].placement.offsets);
      // The whole model's gradient for the tied weight is the embedding's part plus the head's.
      tie.gradient = tie.gradient + copy.gradient;
      out.held.parameters.merge(second_held.parameters);
      return out;
    });
    std::vector<Outcome> held, copies;
    for (const Stages& stages : ranks) {
      EXPECT_TRUE(close(stages.loss, whole.loss)) << stages.loss << " against " << whole.loss;
      held.push_back(stages.held);
      copies.push_back(stages.tied_copy);
    }
    const TensorMap initial = whole_values(whole, &Held::initial);
    EXPECT_TRUE(pieces_match(held, initial, &Held::initial, true));
    EXPECT_TRUE(pieces_match(held, whole_values(whole, &Held::gradient), &Held::gradient, false))
        << (sequence_parallel ? "with" : "without") << " sequence parallelism";
    const TensorMap tied_initial = {{"embed.token.weight", initial.at("embed.token.weight")}};
    EXPECT_TRUE(pieces_match(copies, tied_initial, &Held::initial, true));
  }
}

// Each rank's Error from building at tp `tp` (and, when `length` is set, running a forward on
// sequences of that length); empty when nothing failed.
std::vector<std::string> split_errors(int tp, const std::string& options, std::int64_t vocab,
                                      std::int64_t seq_len, std::optional<std::int64_t> length) {
  return on_tp_ranks<std::string>(tp, language_context(vocab, seq_len),
                                  [&](const BuildContext& rank) -> std::string {
                                    try {
                                      auto model = build_gpt(options, rank);
                                      if (length) {
                                        Batch batch;
                                        batch.size = 1;
                                        batch.tensors["input"] = at::zeros({1, *length}, at::kLong);
                                        run_blocks(*model, model->blocks(), batch);
                                      }
                                    } catch (const Error& error) {
                                      return error.what();
                                    }
                                    return {};
                                  });
}

void expect_one_line_error(const std::vector<std::string>& errors,
                           const std::vector<std::string>& mentions) {
  for (std::size_t rank = 0; rank < errors.size(); ++rank) {
    const std::string& error = errors[rank];
    EXPECT_FALSE(error.empty()) << "rank " << rank << " built a model that cannot split";
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
    for (const auto& mention : mentions) {
      EXPECT_NE(error.find(mention), std::string::npos) << "'" << mention << "' not in: " << error;
    }
  }
}

TEST(TensorParallelGpt, SizesThatDoNotSplitAreOneLineErrors) {
  expect_one_line_error(split_errors(4, "n_heads = 6\nd_model = 48\n", kVocab, kLength, {}),
                        {"n_heads", "(6)", "tp (4)"});
  expect_one_line_error(split_errors(4, kSmall, 50, kLength, {}), {"vocabulary (50", "tp (4)"});
  expect_one_line_error(split_errors(4, kSmall + "sequence_parallel = true\n", kVocab, 6, {}),
                        {"sequence_parallel", "seq_len (6)", "tp (4)"});
  expect_one_line_error(split_errors(4, kSmall + "sequence_parallel = true\n", kVocab, kLength, 6),
                        {"sequence_parallel", "6 tokens", "tp (4)"});
  // Without sequence parallelism the sequence is not split: any length will do.
  for (const auto& error : split_errors(4, kSmall, kVocab, 6, 6)) EXPECT_EQ(error, "");
}

}  // namespace
}  // namespace trainyard::testing
