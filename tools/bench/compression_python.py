"""PyTorch's own DistributedDataParallel (Python, gloo) on the fashion_mnist_mlp recipe's model,
uncompressed or with PyTorch's powerSGD_hook (rank 4, start_powerSGD_iter START), for
tools/bench/compression_bench.sh to compare with trainyard's ddp and powersgd at loopback speed.
Run under torchrun: python compression_python.py STEPS none|powersgd START.

Each rank trains on its own 64-sample Fashion-MNIST batches with AdamW, one intra-op thread;
rank 0 prints "python_step_ms <median ms per step>" over timed windows after a warm-up."""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from ddp_bench import time_training  # noqa: E402


def mlp():
    # plugins/models/mlp with hidden [256, 128].
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                         nn.ReLU(), nn.Linear(128, 10))


def main():
    steps = int(sys.argv[1])
    compression = sys.argv[2]
    start = int(sys.argv[3])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(mlp())
    if compression == "powersgd":
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=4,
                                       start_powerSGD_iter=max(2, start))
        model.register_comm_hook(state, powersgd.powerSGD_hook)
    step_ms = time_training(model, steps, warmup=25)
    if rank == 0:
        print(f"python_step_ms {step_ms:.3f}", flush=True)
    dist.barrier()
    # Tearing the gloo group down after powerSGD_hook's last futures aborts now and then
    # ("terminate called without an active exception"), failing torchrun after the figure is
    # out: the measured process leaves without the teardown.
    os._exit(0)


if __name__ == "__main__":
    main()
