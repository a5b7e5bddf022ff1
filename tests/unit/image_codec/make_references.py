"""Fixtures and Pillow/torchvision references for tests/unit/image_codec_test.cpp.

Writes into OUT: JPEG and PNG files (colour, grayscale, 4:4:4 and 4:2:0 chroma, transparency, a
palette), the pixels Pillow decodes from each (Image.open(f).convert(mode)) as raw bytes, the
pixels torchvision's v2 resize (antialias=True) makes of a decoded image at several sizes, and
damaged files (a truncated JPEG, a PNG whose IDAT CRC is wrong, an empty file, a text file); and,
given a second argument (the throughput fixture tools/setup writes, data/fashion-mnist-jpeg224),
the pixels Pillow decodes from its first 16 JPEG files. manifest.json lists them all.
"""

import json
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
from PIL import Image
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F


def picture(height, width, channels, seed):
    # Smooth gradients, stripes and noise: every IDCT frequency and chroma edge gets exercised.
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    planes = []
    for c in range(channels):
        plane = (128 + 60 * np.sin(x / (5 + 3 * c)) * np.cos(y / (7 + 2 * c))
                 + 40 * (x + y * (c + 1)) / (width + height) + rng.normal(0, 12, (height, width)))
        planes.append(plane)
    pixels = np.clip(np.stack(planes, axis=-1), 0, 255).astype(np.uint8)
    return pixels[..., 0] if channels == 1 else pixels


def write_raw(out, name, array):
    (out / name).write_bytes(np.ascontiguousarray(array).tobytes())


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rgb = Image.fromarray(picture(224, 224, 3, 1), "RGB")
    gray = Image.fromarray(picture(28, 28, 1, 2), "L")
    rgba = Image.fromarray(np.dstack([picture(40, 56, 3, 3), picture(40, 56, 1, 4)]), "RGBA")
    files = {
        "rgb.jpg": lambda p: rgb.save(p, quality=90),
        "rgb_444.jpg": lambda p: rgb.save(p, quality=95, subsampling=0),
        "gray.jpg": lambda p: gray.save(p, quality=90),
        "rgb.png": lambda p: rgb.save(p),
        "gray.png": lambda p: gray.save(p),
        "rgba.png": lambda p: rgba.save(p),
        "palette.png": lambda p: rgb.quantize(64).save(p),
    }
    decoded = []
    for name, save in files.items():
        save(out / name)
        for mode in ("stored", "L", "RGB"):
            with Image.open(out / name) as image:
                image.load()
                stored = "L" if image.mode in ("L", "LA") else "RGB"
                converted = image.convert(stored if mode == "stored" else mode)
            array = np.asarray(converted)
            raw = f"{name}.{mode}.bin"
            write_raw(out, raw, array)
            decoded.append({"file": name, "mode": mode, "height": array.shape[0],
                            "width": array.shape[1],
                            "channels": 1 if array.ndim == 2 else array.shape[2], "pixels": raw})

    resized = []
    for source, mode in (("rgb.jpg", "RGB"), ("gray.png", "L")):
        with Image.open(out / source) as image:
            tensor = v2.functional.pil_to_tensor(image.convert(mode))
        for height, width in ((112, 112), (100, 150), (300, 256), (17, 9)):
            result = F.resize(tensor, [height, width], antialias=True)
            raw = f"{source}.{height}x{width}.bin"
            write_raw(out, raw, result.permute(1, 2, 0).numpy())
            resized.append({"file": source, "mode": mode, "height": height, "width": width,
                            "pixels": raw})

    # Damage: half a JPEG; a PNG with one byte of its first IDAT's CRC changed; nothing; text.
    jpeg = (out / "rgb.jpg").read_bytes()
    (out / "truncated.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    png = bytearray((out / "rgb.png").read_bytes())
    at = png.index(b"IDAT")
    length = struct.unpack(">I", png[at - 4:at])[0]
    png[at + 4 + length] ^= 0xFF
    (out / "bad_crc.png").write_bytes(bytes(png))
    (out / "empty.jpg").write_bytes(b"")
    (out / "notes.png").write_text("not an image\n")
    bad = [{"file": "truncated.jpg", "says": "damaged JPEG"},
           {"file": "bad_crc.png", "says": "damaged PNG"},
           {"file": "empty.jpg", "says": "empty file"},
           {"file": "notes.png", "says": "neither a JPEG nor a PNG"}]
    fixture = []
    if len(sys.argv) > 2:
        for index, path in enumerate(sorted(Path(sys.argv[2]).rglob("*.jpg"))[:16]):
            with Image.open(path) as image:
                array = np.asarray(image.convert("RGB"))
            raw = f"fixture{index}.bin"
            write_raw(out, raw, array)
            fixture.append({"file": str(path), "pixels": raw})
    manifest = {"decoded": decoded, "resized": resized, "bad": bad, "fixture": fixture,
                "threads": torch.get_num_threads()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
