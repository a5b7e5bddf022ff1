"""Image loader throughput of PyTorch's DataLoader with torchvision's transforms, for
tools/bench/run to set beside build/bin/image_loader_bench: the same JPEG folder, batch size,
shuffling, drop_last, worker count and prefetch, and the transforms a torchvision user writes:

    ImageFolder(FOLDER, Compose([RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(),
                                 Normalize(ImageNet's mean, std)]))

(Pillow decodes with libjpeg-turbo, as TurboJPEG does for trainyard). Workers are persistent,
the DataLoader's fastest setting, so the comparison favours Python.

  .venv/bin/python tools/bench/image_loader_bench.py FOLDER [workers=1] [batch_size=64] [epochs=3]
prints "dataloader <samples/s>" (the best epoch after a warm-up one)."""

import sys
import time

import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


def main():
    folder = sys.argv[1]
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    batch_size = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    torch.set_num_threads(1)
    transform = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    dataset = datasets.ImageFolder(folder, transform=transform)
    kwargs = dict(batch_size=batch_size, shuffle=True, drop_last=True, num_workers=workers,
                  generator=torch.Generator().manual_seed(0))
    if workers > 0:
        kwargs.update(persistent_workers=True, prefetch_factor=2)
    loader = DataLoader(dataset, **kwargs)
    best = 0.0
    for epoch in range(epochs + 1):
        start = time.perf_counter()
        samples = 0
        for images, labels in loader:
            samples += len(labels)
        seconds = time.perf_counter() - start
        if epoch > 0:
            best = max(best, samples / seconds)
    print(f"dataloader {best:.1f}")


if __name__ == "__main__":
    main()
