"""Replays a trainyard run in plain Python PyTorch and compares it step by step.

A run started with run.initial_model_file, run.step_record_file and run.final_model_file leaves
its initial parameters and buffers, one line per optimizer step (learning rate, loss, the
training split's sample indices of each micro-batch) and its final parameters. This script
shares no code with trainyard: it rebuilds the model from the recipe with torch.nn modules, reads
the samples from the dataset's files itself, and trains with torch.optim's optimizer, the
recipe's learning-rate schedule, torch.nn.utils.clip_grad_norm_, gradient accumulation and
torch.autocast, then compares the learning rate and loss of every step, the final parameters
and buffers, and the evaluation that followed the last step.

    replay.py --recipe RESOLVED.toml --initial INITIAL --record STEPS.jsonl --final FINAL
              [--eval METRICS.jsonl] [--implementation auto|single|foreach|fused]

RESOLVED.toml is `trainyard run RECIPE --print-config` (every default filled in). Prints one
line per disagreement and a summary; exits 0 when everything agrees within the bounds below (or
bit for bit with --exact) and 1 when something does not.

Bounds. fp32: rtol 1.3e-6, atol 1e-5 (torch.testing's float32 defaults) for the losses and the
final parameters; the learning rates must be equal. bf16 autocast: two bf16 ulps, rtol 1.6e-2,
with atol 1e-3 (bf16 keeps 8 mantissa bits). On the cpu with one thread the two programs run the
same kernels in the same order and agree bit for bit in both precisions, which --exact requires.
"""

import argparse
import fnmatch
import glob
import gzip
import json
import math
import os
import sys
import tomllib

import numpy as np
import torch
import torch.jit._pickle  # restore_type_tag, for LibTorch's pickles
from torch import nn
from torch.nn import functional as F

IGNORED_TARGET = -100
BOUNDS = {"fp32": (1.3e-6, 1e-5), "bf16": (1.6e-2, 1e-3)}


# ---------------------------------------------------------------------------------- data


def read_idx(path, offset):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def idx_file(root, stem):
    for suffix in (".gz", ""):
        if os.path.exists(os.path.join(root, stem + suffix)):
            return os.path.join(root, stem + suffix)
    raise SystemExit(f"replay: no {stem} under {root}")


class FashionMnist:
    """The IDX files through torchvision's ToTensor and Normalize arithmetic: uint8 -> float32,
    / 255, then (x - mean) / std with mean and std as float32 tensors of shape [1, 1, 1]."""

    def __init__(self, section, split):
        prefix = "train" if split == "train" else "t10k"
        root = section["root"]
        images = read_idx(idx_file(root, f"{prefix}-images-idx3-ubyte"), 16).reshape(-1, 1, 28, 28)
        labels = read_idx(idx_file(root, f"{prefix}-labels-idx1-ubyte"), 8)
        self.images = torch.from_numpy(images.copy())
        self.labels = torch.from_numpy(labels.astype(np.int64))
        self.normalize = section["normalize"]
        self.mean = torch.as_tensor([section["mean"]], dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.as_tensor([section["std"]], dtype=torch.float32).view(-1, 1, 1)

    def __len__(self):
        return self.labels.shape[0]

    def batch(self, indices):
        index = torch.tensor(indices, dtype=torch.long)
        x = self.images.index_select(0, index).to(torch.float32).div(255)
        if self.normalize:
            x = x.sub_(self.mean).div_(self.std)
        return x, self.labels.index_select(0, index)


class TextWindows:
    """The text dataset with the byte tokenizer: the files the glob names (sorted, without the
    excluded names), their bytes concatenated; window w is tokens [w * T, w * T + T + 1); every
    eval_every-th window is held out, the others are the training split in order."""

    def __init__(self, section, split):
        if section["tokenizer"] != "byte":
            raise SystemExit("replay: only the byte tokenizer is replayed")
        paths = sorted(glob.glob(section["path"]))
        excludes = section["exclude"]
        data = bytearray()
        for path in paths:
            name = os.path.basename(path)
            if any(fnmatch.fnmatchcase(name, pattern) for pattern in excludes):
                continue
            if not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                data += f.read()
        self.tokens = torch.frombuffer(data, dtype=torch.uint8).to(torch.long)
        self.seq_len = section["seq_len"]
        self.eval_every = section["eval_every"]
        self.split = split

    def __len__(self):
        windows = (self.tokens.shape[0] - 1) // self.seq_len
        held_out = windows // self.eval_every if self.eval_every > 0 else 0
        return windows - held_out if self.split == "train" else held_out

    def window(self, index):
        every = self.eval_every
        if self.split == "train":
            w = index if every == 0 else index + index // (every - 1)
        else:
            w = index * every + every - 1
        return self.tokens[w * self.seq_len : w * self.seq_len + self.seq_len + 1]

    def batch(self, indices):
        windows = torch.stack([self.window(i) for i in indices])
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def dataset(section, split):
    if section["plugin"] == "fashion_mnist":
        return FashionMnist(section, split)
    if section["plugin"] == "text":
        return TextWindows(section, split)
    raise SystemExit(f"replay: dataset '{section['plugin']}' is not replayed")


# --------------------------------------------------------------------------------- models


class Classifier(nn.Module):
    """plugins/models/{mlp,cnn}: named blocks run in order, cross-entropy over the samples."""

    def __init__(self, blocks, reduction):
        super().__init__()
        self.blocks = nn.ModuleDict(blocks)
        self.reduction = reduction

    def forward(self, x):
        for block in self.blocks.values():
            x = block(x)
        return x

    def loss(self, logits, target):
        return F.cross_entropy(logits, target, reduction=self.reduction)


def mlp(section, features, classes):
    if section["dropout"] != 0:
        raise SystemExit("replay: dropout draws from trainyard's streams; replay with dropout 0")
    blocks, width = {}, features
    for i, out in enumerate(section["hidden"]):
        layers = [nn.Flatten()] if i == 0 else []
        blocks[f"hidden{i}"] = nn.Sequential(*layers, nn.Linear(width, out), nn.ReLU())
        width = out
    head = [nn.Flatten()] if not section["hidden"] else []
    blocks["head"] = nn.Sequential(*head, nn.Linear(width, classes))
    return Classifier(blocks, section["loss_reduction"])


def cnn(section, classes):
    if section["dropout"] != 0:
        raise SystemExit("replay: dropout draws from trainyard's streams; replay with dropout 0")
    blocks, channels, size = {}, 1, 28
    for i, out in enumerate(section["channels"]):
        norm = [nn.BatchNorm2d(out)] if section["batch_norm"] else []
        blocks[f"stage{i}"] = nn.Sequential(
            nn.Conv2d(channels, out, 3, padding=1, bias=not section["batch_norm"]), *norm,
            nn.ReLU(), nn.MaxPool2d(2))
        channels, size = out, size // 2
    hidden = section["hidden"]
    blocks["head"] = nn.Sequential(nn.Flatten(), nn.Linear(channels * size * size, hidden),
                                   nn.ReLU(), nn.Linear(hidden, classes))
    return Classifier(blocks, section["loss_reduction"])


class GptLayer(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads, self.width = heads, d // heads
        self.attention_norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.attention_out = nn.Linear(d, d)
        self.mlp_norm = nn.LayerNorm(d)
        self.mlp_in = nn.Linear(d, 4 * d)
        self.mlp_out = nn.Linear(4 * d, d)

    def forward(self, x):
        projected = self.qkv(self.attention_norm(x))
        b, t = projected.shape[0], projected.shape[1]
        q, k, v = projected.view(b, t, 3, self.heads, self.width).permute(2, 0, 3, 1, 4).unbind(0)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        attended = attended.transpose(1, 2).reshape(b, t, self.heads * self.width)
        h = x + self.attention_out(attended)
        return h + self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(h))))


class GptEmbed(nn.Module):
    def __init__(self, vocab, seq_len, d):
        super().__init__()
        self.token = nn.Embedding(vocab, d)
        self.position = nn.Embedding(seq_len, d)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], dtype=torch.long)
        return self.token(ids) + self.position(positions)


class Gpt(nn.Module):
    """plugins/models/gpt without tensor parallelism and with dropout 0: pre-norm layers, a final
    LayerNorm, the head tied to the token embedding; per-token cross-entropy over the scored
    tokens (targets other than -100), summed, and for the mean divided by their count."""

    def __init__(self, section, vocab):
        super().__init__()
        if section["dropout"] != 0:
            raise SystemExit("replay: dropout draws from trainyard's streams; replay with 0")
        d, seq_len = section["d_model"], section["seq_len"]
        self.embed = GptEmbed(vocab, seq_len, d)
        for i in range(section["n_layers"]):
            self.add_module(f"layer{i}", GptLayer(d, section["n_heads"]))
        self.n_layers = section["n_layers"]
        self.final_norm = nn.LayerNorm(d)
        self.reduction = section["loss_reduction"]

    def forward(self, ids):
        x = self.embed(ids)
        for i in range(self.n_layers):
            x = getattr(self, f"layer{i}")(x)
        return F.linear(self.final_norm(x), self.embed.token.weight)

    def loss(self, logits, target):
        target = target.reshape(-1)
        rows = logits.reshape(-1, logits.shape[-1]).float()
        total = F.cross_entropy(rows, target, reduction="sum", ignore_index=IGNORED_TARGET)
        if self.reduction == "sum":
            return total
        return total / target.ne(IGNORED_TARGET).sum().clamp_min(1)


def llama(section, recipe_dir):
    """plugins/models/llama as transformers' own LlamaForCausalLM, configured from the recipe's
    config file (or the weights folder's config.json) with its [model.config] keys laid over it;
    per-token cross-entropy as Gpt.loss. With `weights`, the run's initial state must equal the
    published weights (load_initial checks it)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def resolve(path):
        return path if os.path.isabs(path) else os.path.join(recipe_dir, path)

    settings = {}
    config_file = section["config_file"]
    if not config_file and section["weights"] and os.path.isdir(resolve(section["weights"])):
        config_file = os.path.join(section["weights"], "config.json")
    if config_file:
        with open(resolve(config_file)) as f:
            settings = json.load(f)
    settings.update(section["config"])
    settings.setdefault("vocab_size", 256)

    class Llama(LlamaForCausalLM):
        reduction = section["loss_reduction"]
        published = resolve(section["weights"]) if section["weights"] else None

        def forward(self, ids):
            return super().forward(input_ids=ids).logits

        def loss(self, logits, target):
            return Gpt.loss(self, logits, target)

    config = LlamaConfig.from_dict(settings)
    config._attn_implementation = "sdpa"
    model = Llama(config).float()
    lora = section.get("lora") or {}
    if lora:
        # PEFT's own LoRA layers, injected in place (the base frozen, the adapters trainable).
        from peft import LoraConfig, inject_adapter_in_model

        inject_adapter_in_model(
            LoraConfig(r=lora["rank"], lora_alpha=lora.get("alpha", 8),
                       target_modules=lora.get("targets", ["q_proj", "v_proj"]),
                       lora_dropout=0.0),
            model)
    return model


def build_model(recipe, recipe_dir="."):
    section = recipe["model"]
    if section["plugin"] == "llama":
        return llama(section, recipe_dir)
    if section["plugin"] == "mlp":
        return mlp(section, 784, 10)
    if section["plugin"] == "cnn":
        return cnn(section, 10)
    if section["plugin"] == "gpt":
        section = dict(section)
        if section["seq_len"] == 0:  # the dataset's
            section["seq_len"] = recipe["dataset"]["seq_len"]
        return Gpt(section, 256)
    raise SystemExit(f"replay: model '{section['plugin']}' is not replayed")


def load_tensors(path):
    """A run's model file: a dict of tensors pickled by LibTorch (torch::pickle_save), whose
    dict carries TorchScript's type tag."""
    with torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag]):
        return torch.load(path, weights_only=True)


def python_name(name, own):
    """The Python model's name for trainyard's `name`: the same, under `blocks.`, or PEFT's
    (a LoRA-wrapped projection's weight is its base_layer's, its adapters are the `default`
    adapter's)."""
    candidates = [name, "blocks." + name]
    for suffix, peft in ((".lora_A.weight", ".lora_A.default.weight"),
                         (".lora_B.weight", ".lora_B.default.weight"),
                         (".weight", ".base_layer.weight")):
        if name.endswith(suffix):
            candidates.append(name[: -len(suffix)] + peft)
    return next((key for key in candidates if key in own), None)


def load_initial(model, path):
    """The run's initial state by trainyard's names, into the Python modules (strict: every
    name on both sides)."""
    state = load_tensors(path)
    own = model.state_dict()
    renamed = {}
    for name, tensor in state.items():
        key = python_name(name, own)
        if key is None:
            raise SystemExit(f"replay: the run's '{name}' has no counterpart in the Python model")
        renamed[key] = tensor
    if getattr(model, "published", None):
        from transformers import LlamaForCausalLM

        published = LlamaForCausalLM.from_pretrained(model.published).float().state_dict()
        for name, tensor in state.items():
            if name in published and not torch.equal(published[name], tensor):
                raise SystemExit(f"replay: the run's initial '{name}' is not the published weight")
    # A tied head is the embedding's tensor, which the run saves once.
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        renamed["lm_head.weight"] = renamed["model.embed_tokens.weight"]
    missing = sorted(set(own) - set(renamed))
    if missing:
        raise SystemExit(f"replay: the run's state lacks {missing}")
    model.load_state_dict(renamed, strict=True)
    return {python_name(name, own): name for name in state}


# ----------------------------------------------------------------------- schedule, optimizer


def learning_rate(section, step, total, base):
    """plugins/schedulers/standard, in Python floats (C doubles)."""
    if section["plugin"] == "constant":
        return base
    warmup, floor = section["warmup_steps"], section["min_lr_ratio"]
    if step < warmup:
        return base * float(step + 1) / float(warmup)
    span = float(max(1, total - warmup))
    progress = min(max(float(step - warmup) / span, 0.0), 1.0)
    if section["plugin"] == "warmup_cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif section["plugin"] == "warmup_linear":
        shape = 1.0 - progress
    else:
        raise SystemExit(f"replay: scheduler '{section['plugin']}' is not replayed")
    return base * (floor + (1.0 - floor) * shape)


def path_flags(implementation):
    """torch.optim's foreach/fused arguments for trainyard's optimizer.implementation."""
    return {"auto": {}, "single": {"foreach": False}, "foreach": {"foreach": True},
            "fused": {"fused": True}}[implementation]


def build_optimizer(section, parameters, implementation):
    flags = path_flags(implementation)
    if section["plugin"] == "adamw":
        return torch.optim.AdamW(parameters, lr=section["lr"],
                                 betas=(section["beta1"], section["beta2"]), eps=section["eps"],
                                 weight_decay=section["weight_decay"], amsgrad=section["amsgrad"],
                                 **flags)
    if section["plugin"] == "sgd":
        return torch.optim.SGD(parameters, lr=section["lr"], momentum=section["momentum"],
                               dampening=section["dampening"], nesterov=section["nesterov"],
                               weight_decay=section["weight_decay"], **flags)
    raise SystemExit(f"replay: optimizer '{section['plugin']}' is not replayed")


# ---------------------------------------------------------------------------------- replay


def close(a, b, bounds):
    rtol, atol = bounds
    return abs(a - b) <= atol + rtol * abs(b)


def evaluate(model, recipe):
    """trainyard's evaluation: the test split in order, batches of loader.eval_batch_size (4 x
    batch_size by default) without dropping the last, at most run.eval_max_batches; the loss is
    the sample-weighted mean of the batches' losses in doubles."""
    loader, run = recipe["loader"], recipe["run"]
    data = dataset(recipe["dataset"], loader["eval_split"])
    size = loader["eval_batch_size"] or 4 * loader["batch_size"]
    count = len(data)
    batches = (count + size - 1) // size
    if run["eval_max_batches"] > 0:
        batches = min(batches, run["eval_max_batches"])
    model.eval()
    loss_sum, correct, samples = 0.0, 0, 0
    with torch.no_grad(), autocast(recipe):
        for b in range(batches):
            indices = list(range(b * size, min(count, (b + 1) * size)))
            x, y = data.batch(indices)
            logits = model(x)
            loss_sum += model.loss(logits, y).double().item() * len(indices)
            correct += int(logits.argmax(1).eq(y).sum())
            samples += len(indices)
    model.train()
    return loss_sum / samples, correct / samples


def autocast(recipe):
    enabled = recipe["precision"]["plugin"] == "bf16"
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--initial", required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--final", required=True)
    parser.add_argument("--eval", help="the run's metrics.jsonl: compare its last evaluation")
    parser.add_argument("--exact", action="store_true",
                        help="require bitwise equality of every loss and final tensor")
    parser.add_argument("--implementation", choices=["auto", "single", "foreach", "fused"],
                        help="torch.optim's path (default: the recipe's optimizer.implementation)")
    args = parser.parse_args()

    with open(args.recipe, "rb") as f:
        recipe = tomllib.load(f)
    run, loader = recipe["run"], recipe["loader"]
    precision = recipe["precision"]["plugin"]
    if precision not in BOUNDS:
        raise SystemExit(f"replay: precision '{precision}' is not replayed")
    if recipe["strategy"]["plugin"] != "single" or run["device"] not in ("cpu", "auto"):
        raise SystemExit("replay: only the single strategy on cpu is replayed")
    bounds = (0.0, 0.0) if args.exact else BOUNDS[precision]
    if run["seed"] is not None:
        torch.manual_seed(run["seed"])
    if run["threads"] > 0:
        torch.set_num_threads(run["threads"])

    train = dataset(recipe["dataset"], loader["train_split"])
    model = build_model(recipe, os.path.dirname(os.path.abspath(args.recipe)))
    names = load_initial(model, args.initial)
    model.train()
    parameters = list(model.parameters())
    implementation = args.implementation or recipe["optimizer"].get("implementation", "auto")
    optimizer = build_optimizer(recipe["optimizer"], parameters, implementation)
    base_lr = recipe["optimizer"]["lr"]

    with open(args.record) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    if not steps:
        raise SystemExit("replay: the step record is empty")
    accumulation = run["grad_accumulation"]
    # trainyard's total: whole batches per epoch, whole steps of them, at most run.max_steps.
    epoch_steps = len(train) // loader["batch_size"] // accumulation
    total = run["epochs"] * epoch_steps
    if run["max_steps"] > 0:
        total = min(total, run["max_steps"])

    failures, worst_loss = 0, 0.0
    for record in steps:
        step = record["step"]
        lr = learning_rate(recipe["scheduler"], step, total, base_lr)
        if lr != record["lr"]:
            failures += 1
            print(f"step {step}: learning rate {record['lr']!r} in the run, {lr!r} in Python")
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        micro = record["indices"]
        if len(micro) != accumulation:
            raise SystemExit(f"replay: step {step} has {len(micro)} micro-batches, expected "
                             f"{accumulation}")
        loss_sum = None
        for indices in micro:
            x, y = train.batch(indices)
            with autocast(recipe):
                loss = model.loss(model(x), y)
            scaled = loss / float(len(micro)) if len(micro) > 1 else loss
            scaled.backward()
            detached = loss.detach()
            loss_sum = detached if loss_sum is None else loss_sum + detached
        if run["max_grad_norm"] > 0:
            nn.utils.clip_grad_norm_(parameters, run["max_grad_norm"])
        optimizer.step()
        step_loss = (loss_sum / float(len(micro)) if len(micro) > 1 else loss_sum).item()
        # A non-finite loss is recorded as null, with its spelling beside it.
        run_loss = record["loss"] if record["loss"] is not None else float(record["nonfinite_loss"])
        worst_loss = max(worst_loss, abs(step_loss - run_loss))
        if not close(run_loss, step_loss, bounds):
            failures += 1
            print(f"step {step}: loss {run_loss!r} in the run, {step_loss!r} in Python "
                  f"(difference {abs(run_loss - step_loss):.3g})")

    final = load_tensors(args.final)
    worst_param, rtol_atol = 0.0, bounds
    own = model.state_dict()
    for key, name in names.items():
        ours, theirs = own[key], final[name]
        if ours.dtype.is_floating_point:
            difference = (ours.double() - theirs.double()).abs().max().item() if ours.numel() else 0
            worst_param = max(worst_param, difference)
            if not torch.allclose(theirs, ours, rtol=rtol_atol[0], atol=rtol_atol[1]):
                failures += 1
                print(f"final {name}: differs by up to {difference:.3g}")
        elif not torch.equal(ours, theirs):
            failures += 1
            print(f"final {name}: {theirs.tolist()} in the run, {ours.tolist()} in Python")

    evaluated = ""
    if args.eval:
        with open(args.eval) as f:
            evals = [json.loads(line) for line in f if '"eval"' in line]
        evals = [e for e in evals if e.get("phase") == "eval"]
        if not evals:
            failures += 1
            print("the run's metrics hold no evaluation")
        else:
            loss, accuracy = evaluate(model, recipe)
            theirs = evals[-1]
            if not close(theirs["loss"], loss, bounds):
                failures += 1
                print(f"evaluation loss {theirs['loss']!r} in the run, {loss!r} in Python")
            if "accuracy" in theirs and not close(theirs["accuracy"], accuracy, bounds):
                failures += 1
                print(f"evaluation accuracy {theirs['accuracy']!r} in the run, {accuracy!r} "
                      f"in Python")
            evaluated = f", evaluation loss {loss:.6f} accuracy {accuracy:.4f}"

    verdict = ("agree bitwise" if args.exact else f"agree within rtol {bounds[0]:g} atol "
               f"{bounds[1]:g}") if failures == 0 else f"DISAGREE ({failures} mismatches)"
    print(f"replay: {len(steps)} steps of {recipe['model']['plugin']} with "
          f"{recipe['optimizer']['plugin']} ({implementation}), {precision}: {verdict}; largest "
          f"loss difference {worst_loss:.3g}, largest parameter difference {worst_param:.3g}"
          f"{evaluated}")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
