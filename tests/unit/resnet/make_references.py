"""torchvision ResNets and their logits for the resnet model's parity tests.

For each case a randomly initialised torchvision ResNet gets BatchNorm statistics measured on a
calibration batch and perturbed affine weights (so a misplaced BatchNorm tensor shows), and is
saved as CASE/weights.safetensors (its state_dict). Beside it, CASE/reference.safetensors holds:
  input            a batch of images
  eval_logits      the model's logits in eval mode (running statistics)
  train_logits     the logits of one forward in train mode that follows (batch statistics)
  after_train.NAME every BatchNorm buffer after that forward (running statistics updated)
Two broken copies of resnet18_small's weights test the refusals: one without a tensor and one
with a tensor of the wrong shape.

Usage: make_references.py OUT_DIR [THREADS]
THREADS (default 1) is torch's intra-op thread count: the test passes its own, so that both sides
split the convolutions' sums alike.
"""

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torchvision.models import resnet18, resnet34, resnet50

CLASSES = 10

# name: (constructor, image channels, image size, batch, small stem)
CASES = {
    "resnet18": (resnet18, 3, 64, 3, False),
    "resnet18_small": (resnet18, 1, 28, 4, True),
    "resnet34": (resnet34, 3, 32, 3, False),
    "resnet50": (resnet50, 3, 64, 3, False),
}

MISSING_TENSOR = "layer3.1.bn2.running_var"
WRONG_SHAPE = "layer2.0.conv1.weight"


def make_model(constructor, channels: int, small_stem: bool) -> torch.nn.Module:
    model = constructor(num_classes=CLASSES)
    if small_stem:
        # The plugin's stem = "small": one 3x3 stride-1 convolution, no max-pool; names unchanged.
        model.conv1 = torch.nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        torch.nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
        model.maxpool = torch.nn.Identity()
    elif channels != 3:
        model.conv1 = torch.nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model.float()


def calibrate(model: torch.nn.Module, images: torch.Tensor):
    """Running statistics of one batch (a cumulative average over it), then perturbed affine
    weights, so that eval-mode activations keep their scale and every BatchNorm tensor matters."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for norm in norms:
        norm.momentum = None
        norm.reset_running_stats()
    model.train()
    with torch.no_grad():
        model(images)
        for norm in norms:
            norm.momentum = 0.1
            norm.weight.mul_(1 + 0.2 * torch.randn_like(norm.weight))
            norm.bias.add_(0.1 * torch.randn_like(norm.bias))
            norm.running_mean.add_(0.05 * torch.randn_like(norm.running_mean))


def make_case(out: Path, name: str, seed: int):
    constructor, channels, size, batch, small_stem = CASES[name]
    torch.manual_seed(seed)
    model = make_model(constructor, channels, small_stem)
    calibrate(model, torch.randn(8, channels, size, size))
    folder = out / name
    folder.mkdir(parents=True)
    state = {key: tensor.clone().contiguous() for key, tensor in model.state_dict().items()}
    save_file(state, str(folder / "weights.safetensors"))

    images = torch.randn(batch, channels, size, size)
    with torch.no_grad():
        model.eval()
        eval_logits = model(images)
        model.train()
        train_logits = model(images)
    reference = {"input": images, "eval_logits": eval_logits, "train_logits": train_logits}
    for key, tensor in model.state_dict().items():
        if "running_" in key or "num_batches_tracked" in key:
            reference["after_train." + key] = tensor.clone()
    save_file({k: v.contiguous() for k, v in reference.items()}, str(folder / "reference.safetensors"))
    return state


def make_broken(out: Path, state: dict):
    missing = {k: v for k, v in state.items() if k != MISSING_TENSOR}
    save_file(missing, str(out / "missing_tensor.safetensors"))
    wrong = dict(state)
    out_channels, in_channels = state[WRONG_SHAPE].shape[:2]
    wrong[WRONG_SHAPE] = torch.zeros(out_channels, in_channels, 1, 1)
    save_file(wrong, str(out / "wrong_shape.safetensors"))


def main():
    out = Path(sys.argv[1])
    torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    states = {name: make_case(out, name, seed + 1) for seed, name in enumerate(CASES)}
    make_broken(out, states["resnet18_small"])


if __name__ == "__main__":
    main()
