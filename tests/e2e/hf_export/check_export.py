"""Loads a directory `trainyard checkpoint export --format hf` wrote with transformers'
AutoModelForCausalLM.from_pretrained and checks that it is the model trainyard trained.

usage: check_export.py DIR FINAL_MODEL SETTINGS_JSON

FINAL_MODEL is the run's final model file ([run] final_model_file: trainyard's module state by
name, torch.load reads it); SETTINGS_JSON the LlamaConfig keys the recipe configured the model
with. The loading must report no missing, unexpected or mismatched tensor and log no warning;
every loaded tensor must equal trainyard's exactly; and the logits of a token batch must equal
those of transformers' LlamaForCausalLM configured from SETTINGS_JSON (not from the exported
config.json) holding trainyard's state: the logits trainyard's llama gives for that state
(tests/unit/llama_test.cpp holds them equal).
Prints what it found and exits 1 on the first difference.
"""

import json
import sys
import warnings

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from loading import Collect, fail


def main(directory, final_model, settings):
    transformers.logging.set_verbosity_warning()
    collected = Collect()
    transformers.logging.get_logger().addHandler(collected)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, info = AutoModelForCausalLM.from_pretrained(directory, output_loading_info=True)
    messages = collected.messages + [str(w.message) for w in caught]
    if messages:
        fail("from_pretrained warned: " + " | ".join(messages))
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        if info.get(kind):
            fail(f"from_pretrained reports {kind}: {info[kind]}")
    if type(model).__name__ != "LlamaForCausalLM":
        fail("from_pretrained built " + type(model).__name__)

    trained = torch.load(final_model, weights_only=False)  # written by the run under test
    loaded = model.state_dict()
    for name, tensor in trained.items():
        if name not in loaded:
            fail(f"trainyard's {name} is not in the loaded model")
        if not torch.equal(loaded[name], tensor):
            fail(f"{name} differs from trainyard's by {(loaded[name] - tensor).abs().max()}")

    reference = LlamaForCausalLM(LlamaConfig(**json.loads(settings)))
    missing, unexpected = reference.load_state_dict(trained, strict=False)
    tied = reference.config.tie_word_embeddings
    if unexpected or [name for name in missing if not (tied and name == "lm_head.weight")]:
        fail(f"trainyard's state does not fit LlamaForCausalLM: {missing} {unexpected}")
    tokens = torch.randint(
        0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3)
    )
    model.eval()
    reference.eval()
    with torch.no_grad():
        exported = model(tokens).logits
        expected = reference(tokens).logits
    torch.testing.assert_close(exported, expected, rtol=1.3e-6, atol=1e-5)
    print(
        f"ok: {len(trained)} tensors equal, logits {tuple(exported.shape)} within fp32 "
        f"tolerance (max difference {(exported - expected).abs().max().item():.3g})"
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
