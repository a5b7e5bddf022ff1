"""Fixtures and torchvision references for tests/unit/image_transforms_test.cpp.

Writes into OUT two PNG files (a 60x80 colour picture and a 45x38 grayscale one: gradients,
stripes and noise) and, for each case, what torchvision.transforms.v2.functional makes of the
decoded image as a uint8 [C, H, W] tensor (torch.from_numpy(np.asarray(pil)).permute(2, 0, 1)):
the steps of the case's spec in ImageTransforms' order with the case's explicit draw, then
to_dtype(float32, scale=True) and normalize. Each output is float32 [C, H, W] raw bytes;
manifest.json lists the cases with their spec, draw, shape and file.
"""

import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image
import torch
from torchvision.transforms.v2 import functional as F

IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


def picture(height, width, channels, seed):
    # Smooth gradients, stripes and noise: colours of every hue, flat and busy regions.
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    planes = []
    for c in range(channels):
        plane = (128 + 90 * np.sin(x / (4 + 3 * c)) * np.cos(y / (6 + 2 * c))
                 + 60 * (x - y * (c + 1)) / (width + height) + rng.normal(0, 20, (height, width)))
        planes.append(plane)
    pixels = np.clip(np.stack(planes, axis=-1), 0, 255).astype(np.uint8)
    # A saturated and a gray patch: hue and saturation at their edge cases.
    pixels[2:6, 2:6] = [255, 0, 0][:channels]
    pixels[2:6, 8:12] = 77
    return pixels[..., 0] if channels == 1 else pixels


JITTER = [("brightness", F.adjust_brightness), ("contrast", F.adjust_contrast),
          ("saturation", F.adjust_saturation), ("hue", F.adjust_hue)]


def transform(image, spec, draw):
    """ImageTransforms::apply(image, draw) in torchvision's functions."""
    if spec.get("resize"):
        image = F.resize(image, spec["resize"], antialias=True)
    if spec.get("center_crop"):
        image = F.center_crop(image, spec["center_crop"])
    if spec.get("random_resized_crop"):
        size = spec["random_resized_crop"]
        size = size * 2 if len(size) == 1 else size
        image = F.resized_crop(image, draw["crop_top"], draw["crop_left"], draw["crop_height"],
                               draw["crop_width"], size, antialias=True)
    if draw.get("flip"):
        image = F.horizontal_flip(image)
    for index in draw.get("jitter_order", [0, 1, 2, 3]):
        name, adjust = JITTER[index]
        if spec.get(name, 0) > 0:
            image = adjust(image, draw[name + "_factor"])
    image = F.to_dtype(image, torch.float32, scale=True)
    if spec.get("mean"):
        image = F.normalize(image, spec["mean"], spec["std"])
    return image.contiguous()


def single_ops():
    """(name, file, spec, draw) of each step alone."""
    cases = [
        ("resize_short_side", "photo.png", {"resize": [37]}, {}),
        ("resize_short_side_portrait", "gray.png", {"resize": [29]}, {}),
        ("resize_up", "gray.png", {"resize": [64]}, {}),
        ("resize_exact", "photo.png", {"resize": [50, 30]}, {}),
        ("resize_exact_up", "photo.png", {"resize": [90, 100]}, {}),
        ("center_crop_odd_margins", "photo.png", {"center_crop": [33, 47]}, {}),
        ("center_crop_square", "gray.png", {"center_crop": [20]}, {}),
        ("center_crop_larger", "gray.png", {"center_crop": [50, 41]}, {}),
        ("center_crop_wider", "photo.png", {"center_crop": [31, 87]}, {}),
        ("normalize", "photo.png", IMAGENET, {}),
        ("normalize_gray", "gray.png", {"mean": [0.5], "std": [0.25]}, {}),
        ("flip", "photo.png", {}, {"flip": True}),
        ("flip_gray", "gray.png", {}, {"flip": True}),
    ]
    boxes = [("photo.png", (3, 10, 41, 52), [24, 24]), ("photo.png", (0, 0, 60, 80), [60, 80]),
             ("photo.png", (20, 5, 30, 30), [45]), ("gray.png", (7, 4, 30, 21), [16, 12]),
             ("photo.png", (-4, 70, 20, 20), [16, 16])]
    for number, (file, (top, left, height, width), size) in enumerate(boxes):
        cases.append((f"resized_crop_{number}", file, {"random_resized_crop": size},
                      {"crop_top": top, "crop_left": left, "crop_height": height,
                       "crop_width": width}))
    factors = {"brightness": [0.6, 1.4], "contrast": [0.5, 1.5], "saturation": [0.0, 1.7],
               "hue": [-0.3, 0.2]}
    for name, values in factors.items():
        for value in values:
            for file in ("photo.png", "gray.png"):
                cases.append((f"{name}_{value}_{file[:-4]}", file, {name: 0.5},
                              {name + "_factor": value}))
    return cases


def chains():
    """Every step at once, with a jitter order other than the identity."""
    photo_draw = {"crop_top": 5, "crop_left": 7, "crop_height": 40, "crop_width": 50,
                  "flip": True, "jitter_order": [2, 0, 3, 1], "brightness_factor": 1.3,
                  "contrast_factor": 0.7, "saturation_factor": 1.4, "hue_factor": 0.1}
    photo_spec = {"resize": [70], "center_crop": [64, 72], "random_resized_crop": [32, 40],
                  "brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1, **IMAGENET}
    gray_draw = {"crop_top": 2, "crop_left": 3, "crop_height": 30, "crop_width": 25,
                 "flip": True, "jitter_order": [3, 1, 0, 2], "brightness_factor": 0.8,
                 "contrast_factor": 1.2, "saturation_factor": 0.5, "hue_factor": -0.2}
    gray_spec = {"resize": [40], "center_crop": [36], "random_resized_crop": [24],
                 "brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.3,
                 "mean": [0.5], "std": [0.25]}
    return [("chain_photo", "photo.png", photo_spec, photo_draw),
            ("chain_gray", "gray.png", gray_spec, gray_draw)]


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    Image.fromarray(picture(60, 80, 3, 1), "RGB").save(out / "photo.png")
    Image.fromarray(picture(45, 38, 1, 2), "L").save(out / "gray.png")
    cases = []
    for name, file, spec, draw in single_ops() + chains():
        with Image.open(out / file) as pil:
            array = np.array(pil)  # a writable copy, the layout np.asarray gives
        array = array[..., None] if array.ndim == 2 else array
        result = transform(torch.from_numpy(array).permute(2, 0, 1), spec, draw)
        (out / f"{name}.bin").write_bytes(result.numpy().tobytes())
        cases.append({"name": name, "file": file, "spec": spec, "draw": draw,
                      "shape": list(result.shape), "output": f"{name}.bin"})
    manifest = {"cases": cases, "threads": torch.get_num_threads()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
