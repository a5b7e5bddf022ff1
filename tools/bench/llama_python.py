"""recipes/llama_text.toml's training in Python PyTorch eager, for the llama benchmark
(tools/bench/llama_bench.py), two ways: transformers' LlamaForCausalLM (sdpa attention), and a
plain PyTorch Llama written here from the architecture (RMSNorm, rotary embeddings, grouped-query
attention through scaled_dot_product_attention, SwiGLU, tied head), as a user without transformers
would write it. Same configuration, batch and sequence shapes, AdamW, warmup-cosine schedule and
gradient clipping as the recipe, fed by a DataLoader with num_workers=0 at PyTorch's default
thread count (the same LibTorch as trainyard's, from the venv). The token windows are drawn at
random: what is timed does not depend on which tokens they are.

    llama_python.py <transformers|plain> <steps> <log_every>

prints one JSON line: {"way", "threads", "step_ms": [mean step time of each logging interval]}.
"""

import json
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

from peers_python import warmup_cosine  # the same schedule as the peers benchmark's recipes

# recipes/llama_text.toml
VOCAB, SEQ_LEN, BATCH = 2048, 128, 16
HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS = 128, 352, 4, 4, 2
EPS, THETA = 1e-5, 500000.0
LR, WEIGHT_DECAY, WARMUP, MIN_RATIO, MAX_NORM, TOTAL_STEPS = 2e-3, 0.01, 30, 0.1, 1.0, 300


class RmsNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = HIDDEN // HEADS
        self.norm1, self.norm2 = RmsNorm(HIDDEN), RmsNorm(HIDDEN)
        self.q = nn.Linear(HIDDEN, HEADS * self.head_dim, bias=False)
        self.k = nn.Linear(HIDDEN, KV_HEADS * self.head_dim, bias=False)
        self.v = nn.Linear(HIDDEN, KV_HEADS * self.head_dim, bias=False)
        self.o = nn.Linear(HEADS * self.head_dim, HIDDEN, bias=False)
        self.gate = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.up = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.down = nn.Linear(INTERMEDIATE, HIDDEN, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, HEADS, self.head_dim).transpose(1, 2)
        k = self.k(h).view(b, t, KV_HEADS, self.head_dim).transpose(1, 2)
        v = self.v(h).view(b, t, KV_HEADS, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(attended.transpose(1, 2).reshape(b, t, -1))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class PlainLlama(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = RmsNorm(HIDDEN)
        for name, parameter in self.named_parameters():
            if "norm" not in name:
                nn.init.normal_(parameter, 0.0, 0.02)
        head_dim = HIDDEN // HEADS
        inv_freq = 1.0 / THETA ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(SEQ_LEN).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, ids):
        x = self.embed(ids)
        cos, sin = self.cos[: ids.shape[1]], self.sin[: ids.shape[1]]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return F.linear(self.norm(x), self.embed.weight)


class TransformersLlama(nn.Module):
    def __init__(self):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                             num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                             num_key_value_heads=KV_HEADS, max_position_embeddings=512,
                             rms_norm_eps=EPS, rope_theta=THETA, tie_word_embeddings=True,
                             attn_implementation="sdpa")
        self.model = LlamaForCausalLM(config)

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


def token_loss(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))


def main():
    way, steps, log_every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.manual_seed(0)
    model = {"transformers": TransformersLlama, "plain": PlainLlama}[way]()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    parameters = list(model.parameters())
    windows = torch.randint(0, VOCAB, (BATCH * (steps + 1), SEQ_LEN + 1))
    data = torch.utils.data.TensorDataset(windows[:, :-1].contiguous(), windows[:, 1:].contiguous())
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True, drop_last=True,
                                         num_workers=0)
    rate = warmup_cosine(WARMUP, MIN_RATIO)
    intervals, step = [], 0
    started = time.perf_counter()
    for x, y in loader:
        for group in optimizer.param_groups:
            group["lr"] = rate(step, TOTAL_STEPS, LR)
        optimizer.zero_grad(set_to_none=True)
        loss = token_loss(model(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(parameters, MAX_NORM)
        optimizer.step()
        step += 1
        if step % log_every == 0:
            now = time.perf_counter()
            intervals.append(1e3 * (now - started) / log_every)
            started = now
        if step >= steps:
            break
    print(json.dumps({"way": way, "threads": torch.get_num_threads(), "step_ms": intervals}))


if __name__ == "__main__":
    main()
