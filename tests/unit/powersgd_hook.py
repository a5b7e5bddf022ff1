"""PyTorch's own powerSGD_hook on gloo ranks over loopback, fed the gradients trainyard's
PowerSGD test feeds its ranks: for each step and rank, parameter i's gradient is
torch.randn(shape_i) drawn from a generator seeded with gradient_seed(step, rank, i), laid out in
trainyard's buckets. Each bucket reaches the hook as a GradBucket stand-in (buffer, gradients as
views into it, index, is_last), in bucket order, with one PowerSGDState per rank, as DDP would
call it with those buckets. Rank 0 writes every step's averaged buckets, back to back, as raw
float32.

Usage: python powersgd_hook.py SPEC RANKS STEPS RANK START_ITER OUT
SPEC holds the parameters' shapes on its first line ("24x16 16 ..."), then one line per bucket
with the indices of its parameters in bucket order.
"""
import socket
import sys

import numpy
import torch
import torch.distributed as dist
import torch.multiprocessing as multiprocessing
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd


def gradient_seed(step, rank, parameter):
    return (step * 16 + rank) * 64 + parameter


class Bucket:
    def __init__(self, index, last, flat, gradients):
        self._index, self._last, self._flat, self._gradients = index, last, flat, gradients

    def buffer(self):
        return self._flat

    def gradients(self):
        return self._gradients

    def index(self):
        return self._index

    def is_last(self):
        return self._last


def read_spec(path):
    with open(path) as spec:
        lines = [line.split() for line in spec.read().splitlines() if line.strip()]
    shapes = [[int(size) for size in item.split("x")] for item in lines[0]]
    buckets = [[int(index) for index in line] for line in lines[1:]]
    return shapes, buckets


def step_buckets(shapes, buckets, step, rank):
    out = []
    for index, members in enumerate(buckets):
        parts = []
        for parameter in members:
            generator = torch.Generator().manual_seed(gradient_seed(step, rank, parameter))
            parts.append(torch.randn(shapes[parameter], generator=generator).reshape(-1))
        flat = torch.cat(parts)
        views, offset = [], 0
        for parameter in members:
            numel = int(numpy.prod(shapes[parameter]))
            views.append(flat[offset:offset + numel].view(shapes[parameter]))
            offset += numel
        out.append(Bucket(index, index == len(buckets) - 1, flat, views))
    return out


def rank_main(rank, world_size, port, spec, steps, matrix_rank, start_iter, output):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    shapes, buckets = read_spec(spec)
    state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=matrix_rank,
                                   start_powerSGD_iter=start_iter, min_compression_rate=2,
                                   use_error_feedback=True, warm_start=True, random_seed=0)
    averaged = []
    for step in range(steps):
        for bucket in step_buckets(shapes, buckets, step, rank):
            # One bucket at a time: every rank then issues the same collectives in one order.
            averaged.append(powersgd.powerSGD_hook(state, bucket).wait().clone())
    if rank == 0:
        torch.cat(averaged).numpy().astype(numpy.float32).tofile(output)
    dist.destroy_process_group()


def main():
    if len(sys.argv) != 7:
        sys.exit(__doc__.strip())
    spec, ranks, steps, matrix_rank, start_iter, output = sys.argv[1:]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    multiprocessing.start_processes(
        rank_main, args=(int(ranks), port, spec, int(steps), int(matrix_rank), int(start_iter),
                         output),
        nprocs=int(ranks), start_method="fork")


if __name__ == "__main__":
    main()
