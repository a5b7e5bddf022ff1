"""PyTorch's own DistributedDataParallel (Python, gloo) on the cnn recipe's model, for
tools/bench/ddp_bench.sh to compare with trainyard's ddp strategy. Run under torchrun.

Each rank trains on its own 64-sample Fashion-MNIST batches with AdamW, one intra-op thread;
rank 0 prints "python_ddp_step_ms <median ms per step>" over timed windows after a warm-up."""

import gzip
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

BATCH = 64


def load_batches(rank, count):
    with gzip.open("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8)
    start = rank * BATCH * count
    x = (torch.from_numpy(images[start:start + BATCH * count].copy()).float() / 255.0 - 0.2860) / 0.3530
    y = torch.from_numpy(labels[start:start + BATCH * count].astype(np.int64))
    return [(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]) for i in range(count)]


def median_step_ms(step, steps, warmup):
    """Runs `warmup` steps, then `steps` steps in windows that start together on every rank;
    the median over the windows of the milliseconds per step."""
    for i in range(warmup):
        step(i)
    windows = []
    window = max(10, steps // 10)
    done = 0
    while done < steps:
        dist.barrier()
        start = time.perf_counter()
        for i in range(window):
            step(done + i)
        windows.append(1000.0 * (time.perf_counter() - start) / window)
        done += window
    return statistics.median(windows)


def time_training(model, steps, warmup):
    """Trains `model` with AdamW on this rank's Fashion-MNIST batches: median_step_ms."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    batches = load_batches(dist.get_rank(), 32)

    def step(i):
        x, y = batches[i % len(batches)]
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()

    return median_step_ms(step, steps, warmup)


def cnn():
    # plugins/models/cnn with channels [32, 64], hidden 128, batch_norm.
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    step_ms = time_training(DistributedDataParallel(cnn()), steps, warmup=20)
    if rank == 0:
        print(f"python_ddp_step_ms {step_ms:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
