#!/usr/bin/env python3
"""Fashion-MNIST as image files, for the image datasets' recipes, tests and benchmarks (tools/setup
runs this with the venv's Python, which has Pillow):

    make_image_data.py [--out DIR] [--source DIR]

DIR (default data/ in the repository, which git ignores) receives

  fashion-mnist-png/{train,test}/<class>/<index>.png
        every image as an 8-bit grayscale PNG in torchvision's ImageFolder layout; the class
        folders are named "<label>-<name>" so that sorting them by name gives the labels
  fashion-mnist-tar/{train-000000..train-000005,test-000000..test-000001}.tar
        the same PNGs as WebDataset shards of 10,000 (train) and 5,000 (test) samples: members
        "<split>-<index>.png" and "<split>-<index>.cls" (the label as decimal text), in order
  fashion-mnist-jpeg224/train/<class>/<index>.jpg
        a throughput fixture: the first 2,000 training images at 224x224 (bicubic), tinted per
        class into RGB, as baseline JPEGs of quality 90 with 4:2:0 chroma (as photos are stored)

SOURCE (default /usr/share/datasets/fashion-mnist, Debian's dataset-fashion-mnist) holds the idx
files. Each folder is made in a temporary folder beside it and renamed into place, so an
interrupted run never leaves half of one; a folder that exists with its marker file is current
and left as it is. The same source gives the same bytes.
"""
import argparse
import gzip
import io
import shutil
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker",
           "bag", "ankle-boot"]
MARKER = ".complete-v1"
TRAIN_SHARD = 10_000
TEST_SHARD = 5_000
FIXTURE_IMAGES = 2_000
FIXTURE_SIZE = 224


def read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(source: Path):
    splits = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(source / f"{prefix}-images-idx3-ubyte.gz")
        labels = read_idx(source / f"{prefix}-labels-idx1-ubyte.gz")
        splits[split] = (images, labels)
    return splits


def class_folder(label: int) -> str:
    return f"{label}-{CLASSES[label]}"


def png_bytes(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels, "L").save(out, format="PNG")
    return out.getvalue()


def build(final: Path, make) -> None:
    """Runs make(tmp) and renames tmp to `final`, unless `final` is already complete."""
    if (final / MARKER).exists():
        return
    tmp = final.with_name(final.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    make(tmp)
    (tmp / MARKER).write_text("complete\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    print(f"make_image_data: wrote {final}")


def make_png_folder(splits, out: Path) -> None:
    for split, (images, labels) in splits.items():
        for label in range(len(CLASSES)):
            (out / split / class_folder(label)).mkdir(parents=True)
        for index, (pixels, label) in enumerate(zip(images, labels)):
            path = out / split / class_folder(int(label)) / f"{index:05d}.png"
            path.write_bytes(png_bytes(pixels))


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def make_tar_shards(splits, out: Path) -> None:
    for split, (images, labels) in splits.items():
        per_shard = TRAIN_SHARD if split == "train" else TEST_SHARD
        for shard, start in enumerate(range(0, len(images), per_shard)):
            with tarfile.open(out / f"{split}-{shard:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
                for index in range(start, min(start + per_shard, len(images))):
                    key = f"{split}-{index:05d}"
                    add_member(tar, key + ".png", png_bytes(images[index]))
                    add_member(tar, key + ".cls", str(int(labels[index])).encode())


def make_jpeg_fixture(splits, out: Path) -> None:
    images, labels = splits["train"]
    rng = np.random.default_rng(0)
    tints = rng.uniform(0.4, 1.0, (len(CLASSES), 3))
    for label in range(len(CLASSES)):
        (out / "train" / class_folder(label)).mkdir(parents=True)
    for index in range(FIXTURE_IMAGES):
        label = int(labels[index])
        gray = Image.fromarray(images[index], "L").resize((FIXTURE_SIZE, FIXTURE_SIZE),
                                                          Image.BICUBIC)
        rgb = (np.asarray(gray, dtype=np.float32)[..., None] * tints[label]).astype(np.uint8)
        path = out / "train" / class_folder(label) / f"{index:05d}.jpg"
        Image.fromarray(rgb, "RGB").save(path, format="JPEG", quality=90, subsampling="4:2:0")


def main() -> None:
    here = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=here / "data")
    parser.add_argument("--source", type=Path, default=Path("/usr/share/datasets/fashion-mnist"))
    args = parser.parse_args()
    targets = {"fashion-mnist-png": make_png_folder, "fashion-mnist-tar": make_tar_shards,
               "fashion-mnist-jpeg224": make_jpeg_fixture}
    if all((args.out / name / MARKER).exists() for name in targets):
        return
    splits = load(args.source)
    for name, make in targets.items():
        build(args.out / name, lambda tmp, make=make: make(splits, tmp))


if __name__ == "__main__":
    main()
