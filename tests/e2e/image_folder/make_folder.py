"""A small image folder for tests/e2e/image_folder_test.cpp: OUT/train and OUT/test, three
classes of 20x24 colour images (PNG and JPEG alternating), each class's pixels around its own
colour so that a model can learn them. Damage, by name (any of them): "truncated" (a JPEG cut in
half in train/b), "crc" (a PNG with one flipped bit in its pixel data in train/a), "empty_file" (a
zero-byte .png in train/c), "empty_class" (a class folder train/d without images). Always: the
same images listed in OUT/train.csv ("path,label" lines) and OUT/test.json ([{"path", "label"}]),
in the order the folder layout gives them (classes by name, files by path)."""

import json
import sys
import zlib
from pathlib import Path

import numpy as np
from PIL import Image


def flip_a_pixel_bit(png: bytes) -> bytes:
    """The PNG with one bit of its first IDAT chunk's data flipped and the CRC left as it was."""
    at = 8
    while at < len(png):
        length = int.from_bytes(png[at:at + 4], "big")
        if png[at + 4:at + 8] == b"IDAT":
            damaged = bytearray(png)
            damaged[at + 8 + length // 2] ^= 0x10
            assert zlib.crc32(bytes(damaged[at + 4:at + 8 + length])) != \
                int.from_bytes(png[at + 8 + length:at + 12 + length], "big")
            return bytes(damaged)
        at += length + 12
    raise ValueError("no IDAT chunk")


def listed(out, split):
    classes = sorted(p.name for p in (out / split).iterdir() if p.is_dir())
    return [(str(path.relative_to(out)), label) for label, name in enumerate(classes)
            for path in sorted((out / split / name).iterdir())]


def write_lists(out):
    lines = ["path,label"] + [f"{path},{label}" for path, label in listed(out, "train")]
    (out / "train.csv").write_text("\n".join(lines) + "\n")
    entries = [{"path": path, "label": label} for path, label in listed(out, "test")]
    (out / "test.json").write_text(json.dumps(entries, indent=1))


def main():
    out = Path(sys.argv[1])
    damage = set(sys.argv[2:])
    rng = np.random.default_rng(0)
    colours = {"a": (200, 40, 40), "b": (40, 200, 40), "c": (40, 40, 200)}
    for split, count in (("train", 12), ("test", 4)):
        for name, colour in colours.items():
            folder = out / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = np.clip(rng.normal(colour, 30, (20, 24, 3)), 0, 255).astype(np.uint8)
                image = Image.fromarray(pixels, "RGB")
                image.save(folder / (f"{i:03d}.png" if i % 2 else f"{i:03d}.jpg"), quality=90)
    write_lists(out)
    train = out / "train"
    if "truncated" in damage:
        jpeg = (train / "b" / "000.jpg").read_bytes()
        (train / "b" / "zz_truncated.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    if "crc" in damage:
        png = (train / "a" / "001.png").read_bytes()
        (train / "a" / "zz_bad_crc.png").write_bytes(flip_a_pixel_bit(png))
    if "empty_file" in damage:
        (train / "c" / "zz_empty.png").write_bytes(b"")
    if "empty_class" in damage:
        (train / "d").mkdir()


if __name__ == "__main__":
    main()
