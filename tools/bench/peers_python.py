"""The bundled recipes in Python PyTorch eager, for the peers benchmark (tools/bench/peers_bench.py):
the same model as the trainyard plugin (plugins/models/{mlp,cnn,gpt}), optimizer, learning-rate
schedule, gradient clipping and batch shapes, fed by a DataLoader with num_workers=0, at PyTorch's
default thread count (the same LibTorch as trainyard's, from the venv).

    peers_python.py <recipe> <steps> <log_every>

prints one JSON line: {"recipe", "threads", "step_ms": [mean step time of each logging interval]}.
"""

import glob
import gzip
import json
import math
import os
import sys
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

FASHION = "/usr/share/datasets/fashion-mnist"
FORTUNES = "/usr/share/games/fortunes/*"


class Batched(torch.utils.data.Dataset):
    """Tensors indexed a whole batch at a time (DataLoader calls __getitems__ with the indices)."""

    def __init__(self, *tensors):
        self.tensors = tensors

    def __len__(self):
        return self.tensors[0].shape[0]

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __getitems__(self, indices):
        index = torch.tensor(indices)
        return tuple(t.index_select(0, index) for t in self.tensors)


def fashion_mnist():
    with gzip.open(f"{FASHION}/train-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(f"{FASHION}/train-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8)
    x = (torch.from_numpy(images.copy()).float() / 255.0 - 0.2860) / 0.3530
    return Batched(x, torch.from_numpy(labels.astype(np.int64)))


def fortune_windows(seq_len):
    """Byte tokens of the corpus in windows of seq_len + 1 tokens, seq_len apart (the tokens
    dataset's windows): input the first seq_len, target the last seq_len."""
    data = b"".join(open(path, "rb").read() for path in sorted(glob.glob(FORTUNES))
                    if not path.endswith(".dat"))
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    windows = tokens.unfold(0, seq_len + 1, seq_len)
    return Batched(windows[:, :-1].contiguous(), windows[:, 1:].contiguous())


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                         nn.ReLU(), nn.Linear(128, 10))


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


class Layer(nn.Module):
    """plugins/models/gpt's TransformerLayer without tensor parallelism."""

    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads, self.width = heads, d // heads
        self.attention_norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.attention_out = nn.Linear(d, d)
        self.mlp_norm = nn.LayerNorm(d)
        self.mlp_in = nn.Linear(d, 4 * d)
        self.mlp_out = nn.Linear(4 * d, d)
        self.dropout = nn.Dropout(dropout)
        self.p = dropout

    def forward(self, x):
        projected = self.qkv(self.attention_norm(x))
        b, t = projected.shape[0], projected.shape[1]
        q, k, v = projected.view(b, t, 3, self.heads, self.width).permute(2, 0, 3, 1, 4).unbind(0)
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0,
                                                  is_causal=True)
        attended = attended.transpose(1, 2).reshape(b, t, self.heads * self.width)
        h = x + self.dropout(self.attention_out(attended))
        return h + self.dropout(self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(h)))))


class Gpt(nn.Module):
    """plugins/models/gpt: token and position embeddings, pre-norm layers, a final LayerNorm and
    the head tied to the token embedding; per-token cross-entropy, mean over scored tokens."""

    def __init__(self, vocab=256, seq_len=128, d=128, heads=4, layers=4, dropout=0.0):
        super().__init__()
        self.token = nn.Embedding(vocab, d)
        self.position = nn.Embedding(seq_len, d)
        self.embed_dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(Layer(d, heads, dropout) for _ in range(layers))
        self.final_norm = nn.LayerNorm(d)
        for name, parameter in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(parameter)
            elif "norm" in name:
                nn.init.ones_(parameter)
            elif name.endswith("mlp_out.weight") or name.endswith("attention_out.weight"):
                nn.init.normal_(parameter, 0.0, 0.02 / math.sqrt(2 * layers))
            else:
                nn.init.normal_(parameter, 0.0, 0.02)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], dtype=torch.long)
        x = self.embed_dropout(self.token(ids) + self.position(positions))
        for layer in self.layers:
            x = layer(x)
        return F.linear(self.final_norm(x), self.token.weight)


def gpt_loss(logits, target):
    target = target.reshape(-1)
    rows = logits.reshape(-1, logits.shape[-1]).float()
    total = F.cross_entropy(rows, target, reduction="sum", ignore_index=-100)
    return total / target.ne(-100).sum().clamp_min(1)


def warmup_cosine(warmup, min_ratio):
    def rate(step, total, base):
        if step < warmup:
            return base * (step + 1) / warmup
        progress = min(max((step - warmup) / max(1, total - warmup), 0.0), 1.0)
        return base * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
    return rate


def constant(step, total, base):
    return base


# recipe: (model, data, batch size, lr, weight decay, schedule, max_grad_norm, loss)
RECIPES = {
    "fashion_mnist_mlp": (mlp, fashion_mnist, 64, 2e-3, 1e-4, warmup_cosine(50, 0.0), 0.0,
                          F.cross_entropy),
    "fashion_mnist_cnn": (cnn, fashion_mnist, 64, 1e-3, 1e-4, constant, 0.0, F.cross_entropy),
    "gpt_text": (Gpt, lambda: fortune_windows(128), 16, 2e-3, 0.01, warmup_cosine(30, 0.1), 1.0,
                 gpt_loss),
}


def main():
    recipe, steps, log_every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    make_model, make_data, batch, lr, weight_decay, schedule, max_norm, loss_fn = RECIPES[recipe]
    torch.manual_seed(0)
    model = make_model()
    model.train()
    # PEERS_IMPLEMENTATION: the update path trainyard's optimizer.implementation names.
    path = {"auto": {}, "single": {"foreach": False}, "foreach": {"foreach": True},
            "fused": {"fused": True}}[os.environ.get("PEERS_IMPLEMENTATION") or "auto"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, **path)
    parameters = [p for p in model.parameters()]
    generator = torch.Generator().manual_seed(0)
    loader = torch.utils.data.DataLoader(make_data(), batch_size=batch, shuffle=True, drop_last=True,
                                         num_workers=0, collate_fn=lambda batch: batch,
                                         generator=generator)
    intervals, step = [], 0
    started = time.perf_counter()
    while step < steps:
        for x, y in loader:
            for group in optimizer.param_groups:
                group["lr"] = schedule(step, steps, lr)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            if max_norm > 0:
                nn.utils.clip_grad_norm_(parameters, max_norm)
            optimizer.step()
            step += 1
            if step % log_every == 0:
                now = time.perf_counter()
                intervals.append(1e3 * (now - started) / log_every)
                started = now
            if step >= steps:
                break
    print(json.dumps({"recipe": recipe, "threads": torch.get_num_threads(), "step_ms": intervals}))


if __name__ == "__main__":
    main()
