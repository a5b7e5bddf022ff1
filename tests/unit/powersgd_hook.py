"""PyTorch's own powerSGD_hook registered on Python DDP, on gloo ranks over loopback, fed the
gradients trainyard's PowerSGD test feeds its ranks: at each step, parameter i's gradient on
rank r is torch.randn(shape_i) drawn from a generator seeded with gradient_seed(step, r, i) (the
gradient of sum_i <p_i, g_i>). DDP buckets the parameters with find_unused_parameters (its
buckets then stay as built) and bucket_cap_mb; the script first checks that those buckets are
trainyard's, then trains STEPS steps with one PowerSGDState per rank and rank 0 writes every
step's averaged gradients, bucket by bucket, as raw float32.

Usage: python powersgd_hook.py SPEC RANKS STEPS RANK START_ITER BUCKET_CAP_MB OUT
SPEC holds the parameters' shapes on its first line ("24x16 16 ..."), then one line per bucket
of trainyard's with the indices of its parameters in bucket order.
"""
import socket
import sys

import numpy
import torch
import torch.distributed as dist
import torch.multiprocessing as multiprocessing
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel


def gradient_seed(step, rank, parameter):
    return (step * 16 + rank) * 64 + parameter


def read_spec(path):
    with open(path) as spec:
        lines = [line.split() for line in spec.read().splitlines() if line.strip()]
    shapes = [[int(size) for size in item.split("x")] for item in lines[0]]
    buckets = [[int(index) for index in line] for line in lines[1:]]
    return shapes, buckets


class Inner(nn.Module):
    """Parameters of the given shapes; forward(gradients) = sum_i <p_i, g_i>."""

    def __init__(self, shapes):
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.zeros(shape)) for shape in shapes)

    def forward(self, gradients):
        return sum((weight * gradient).sum() for weight, gradient in zip(self.weights, gradients))


def waiting_powersgd_hook(state, bucket):
    """PyTorch's powerSGD_hook, its chain of collectives finished before the hook returns:
    the chain's later all-reduces then cannot interleave differently on different ranks with the
    ones DDP issues itself (find_unused_parameters' usage map)."""
    averaged = powersgd.powerSGD_hook(state, bucket).wait()
    done = torch.futures.Future()
    done.set_result(averaged)
    return done


def ddp_buckets(parameters, cap_mb):
    """The buckets DDP builds for `parameters` with find_unused_parameters and bucket_cap_mb
    (its own assignment, reversed as DDP.__init__ hands it to the Reducer)."""
    indices, _ = dist._compute_bucket_assignment_by_size(
        parameters, [int(cap_mb * 1024 * 1024)], [False] * len(parameters))
    return [list(bucket) for bucket in reversed(indices)]


def rank_main(rank, world_size, port, spec, steps, matrix_rank, start_iter, cap_mb, output):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    shapes, buckets = read_spec(spec)
    inner = Inner(shapes)
    built = ddp_buckets(list(inner.parameters()), cap_mb)
    if built != buckets:
        sys.exit(f"DDP builds buckets {built}, trainyard {buckets}")
    model = DistributedDataParallel(inner, find_unused_parameters=True, bucket_cap_mb=cap_mb)
    state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=matrix_rank,
                                   start_powerSGD_iter=start_iter, min_compression_rate=2,
                                   use_error_feedback=True, warm_start=True, random_seed=0)
    model.register_comm_hook(state, waiting_powersgd_hook)
    weights = list(inner.weights)
    averaged = []
    for step in range(steps):
        drawn = [torch.randn(shape, generator=torch.Generator().manual_seed(
            gradient_seed(step, rank, index))) for index, shape in enumerate(shapes)]
        for weight in weights:
            weight.grad = None
        model(drawn).backward()
        for bucket in buckets:
            averaged.extend(weights[index].grad.reshape(-1).clone() for index in bucket)
    if rank == 0:
        torch.cat(averaged).numpy().astype(numpy.float32).tofile(output)
    dist.destroy_process_group()


def main():
    if len(sys.argv) != 8:
        sys.exit(__doc__.strip())
    spec, ranks, steps, matrix_rank, start_iter, cap_mb, output = sys.argv[1:]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    multiprocessing.start_processes(
        rank_main, args=(int(ranks), port, spec, int(steps), int(matrix_rank), int(start_iter),
                         float(cap_mb), output),
        nprocs=int(ranks), start_method="fork")


if __name__ == "__main__":
    main()
