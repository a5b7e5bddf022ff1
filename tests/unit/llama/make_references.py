"""Hugging Face Llama folders and transformers' logits for the llama model's parity tests.

For each case, a randomly initialised transformers LlamaForCausalLM (its norms perturbed too, so a
misplaced norm weight shows) is saved as a Hugging Face folder: config.json and model.safetensors,
or shards with model.safetensors.index.json. Beside it, reference.safetensors holds a batch of
token ids ("ids") and the fp32 logits transformers computes for them ("logits").

Usage: make_references.py OUT_DIR
"""

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

SHAPE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-5)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}

# name: (key/value heads, tied embeddings, rotary parameters, sharded files)
CASES = {
    "mha_untied": (4, False, None, False),
    "gqa_tied": (2, True, None, True),
    "mqa_llama3": (1, False, LLAMA3, True),
    "gqa_tied_llama3": (2, True, LLAMA3, False),
}


def make_case(out: Path, name: str, kv_heads: int, tied: bool, rope, sharded: bool, seed: int):
    torch.manual_seed(seed)
    extra = {"rope_parameters": rope} if rope else {}
    config = LlamaConfig(**SHAPE, num_key_value_heads=kv_heads, tie_word_embeddings=tied,
                         attn_implementation="sdpa", **extra)
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith("norm.weight"):
                parameter.add_(0.1 * torch.randn_like(parameter))
    folder = out / name
    model.save_pretrained(folder, max_shard_size="20KB" if sharded else "1GB")
    ids = torch.randint(0, SHAPE["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    save_file({"ids": ids.contiguous(), "logits": logits.contiguous()},
              str(folder / "reference.safetensors"))


def interleaved(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """q or k rows in Meta's layout (each head's rotary pairs adjacent), not transformers'."""
    rows, columns = weight.shape
    half = rows // heads // 2
    return weight.view(heads, 2, half, columns).transpose(1, 2).reshape(rows, columns)


def make_negative_controls(out: Path):
    """Copies of mha_untied with a wrong mapping, which must not match its logits."""
    source = out / "mha_untied"
    model = LlamaForCausalLM.from_pretrained(source).float()
    heads = model.config.num_attention_heads
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    rotary = dict(state)
    swapped = dict(state)
    for layer in range(model.config.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        for projection in ("q_proj", "k_proj"):
            name = prefix + f"self_attn.{projection}.weight"
            rotary[name] = interleaved(state[name], heads)
        swapped[prefix + "mlp.gate_proj.weight"] = state[prefix + "mlp.up_proj.weight"]
        swapped[prefix + "mlp.up_proj.weight"] = state[prefix + "mlp.gate_proj.weight"]
    for name, weights in (("negative_interleaved_rotary", rotary), ("negative_swapped_gate_up", swapped)):
        folder = out / name
        folder.mkdir()
        (folder / "config.json").write_text((source / "config.json").read_text())
        save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))


def main():
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    for seed, (name, case) in enumerate(CASES.items()):
        make_case(out, name, *case, seed=seed + 1)
    make_negative_controls(out)


if __name__ == "__main__":
    main()
