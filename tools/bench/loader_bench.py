"""Loader throughput of PyTorch's DataLoader over Fashion-MNIST's training split, for
tools/bench/run to set beside build/bin/loader_bench: the same normalized data, batch size,
shuffling, drop_last, worker count and prefetch, two ways:
  batched     the dataset's __getitems__ returns the whole batch (one index_select);
  per_sample  __getitem__ per sample and the default collate.

  .venv/bin/python tools/bench/loader_bench.py [workers=1] [batch_size=64] [epochs=3]
prints "<way> <samples/s>" per line (the best epoch of each, after a warm-up epoch)."""

import gzip
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

ROOT = "/usr/share/datasets/fashion-mnist"


def load():
    with gzip.open(f"{ROOT}/train-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(f"{ROOT}/train-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8)
    x = (torch.from_numpy(images.copy()).float() / 255.0 - 0.2860) / 0.3530
    return x, torch.from_numpy(labels.astype(np.int64))


class PerSample(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"input": self.x[i], "target": self.y[i]}


class Batched(PerSample):
    def __getitems__(self, indices):
        index = torch.tensor(indices)
        return {"input": self.x.index_select(0, index), "target": self.y.index_select(0, index)}


def best_samples_per_s(dataset, workers, batch_size, epochs, collate_fn=None):
    kwargs = dict(batch_size=batch_size, shuffle=True, drop_last=True, num_workers=workers,
                  generator=torch.Generator().manual_seed(0))
    if collate_fn is not None:
        kwargs["collate_fn"] = collate_fn
    if workers > 0:
        kwargs.update(persistent_workers=True, prefetch_factor=2)
    loader = DataLoader(dataset, **kwargs)
    best = 0.0
    for epoch in range(epochs + 1):
        start = time.perf_counter()
        samples = 0
        for batch in loader:
            samples += len(batch["target"])
        seconds = time.perf_counter() - start
        if epoch > 0:
            best = max(best, samples / seconds)
    return best


def main():
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    batch_size = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    torch.set_num_threads(1)
    x, y = load()
    print(f"batched {best_samples_per_s(Batched(x, y), workers, batch_size, epochs, lambda b: b):.1f}")
    print(f"per_sample {best_samples_per_s(PerSample(x, y), workers, batch_size, epochs):.1f}")


if __name__ == "__main__":
    main()
