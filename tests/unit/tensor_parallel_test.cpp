// Tensor parallelism on ranks as threads over gloo, at tp 2 and tp 4: each region operator
// against its definition, each layer against the whole torch::nn layer built from the same
// whole weights, the vocabulary-parallel loss and argmax against ATen's, and the collectives each
// issues, counted by the mesh's counting backends.
//
// Comparisons are bitwise where a rank moves the same values as the whole layer (a gather, a
// copy, a lookup); they are within fp32 tolerance (rtol 1.3e-6, atol 1e-5) wherever a matrix
// product computes them: where a sum runs over the split dimension partial sums added across
// ranks are added in another order than one product adds them, and even where it does not the
// BLAS picks its kernel and blocking by the product's shape and the CPU, so a slice of the
// product may be summed in another order than the whole.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <string>

#include "step_harness.hpp"
#include "trainyard/parallel/collective_counter.hpp"
#include "trainyard/parallel/tensor_parallel.hpp"
#include "trainyard/runtime/cpu_binding.hpp"

namespace trainyard::testing {
namespace {

constexpr std::int64_t kBatch = 2;
constexpr std::int64_t kSequence = 8;  // divides by tp 2 and 4
constexpr std::int64_t kFloatBytes = 4;

// One rank of a job whose mesh is `request`, connected over gloo on the loopback.
struct Rank {
  Rank(int rank, int world, int port, const MeshRequest& request) {
    BuildContext build;
    communicator =
        bundled_registry().create<Communicator>("gloo", options_section("comm", ""), build);
    Rendezvous meet;
    meet.rank = rank;
    meet.world_size = world;
    meet.local_rank = rank;
    meet.local_world_size = world;
    meet.master_port = port;
    meet.timeout = std::chrono::seconds(120);
    communicator->connect(meet, c10::Device(c10::kCPU));
    mesh = std::make_shared<ProcessMesh>(MeshLayout::resolve(request, world), *communicator);
    group = TensorParallelGroup::of(mesh.get());
  }
  // Rank 0 hosts the store: nobody leaves before everyone is done.
  ~Rank() { communicator->barrier(); }
  Rank(const Rank&) = delete;
  Rank& operator=(const Rank&) = delete;

  CollectiveCounter& collectives() const { return mesh->collectives(); }

  std::shared_ptr<Communicator> communicator;
  std::shared_ptr<ProcessMesh> mesh;
  TensorParallelGroup group;
};

// Runs `body` on `tp` ranks forming one tp group.
void on_tp_ranks(int tp, const std::function<void(Rank&)>& body) {
  at::set_num_threads(1);
  run_threaded_ranks<bool>(tp, [&](int rank, int port) {
    Rank self(rank, tp, port, MeshRequest{.pp = 1, .dp_replicate = 1, .dp_shard = 1, .tp = tp});
    body(self);
    return true;
  });
}

// The same draws on every rank for the same seed.
at::Tensor drawn(std::vector<std::int64_t> shape, std::uint64_t seed, double scale = 1.0) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  return at::randn(shape, generator).mul_(scale);
}

at::Tensor part_of(const at::Tensor& whole, std::int64_t dim, const TensorParallelGroup& group) {
  return group.shard_of(whole, dim);
}

::testing::AssertionResult bitwise(const at::Tensor& actual, const at::Tensor& expected) {
  if (!actual.defined() || !expected.defined()) {
    return ::testing::AssertionFailure() << "undefined tensor";
  }
  if (actual.sizes() != expected.sizes() || actual.scalar_type() != expected.scalar_type()) {
    return ::testing::AssertionFailure()
           << "shape " << actual.sizes() << " " << actual.scalar_type() << ", expected "
           << expected.sizes() << " " << expected.scalar_type();
  }
  if (at::equal(actual, expected)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "differs by " << (actual - expected).abs().max().item<double>();
}

::testing::AssertionResult close_fp32(const at::Tensor& actual, const at::Tensor& expected) {
  if (!actual.defined() || !expected.defined()) {
    return ::testing::AssertionFailure() << "undefined tensor";
  }
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure()
           << "shape " << actual.sizes() << ", expected " << expected.sizes();
  }
  if (at::allclose(actual, expected, 1.3e-6, 1e-5)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "differs by " << (actual - expected).abs().max().item<double>();
}

// PyTorch's bfloat16 tolerance (rtol 1.6e-2, atol 1e-5), the dtypes equal.
::testing::AssertionResult close_bf16(const at::Tensor& actual, const at::Tensor& expected) {
  if (!actual.defined() || !expected.defined()) {
    return ::testing::AssertionFailure() << "undefined tensor";
  }
  if (actual.sizes() != expected.sizes() || actual.scalar_type() != expected.scalar_type()) {
    return ::testing::AssertionFailure()
           << "shape " << actual.sizes() << " " << actual.scalar_type() << ", expected "
           << expected.sizes() << " " << expected.scalar_type();
  }
  const at::Tensor a = actual.to(at::kFloat), e = expected.to(at::kFloat);
  if (at::allclose(a, e, 1.6e-2, 1e-5)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "differs by " << (a - e).abs().max().item<double>();
}

// The collectives as one line: a failure shows every count.
std::string counts_text(const CollectiveCounts& counts) { return trainyard::describe(counts); }

at::Tensor leaf(const at::Tensor& tensor) { return tensor.detach().clone().requires_grad_(true); }

// The sum over the group's ranks of what `of_rank` gives each, added in rank order.
at::Tensor sum_over_ranks(const TensorParallelGroup& group,
                          const std::function<at::Tensor(int)>& of_rank) {
  at::Tensor sum = of_rank(0).clone();
  for (int r = 1; r < group.size; ++r) sum.add_(of_rank(r));
  return sum;
}

// Every rank's tensor concatenated along `dim`.
at::Tensor cat_over_ranks(const TensorParallelGroup& group, std::int64_t dim,
                          const std::function<at::Tensor(int)>& of_rank) {
  std::vector<at::Tensor> parts;
  for (int r = 0; r < group.size; ++r) parts.push_back(of_rank(r));
  return at::cat(parts, dim);
}

// A tensor of the shape of [B, T, H] that differs per rank and per use.
at::Tensor of_rank(int rank, std::uint64_t use, std::vector<std::int64_t> shape) {
  return drawn(std::move(shape), 1000 * use + static_cast<std::uint64_t>(rank));
}

class TensorParallel : public ::testing::TestWithParam<int> {};

TEST_P(TensorParallel, RegionOperatorsMatchTheirDefinitions) {
  on_tp_ranks(GetParam(), [&](Rank& self) {
    const TensorParallelGroup& group = self.group;
    const std::string where = "rank " + std::to_string(group.rank);
    const std::vector<std::int64_t> shape = {kBatch, kSequence, 6};
    const auto mine = [&](std::uint64_t use) { return of_rank(group.rank, use, shape); };

    {  // f: forward identity, backward the sum of the ranks' gradients.
      at::Tensor input = leaf(mine(1));
      at::Tensor output = copy_to_tensor_parallel_region(input, group);
      EXPECT_TRUE(bitwise(output, input.detach())) << where;
      output.backward(mine(2));
      // Sums in the backend's order: within tolerance of the sum in rank order.
      EXPECT_TRUE(close_fp32(input.grad(),
                             sum_over_ranks(group, [&](int r) { return of_rank(r, 2, shape); })))
          << where;
    }
    {  // g: forward the sum, backward identity.
      at::Tensor input = leaf(mine(3));
      at::Tensor output = reduce_from_tensor_parallel_region(input, group);
      EXPECT_TRUE(
          close_fp32(output, sum_over_ranks(group, [&](int r) { return of_rank(r, 3, shape); })))
          << where;
      at::Tensor gradient = drawn(shape, 4);
      output.backward(gradient);
      EXPECT_TRUE(bitwise(input.grad(), gradient)) << where;
    }
    {  // Gather along the last dimension; backward this rank's slice (copies only: bitwise).
      at::Tensor input = leaf(mine(5));
      at::Tensor output = gather_from_tensor_parallel_region(input, group);
      output.mul_(1);  // an output of its own, which may be changed in place
      EXPECT_TRUE(
          bitwise(output, cat_over_ranks(group, -1, [&](int r) { return of_rank(r, 5, shape); })))
          << where;
      at::Tensor gradient = drawn(output.sizes().vec(), 6);
      output.backward(gradient);
      EXPECT_TRUE(bitwise(input.grad(), part_of(gradient, -1, group))) << where;
    }
    for (std::int64_t dim : {0, 1}) {
      const std::string at_dim = where + ", dim " + std::to_string(dim);
      const std::vector<std::int64_t> whole_shape = {kBatch * group.size, kSequence, 6};
      {  // Sequence gather: forward concatenation, backward reduce-scatter of the gradients.
        at::Tensor input = leaf(mine(7));
        at::Tensor output = gather_from_sequence_parallel_region(input, dim, group);
        output.mul_(1);  // an output of its own, which may be changed in place
        EXPECT_TRUE(bitwise(
            output, cat_over_ranks(group, dim, [&](int r) { return of_rank(r, 7, shape); })))
            << at_dim;
        output.backward(of_rank(group.rank, 8, output.sizes().vec()));
        const at::Tensor summed =
            sum_over_ranks(group, [&](int r) { return of_rank(r, 8, output.sizes().vec()); });
        EXPECT_TRUE(close_fp32(input.grad(), part_of(summed, dim, group))) << at_dim;
      }
      {  // Reduce-scatter: forward this rank's slice of the sum, backward the gathered gradient.
        const std::vector<std::int64_t> local = dim == 0 ? whole_shape : shape;
        at::Tensor input = leaf(of_rank(group.rank, 9, local));
        at::Tensor output = reduce_scatter_to_sequence_parallel_region(input, dim, group);
        output.mul_(1);  // an output of its own, which may be changed in place
        const at::Tensor summed =
            sum_over_ranks(group, [&](int r) { return of_rank(r, 9, local); });
        EXPECT_TRUE(close_fp32(output, part_of(summed, dim, group))) << at_dim;
        output.backward(of_rank(group.rank, 10, output.sizes().vec()));
        EXPECT_TRUE(
            bitwise(input.grad(),
                    cat_over_ranks(group, dim,
                                   [&](int r) { return of_rank(r, 10, output.sizes().vec()); })))
            << at_dim;
      }
      {  // Scatter: forward this rank's slice of the replicated input, backward the gather.
        const std::vector<std::int64_t> whole = dim == 0 ? whole_shape : shape;
        at::Tensor input = leaf(drawn(whole, 11));
        at::Tensor output = scatter_to_sequence_parallel_region(input, dim, group);
        EXPECT_TRUE(bitwise(output, part_of(input.detach(), dim, group))) << at_dim;
        output.backward(of_rank(group.rank, 12, output.sizes().vec()));
        EXPECT_TRUE(
            bitwise(input.grad(),
                    cat_over_ranks(group, dim,
                                   [&](int r) { return of_rank(r, 12, output.sizes().vec()); })))
            << at_dim;
      }
    }
  });
}

// The whole torch::nn::Linear with `weight` and `bias`.
torch::nn::Linear whole_linear(const at::Tensor& weight, const at::Tensor& bias) {
  torch::nn::Linear linear(torch::nn::LinearOptions(weight.size(1), weight.size(0)));
  at::NoGradGuard no_grad;
  linear->weight.copy_(weight);
  linear->bias.copy_(bias);
  return linear;
}

struct ColumnCase {
  bool gather_output;
  bool sequence_parallel;
};

// A collective's result is the caller's alone once the operator returns: gloo's worker drops its
// references to a finished collective's tensors a moment after the wait returns, and an operator
// that returned before then would leave its result's memory held after the caller freed it.
// The ranks and their communication threads share one CPU, the tightest a host's cores can be
// shared: the waiting thread, woken, can run before the worker has let go.
TEST_P(TensorParallel, AnOperatorsResultIsHeldByNothingElseOnceItReturns) {
  at::set_num_threads(1);
  run_threaded_ranks<bool>(GetParam(), [&](int rank, int port) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(allowed_cpus().front(), &one);
    EXPECT_EQ(::pthread_setaffinity_np(::pthread_self(), sizeof(one), &one), 0);
    Rank self(rank, GetParam(), port,
              MeshRequest{.pp = 1, .dp_replicate = 1, .dp_shard = 1, .tp = GetParam()});
    const TensorParallelGroup& group = self.group;
    at::NoGradGuard no_grad;
    int held_elsewhere = 0;
    for (std::uint64_t i = 0; i < 200; ++i) {
      const at::Tensor input = drawn({kBatch, kSequence, 64}, i);
      for (const at::Tensor& result :
           {reduce_from_tensor_parallel_region(input, group),
            gather_from_sequence_parallel_region(input, 1, group),
            reduce_scatter_to_sequence_parallel_region(input, 1, group)}) {
        held_elsewhere += result.use_count() > 1 || result.storage().use_count() > 1;
      }
    }
    EXPECT_EQ(held_elsewhere, 0) << "rank " << group.rank;
    return true;
  });
}

TEST_P(TensorParallel, ColumnParallelLinearMatchesTheWholeLayer) {
  constexpr std::int64_t in = 8, out = 12;
  for (const ColumnCase& variant :
       {ColumnCase{false, false}, ColumnCase{true, false}, ColumnCase{false, true}}) {
    on_tp_ranks(GetParam(), [&](Rank& self) {
      const TensorParallelGroup& group = self.group;
      const std::string where = "rank " + std::to_string(group.rank) + ", gather_output " +
                                std::to_string(variant.gather_output) + ", sequence_parallel " +
                                std::to_string(variant.sequence_parallel);
      const at::Tensor weight = drawn({out, in}, 20, 0.3);
      const at::Tensor bias = drawn({out}, 21);
      const at::Tensor x = drawn({kBatch, kSequence, in}, 22);
      const at::Tensor output_grad = drawn({kBatch, kSequence, out}, 23);

      torch::nn::Linear whole = whole_linear(weight, bias);
      at::Tensor whole_input = leaf(x);
      at::Tensor whole_output = whole->forward(whole_input);
      whole_output.backward(output_grad);

      ColumnParallelLinear layer(in, out, true, group, variant.gather_output,
                                 variant.sequence_parallel);
      layer->load_whole(weight, bias);
      EXPECT_EQ(layer->named_parameters().keys(), whole->named_parameters().keys());
      at::Tensor input = leaf(variant.sequence_parallel ? part_of(x, 1, group) : x);
      at::Tensor output = layer->forward(input);
      // This rank's output features are the whole layer's dot products (over `in`), from a
      // narrower product: tolerance.
      EXPECT_TRUE(close_fp32(output, variant.gather_output
                                         ? whole_output.detach()
                                         : part_of(whole_output.detach(), -1, group)))
          << where;
      output.backward(variant.gather_output ? output_grad : part_of(output_grad, -1, group));
      // The input's gradient sums over the output features, which are split: tolerance.
      const at::Tensor input_grad = whole_input.grad();
      EXPECT_TRUE(close_fp32(
          input.grad(), variant.sequence_parallel ? part_of(input_grad, 1, group) : input_grad))
          << where;
      // The weight's gradient sums over the batch and sequence, whole on every rank, in a
      // product of another shape: tolerance.
      EXPECT_TRUE(close_fp32(layer->weight.grad(), part_of(whole->weight.grad(), 0, group)))
          << where;
      // So does the bias's; ATen's column sum takes the columns in vector-width groups whose
      // order depends on the row's width (out / tp here, out there): tolerance.
      EXPECT_TRUE(close_fp32(layer->bias.grad(), part_of(whole->bias.grad(), 0, group))) << where;
    });
  }
}

// Autocast to bf16 on this thread while it lives.
class Bf16Autocast {
 public:
  Bf16Autocast() {
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, true);
  }
  ~Bf16Autocast() {
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
  }
  Bf16Autocast(const Bf16Autocast&) = delete;
  Bf16Autocast& operator=(const Bf16Autocast&) = delete;
};

// The sequence-parallel column layer runs its own products (it gathers its input again in
// backward), where autocast is off: it must compute as autocast computes the whole layer, in
// bf16, with fp32 gradients for the fp32 parameters and input.
TEST_P(TensorParallel, SequenceParallelColumnLinearComputesAsAutocastDoes) {
  constexpr std::int64_t in = 8, out = 12;
  on_tp_ranks(GetParam(), [&](Rank& self) {
    const TensorParallelGroup& group = self.group;
    const std::string where = "rank " + std::to_string(group.rank);
    const at::Tensor weight = drawn({out, in}, 24, 0.3);
    const at::Tensor bias = drawn({out}, 25);
    const at::Tensor x = drawn({kBatch, kSequence, in}, 26);
    const at::Tensor output_grad = drawn({kBatch, kSequence, out}, 27).to(at::kBFloat16);

    torch::nn::Linear whole = whole_linear(weight, bias);
    ColumnParallelLinear layer(in, out, true, group, false, true);
    layer->load_whole(weight, bias);
    at::Tensor whole_input = leaf(x);
    at::Tensor input = leaf(part_of(x, 1, group));
    at::Tensor whole_output, output;
    {
      Bf16Autocast autocast;
      // As torch.nn.Linear computes it: the bias added inside the product (the C++ frontend's
      // Linear adds it to a 3-d input's product afterwards, rounding twice in bf16).
      whole_output = at::linear(whole_input, whole->weight, whole->bias);
      output = layer->forward(input);
    }
    whole_output.backward(output_grad);
    output.backward(part_of(output_grad, -1, group));
    // bf16 products of the same operands as the whole layer's rows, the fp32 bias added into
    // them alike, the weight's gradient one bf16 product cast to fp32; products of another shape
    // (see the top of the file): bf16's tolerance, with the dtypes autocast gives exactly.
    EXPECT_EQ(output.scalar_type(), at::kBFloat16) << where;
    EXPECT_TRUE(close_bf16(output, part_of(whole_output.detach(), -1, group))) << where;
    EXPECT_EQ(layer->weight.grad().scalar_type(), at::kFloat) << where;
    EXPECT_TRUE(close_bf16(layer->weight.grad(), part_of(whole->weight.grad(), 0, group))) << where;
    EXPECT_EQ(layer->bias.grad().scalar_type(), at::kFloat) << where;
    // bf16 partial sums over the split features, added across ranks in bf16: bf16's tolerance.
    EXPECT_EQ(input.grad().scalar_type(), at::kFloat) << where;
    EXPECT_TRUE(at::allclose(input.grad(), part_of(whole_input.grad(), 1, group), 2e-2, 2e-2))
        << where << ": differs by "
        << (input.grad() - part_of(whole_input.grad(), 1, group)).abs().max().item<double>();
  });
}

TEST_P(TensorParallel, RowParallelLinearMatchesTheWholeLayer) {
  constexpr std::int64_t in = 12, out = 8;
  for (bool sequence_parallel : {false, true}) {
    on_tp_ranks(GetParam(), [&](Rank& self) {
      const TensorParallelGroup& group = self.group;
      const std::string where = "rank " + std::to_string(group.rank) + ", sequence_parallel " +
                                std::to_string(sequence_parallel);
      const at::Tensor weight = drawn({out, in}, 30, 0.3);
      const at::Tensor bias = drawn({out}, 31);
      const at::Tensor x = drawn({kBatch, kSequence, in}, 32);
      const at::Tensor output_grad = drawn({kBatch, kSequence, out}, 33);

      torch::nn::Linear whole = whole_linear(weight, bias);
      at::Tensor whole_input = leaf(x);
      at::Tensor whole_output = whole->forward(whole_input);
      whole_output.backward(output_grad);

      RowParallelLinear layer(in, out, true, group, sequence_parallel);
      layer->load_whole(weight, bias);
      EXPECT_EQ(layer->named_parameters().keys(), whole->named_parameters().keys());
      at::Tensor input = leaf(part_of(x, -1, group));
      at::Tensor output = layer->forward(input);
      // Partial products over the split input features, summed across ranks: tolerance.
      EXPECT_TRUE(close_fp32(output, sequence_parallel ? part_of(whole_output.detach(), 1, group)
                                                       : whole_output.detach()))
          << where;
      output.backward(sequence_parallel ? part_of(output_grad, 1, group) : output_grad);
      // Sums over the output features and over the batch and sequence, none split, in products
      // of another shape: tolerance.
      EXPECT_TRUE(close_fp32(input.grad(), part_of(whole_input.grad(), -1, group))) << where;
      EXPECT_TRUE(close_fp32(layer->weight.grad(), part_of(whole->weight.grad(), 1, group)))
          << where;
      if (!sequence_parallel) {
        // The same column sum of the same whole output gradient: bitwise.
        EXPECT_TRUE(bitwise(layer->bias.grad(), whole->bias.grad())) << where;
      } else {
        // Each rank's bias gradient covers its slice of the sequence; summed over the group it
        // is the whole one (partial sums: tolerance).
        EXPECT_FALSE(close_fp32(layer->bias.grad(), whole->bias.grad())) << where;
        auto& counter = self.collectives();
        counter.take();
        all_reduce_sequence_parallel_gradients({layer->bias}, group);
        const CollectiveCounts expected = {{{"tp", "allreduce"}, {1, out * kFloatBytes}}};
        EXPECT_EQ(counts_text(counter.take()), counts_text(expected)) << where;
        EXPECT_TRUE(close_fp32(layer->bias.grad(), whole->bias.grad())) << where;
      }
    });
  }
}

TEST_P(TensorParallel, VocabParallelEmbeddingMatchesTheWholeEmbedding) {
  constexpr std::int64_t vocab = 16, dim = 6;
  on_tp_ranks(GetParam(), [&](Rank& self) {
    const TensorParallelGroup& group = self.group;
    const std::string where = "rank " + std::to_string(group.rank);
    const at::Tensor weight = drawn({vocab, dim}, 40);
    at::Generator generator = at::detail::createCPUGenerator(41);
    // Every id at least once, some several times.
    const at::Tensor ids = at::cat({at::arange(vocab, at::kLong),
                                    at::randint(vocab, {kBatch * kSequence}, generator, at::kLong)})
                               .view({-1, kSequence});
    const at::Tensor output_grad = drawn({ids.size(0), kSequence, dim}, 42);

    torch::nn::Embedding whole(torch::nn::EmbeddingOptions(vocab, dim));
    {
      at::NoGradGuard no_grad;
      whole->weight.copy_(weight);
    }
    at::Tensor whole_output = whole->forward(ids);
    whole_output.backward(output_grad);

    VocabParallelEmbedding layer(vocab, dim, group);
    layer->load_whole(weight);
    EXPECT_EQ(layer->named_parameters().keys(), whole->named_parameters().keys());
    EXPECT_EQ(layer->vocab_begin(), group.rank * vocab / group.size);
    at::Tensor output = layer->forward(ids);
    // One rank looks each row up, the others add zeros to it: bitwise.
    EXPECT_TRUE(bitwise(output, whole_output.detach())) << where;
    output.backward(output_grad);
    // Each row's gradient sums the same tokens' gradients in the same order: bitwise.
    EXPECT_TRUE(bitwise(layer->weight.grad(), part_of(whole->weight.grad(), 0, group))) << where;
  });
}

// Column then row with GELU between, against the whole layers: outputs, gradients and the
// collectives of one forward and one backward.
TEST_P(TensorParallel, MlpBlockMatchesTheWholeBlockWithExactCollectiveCounts) {
  constexpr std::int64_t d = 8, hidden = 16;
  for (bool sequence_parallel : {false, true}) {
    on_tp_ranks(GetParam(), [&](Rank& self) {
      const TensorParallelGroup& group = self.group;
      const std::string where = "rank " + std::to_string(group.rank) + ", sequence_parallel " +
                                std::to_string(sequence_parallel);
      const at::Tensor w1 = drawn({hidden, d}, 50, 0.3);
      const at::Tensor b1 = drawn({hidden}, 51);
      const at::Tensor w2 = drawn({d, hidden}, 52, 0.3);
      const at::Tensor b2 = drawn({d}, 53);
      const at::Tensor x = drawn({kBatch, kSequence, d}, 54);
      const at::Tensor output_grad = drawn({kBatch, kSequence, d}, 55);

      torch::nn::Linear whole1 = whole_linear(w1, b1);
      torch::nn::Linear whole2 = whole_linear(w2, b2);
      torch::nn::GELU gelu;
      at::Tensor whole_input = leaf(x);
      at::Tensor whole_output = whole2->forward(gelu->forward(whole1->forward(whole_input)));
      whole_output.backward(output_grad);

      ColumnParallelLinear column(d, hidden, true, group, false, sequence_parallel);
      RowParallelLinear row(hidden, d, true, group, sequence_parallel);
      column->load_whole(w1, b1);
      row->load_whole(w2, b2);
      at::Tensor input = leaf(sequence_parallel ? part_of(x, 1, group) : x);

      CollectiveCounter& counter = self.collectives();
      counter.take();
      at::Tensor output = row->forward(gelu->forward(column->forward(input)));
      const CollectiveCounts forward = counter.take();
      output.backward(sequence_parallel ? part_of(output_grad, 1, group) : output_grad);
      const CollectiveCounts backward = counter.take();

      // The activation [B, T, d] in fp32, and this rank's slice of its sequence.
      const std::int64_t whole_bytes = kBatch * kSequence * d * kFloatBytes;
      const std::int64_t slice_bytes = whole_bytes / group.size;
      if (!sequence_parallel) {
        // One all-reduce forward (g after the row layer) and one backward (f before the column
        // layer, of the input's gradient), each of the whole activation.
        EXPECT_EQ(counts_text(forward), counts_text({{{"tp", "allreduce"}, {1, whole_bytes}}}))
            << where;
        EXPECT_EQ(counts_text(backward), counts_text({{{"tp", "allreduce"}, {1, whole_bytes}}}))
            << where;
      } else {
        // Forward: the column layer gathers the sequence (its slice in), the row layer
        // reduce-scatters its partial output (the whole activation in). Backward: two
        // all-gathers and one reduce-scatter: the row layer's reduce-scatter turns into a
        // gather of the output's gradient, the column layer gathers its input again for the
        // weight's gradient (only its slice was kept, as Megatron-LM) and reduce-scatters the
        // input's gradient.
        EXPECT_EQ(counts_text(forward),
                  counts_text({{{"tp", "_allgather_base"}, {1, slice_bytes}},
                               {{"tp", "_reduce_scatter_base"}, {1, whole_bytes}}}))
            << where;
        EXPECT_EQ(counts_text(backward),
                  counts_text({{{"tp", "_allgather_base"}, {2, 2 * slice_bytes}},
                               {{"tp", "_reduce_scatter_base"}, {1, whole_bytes}}}))
            << where;
      }

      EXPECT_TRUE(close_fp32(output, sequence_parallel ? part_of(whole_output.detach(), 1, group)
                                                       : whole_output.detach()))
          << where;
      EXPECT_TRUE(close_fp32(input.grad(), sequence_parallel ? part_of(whole_input.grad(), 1, group)
                                                             : whole_input.grad()))
          << where;
      // Weight gradients are products of another shape, the column bias gradient a column sum
      // over narrower rows (see ColumnParallelLinearMatchesTheWholeLayer): tolerance.
      EXPECT_TRUE(close_fp32(column->weight.grad(), part_of(whole1->weight.grad(), 0, group)))
          << where;
      EXPECT_TRUE(close_fp32(column->bias.grad(), part_of(whole1->bias.grad(), 0, group))) << where;
      EXPECT_TRUE(close_fp32(row->weight.grad(), part_of(whole2->weight.grad(), 1, group)))
          << where;
      if (sequence_parallel) all_reduce_sequence_parallel_gradients({row->bias}, group);
      EXPECT_TRUE(close_fp32(row->bias.grad(), whole2->bias.grad())) << where;
    });
  }
}

TEST_P(TensorParallel, VocabParallelCrossEntropyMatchesCrossEntropyOnTheWholeLogits) {
  constexpr std::int64_t rows = 12, vocab = 16;
  on_tp_ranks(GetParam(), [&](Rank& self) {
    const TensorParallelGroup& group = self.group;
    const std::string where = "rank " + std::to_string(group.rank);
    const at::Tensor logits = drawn({rows, vocab}, 60, 3.0);
    at::Generator generator = at::detail::createCPUGenerator(61);
    at::Tensor target = at::randint(vocab, {rows}, generator, at::kLong);
    target.index_put_({at::tensor({1, 4, 9}, at::kLong)}, -100);
    const at::Tensor loss_grad = drawn({rows}, 62).abs_();

    at::Tensor whole_logits = leaf(logits);
    at::Tensor whole_loss =
        at::cross_entropy_loss(whole_logits, target, {}, at::Reduction::None, -100);
    whole_loss.backward(loss_grad);

    at::Tensor local = leaf(part_of(logits, -1, group));
    self.collectives().take();
    at::Tensor loss = vocab_parallel_cross_entropy(local, target, group);
    // The row maximum, then the target's logit and the sum of exponentials together.
    EXPECT_EQ(
        counts_text(self.collectives().take()),
        counts_text({{{"tp", "allreduce"}, {2, rows * kFloatBytes + 2 * rows * kFloatBytes}}}))
        << where;
    EXPECT_EQ(loss.scalar_type(), at::kFloat);
    EXPECT_TRUE(close_fp32(loss, whole_loss.detach())) << where;
    loss.backward(loss_grad);
    // No communication backward: softmax minus one-hot is local.
    EXPECT_TRUE(self.collectives().snapshot().empty()) << where;
    EXPECT_TRUE(close_fp32(local.grad(), part_of(whole_logits.grad(), -1, group))) << where;
    // Ignored rows: no loss and no gradient, exactly.
    const at::Tensor ignored = target == -100;
    EXPECT_TRUE(bitwise(loss.detach().masked_select(ignored), at::zeros({3}))) << where;
    EXPECT_TRUE(bitwise(local.grad().index_select(0, at::tensor({1, 4, 9}, at::kLong)),
                        at::zeros({3, vocab / group.size})))
        << where;

    // bf16 logits: the loss in float32 from the upcast logits, the gradient in bf16.
    at::Tensor half = leaf(part_of(logits, -1, group).to(at::kBFloat16));
    at::Tensor half_loss = vocab_parallel_cross_entropy(half, target, group);
    const at::Tensor upcast = logits.to(at::kBFloat16).to(at::kFloat);
    EXPECT_EQ(half_loss.scalar_type(), at::kFloat);
    EXPECT_TRUE(close_fp32(half_loss,
                           at::cross_entropy_loss(upcast, target, {}, at::Reduction::None, -100)))
        << where;
    half_loss.backward(loss_grad);
    EXPECT_EQ(half.grad().scalar_type(), at::kBFloat16);
  });
}

TEST_P(TensorParallel, VocabParallelArgmaxMatchesArgmaxWithTies) {
  constexpr std::int64_t rows = 10, vocab = 16;
  on_tp_ranks(GetParam(), [&](Rank& self) {
    const TensorParallelGroup& group = self.group;
    at::Generator generator = at::detail::createCPUGenerator(70);
    // Few distinct values: most rows have their maximum several times, on several ranks.
    at::Tensor logits = at::randint(3, {rows, vocab}, generator, at::kLong).to(at::kFloat);
    logits[0].fill_(1);  // a tie across the whole vocabulary
    logits[1].fill_(0);  // the maximum only in the last rank's slice, twice
    logits[1][vocab - 1] = 2;
    logits[1][vocab - 2] = 2;
    logits[2].fill_(-1);  // the same maximum at the start of every rank's slice
    for (int r = 0; r < group.size; ++r) logits[2][r * (vocab / group.size)] = 5;
    const at::Tensor local = part_of(logits, -1, group);
    EXPECT_TRUE(bitwise(vocab_parallel_argmax(local, group), at::argmax(logits, -1)))
        << "rank " << group.rank;
    const at::Tensor bf16 = local.to(at::kBFloat16);
    EXPECT_TRUE(bitwise(vocab_parallel_argmax(bf16, group), at::argmax(logits, -1)))
        << "rank " << group.rank;
  });
}

INSTANTIATE_TEST_SUITE_P(Tp, TensorParallel, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "tp" + std::to_string(info.param);
                         });

// A group of four ranks that needs none of them: the constructors and the operators check sizes
// before they communicate.
TensorParallelGroup unconnected_group_of_four() {
  TensorParallelGroup group;
  group.size = 4;
  group.rank = 1;
  return group;
}

::testing::AssertionResult one_line_naming(const std::string& message, const std::string& part) {
  if (message.find('\n') != std::string::npos) {
    return ::testing::AssertionFailure() << "more than one line: " << message;
  }
  return contains(message, part);
}

TEST(TensorParallelSizes, ASizeThatDoesNotDivideByTpIsAOneLineErrorNamingIt) {
  const TensorParallelGroup group = unconnected_group_of_four();
  EXPECT_TRUE(
      one_line_naming(error_of([&] { ColumnParallelLinear(8, 10, true, group); }),
                      "ColumnParallelLinear's out_features (10) does not divide by tp (4)"));
  EXPECT_TRUE(one_line_naming(error_of([&] { RowParallelLinear(6, 8, true, group); }),
                              "RowParallelLinear's in_features (6) does not divide by tp (4)"));
  EXPECT_TRUE(
      one_line_naming(error_of([&] { VocabParallelEmbedding(50257, 8, group); }),
                      "VocabParallelEmbedding's vocabulary (50257) does not divide by tp (4)"));
  EXPECT_TRUE(one_line_naming(error_of([&] { group.split(7, "heads"); }),
                              "heads (7) does not divide by tp (4)"));
  EXPECT_TRUE(
      one_line_naming(error_of([&] {
                        group.shard_of(at::zeros({6, 8}), 0);
                      }),
                      "dimension 0 of the whole tensor [6, 8] (6) does not divide by tp (4)"));
  EXPECT_TRUE(one_line_naming(
      error_of([&] {
        reduce_scatter_to_sequence_parallel_region(at::zeros({2, 6, 8}), 1, group);
      }),
      "reduce_scatter_to_sequence_parallel_region's dimension 1 (6) does not divide by tp (4)"));
  EXPECT_TRUE(one_line_naming(
      error_of([&] {
        scatter_to_sequence_parallel_region(at::zeros({2, 6, 8}), 1, group);
      }),
      "scatter_to_sequence_parallel_region's dimension 1 (6) does not divide by tp (4)"));
  EXPECT_EQ(group.split(12, "anything"), 3);
}

TEST(TensorParallelSizes, LoadWholeRefusesAWholeTensorOfAnotherShape) {
  ColumnParallelLinear layer(8, 12, true, TensorParallelGroup{});
  EXPECT_TRUE(one_line_naming(error_of([&] {
                                layer->load_whole(at::zeros({12, 7}));
                              }),
                              "ColumnParallelLinear's whole weight must have shape [12, 8], got "
                              "[12, 7]"));
}

// Without a mesh (or on a mesh of one rank) every operator is the identity and every layer its
// whole counterpart, bitwise.
TEST(TensorParallelOneRank, OperatorsAreTheIdentityAndLayersTheirWholeCounterparts) {
  const ProcessMesh mesh;
  const TensorParallelGroup group = TensorParallelGroup::of(&mesh);
  EXPECT_EQ(group.size, 1);
  EXPECT_FALSE(group.backend);
  const at::Tensor x = drawn({kBatch, kSequence, 8}, 80);
  EXPECT_TRUE(copy_to_tensor_parallel_region(x, group).is_same(x));
  EXPECT_TRUE(reduce_from_tensor_parallel_region(x, group).is_same(x));
  EXPECT_TRUE(gather_from_tensor_parallel_region(x, group).is_same(x));
  EXPECT_TRUE(gather_from_sequence_parallel_region(x, 1, group).is_same(x));
  EXPECT_TRUE(reduce_scatter_to_sequence_parallel_region(x, 1, group).is_same(x));
  EXPECT_TRUE(scatter_to_sequence_parallel_region(x, 1, group).is_same(x));

  const at::Tensor weight = drawn({12, 8}, 81), bias = drawn({12}, 82);
  torch::nn::Linear whole = whole_linear(weight, bias);
  ColumnParallelLinear column(8, 12, true, group, true, true);
  column->load_whole(weight, bias);
  EXPECT_TRUE(bitwise(column->forward(x), whole->forward(x)));
  RowParallelLinear row(8, 12, true, group, true);
  row->load_whole(weight, bias);
  EXPECT_TRUE(bitwise(row->forward(x), whole->forward(x)));

  const at::Tensor logits = drawn({6, 10}, 83, 3.0);
  const at::Tensor target = at::tensor({0, 9, -100, 3, 3, 5}, at::kLong);
  EXPECT_TRUE(close_fp32(vocab_parallel_cross_entropy(logits, target, group),
                         at::cross_entropy_loss(logits, target, {}, at::Reduction::None, -100)));
  EXPECT_TRUE(bitwise(vocab_parallel_argmax(logits, group), at::argmax(logits, -1)));
  EXPECT_TRUE(mesh.collectives().snapshot().empty());
}

TEST(CollectiveCounter, TakeReturnsTheCountsAndStartsAgain) {
  CollectiveCounter counter;
  EXPECT_EQ(counter.describe(), "no collectives");
  counter.add("tp", "allreduce", 100);
  counter.add("tp", "allreduce", 28);
  counter.add("dp", "_reduce_scatter_base", 4096);
  EXPECT_EQ(counter.describe(), "dp: _reduce_scatter_base 1 (4.0 KiB); tp: allreduce 2 (128 B)");
  const CollectiveCounts taken = counter.take();
  EXPECT_EQ(taken.at({"tp", "allreduce"}).calls, 2);
  EXPECT_EQ(taken.at({"tp", "allreduce"}).bytes, 128);
  EXPECT_EQ(per_group(taken).at("dp").bytes, 4096);
  EXPECT_TRUE(counter.snapshot().empty());
  EXPECT_TRUE(counter.take().empty());
}

// A job of one rank: its mesh has no groups, so nothing is wrapped and nothing counted, whatever
// the layers do.
TEST(CollectiveCounter, AOneRankMeshCountsNothing) {
  BuildContext build;
  auto communicator =
      bundled_registry().create<Communicator>("gloo", options_section("comm", ""), build);
  Rendezvous meet;
  meet.master_port = 0;
  meet.timeout = std::chrono::seconds(60);
  communicator->connect(meet, c10::Device(c10::kCPU));
  ProcessMesh mesh(MeshLayout::resolve(MeshRequest{}, 1), *communicator);
  for (MeshGroup kind : {MeshGroup::kPipeline, MeshGroup::kData, MeshGroup::kDataReplicate,
                         MeshGroup::kDataShard, MeshGroup::kTensor}) {
    EXPECT_FALSE(mesh.group(kind)) << mesh_group_name(kind);
  }
  const TensorParallelGroup group = TensorParallelGroup::of(&mesh);
  ColumnParallelLinear column(8, 12, true, group);
  RowParallelLinear row(12, 8, true, group);
  at::Tensor input = leaf(drawn({kBatch, kSequence, 8}, 90));
  row->forward(column->forward(input)).sum().backward();
  EXPECT_TRUE(mesh.collectives().snapshot().empty());
  EXPECT_EQ(mesh.collectives().describe(), "no collectives");
}

// dp_shard 2 x tp 2: dp and dp_shard are one group (nothing is replicated), counted under both
// names; tp its own. Counting forwards to the communicator's backends.
TEST(CollectiveCounter, MeshGroupsCountUnderTheirNames) {
  at::set_num_threads(1);
  run_threaded_ranks<bool>(4, [](int rank, int port) {
    Rank self(rank, 4, port, MeshRequest{.pp = 1, .dp_replicate = 1, .dp_shard = 2, .tp = 2});
    const std::string where = "rank " + std::to_string(rank);
    EXPECT_EQ(self.mesh->group(MeshGroup::kData).get(),
              self.mesh->group(MeshGroup::kDataShard).get())
        << where;
    const auto tp = self.mesh->group(MeshGroup::kTensor);
    EXPECT_NE(uncounted(tp).get(), tp.get()) << where;
    EXPECT_EQ(uncounted(tp)->getSize(), 2) << where;
    EXPECT_EQ(tp->getRank(), uncounted(tp)->getRank()) << where;
    self.collectives().take();

    std::vector<at::Tensor> value{at::full({3}, static_cast<double>(rank))};
    self.mesh->group(MeshGroup::kData)->allreduce(value)->wait();
    // dp groups are {0, 2} and {1, 3}.
    EXPECT_TRUE(bitwise(value[0], at::full({3}, rank % 2 == 0 ? 2.0 : 4.0))) << where;
    at::Tensor part = at::full({5}, static_cast<double>(rank));
    at::Tensor gathered = at::empty({10});
    tp->_allgather_base(gathered, part)->wait();
    tp->barrier()->wait();
    EXPECT_EQ(self.collectives().describe(),
              "dp/dp_shard: allreduce 1 (12 B); tp: _allgather_base 1 (20 B), barrier 1 (0 B)")
        << where;
    const auto totals = per_group(self.collectives().take());
    EXPECT_EQ(totals.at("tp").calls, 2) << where;
    EXPECT_TRUE(self.collectives().snapshot().empty()) << where;
    return true;
  });
}

}  // namespace
}  // namespace trainyard::testing
