"""Step time of the cnn and mlp recipes' models in Python PyTorch (the same LibTorch underneath),
over real Fashion-MNIST batches, for tools/bench/run to compare with trainyard.

Prints one line per model: "<model> <milliseconds per step>" (median of repetitions)."""

import gzip
import statistics
import sys
import time

import numpy as np
import torch
from torch import nn

BATCH = 64
BATCHES = 16


def load_batches():
    with gzip.open("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8)
    x = (torch.from_numpy(images[: BATCH * BATCHES].copy()).float() / 255.0 - 0.2860) / 0.3530
    y = torch.from_numpy(labels[: BATCH * BATCHES].astype(np.int64))
    return [(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]) for i in range(BATCHES)]


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def time_model(model, batches, min_seconds, repetitions):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    model.train()

    def step(i):
        x, y = batches[i % BATCHES]
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()

    for i in range(10):
        step(i)
    results = []
    for _ in range(repetitions):
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < min_seconds:
            step(steps)
            steps += 1
        results.append(1000.0 * (time.perf_counter() - start) / steps)
    return statistics.median(results)


def main():
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else torch.get_num_threads()
    repetitions = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    batches = load_batches()
    print("cnn", time_model(cnn(), batches, 3.0, repetitions))
    print("mlp", time_model(mlp(), batches, 2.0, repetitions))


if __name__ == "__main__":
    main()
