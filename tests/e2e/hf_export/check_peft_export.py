"""Loads the adapters `trainyard checkpoint export --format peft` wrote with
peft.PeftModel.from_pretrained on their base model, and checks that they are the adapters
trainyard trained.

usage: check_peft_export.py ADAPTER_DIR FINAL_MODEL BASE_DIR MERGED_DIR

FINAL_MODEL is the run's final model file (trainyard's module state by name: the frozen base and
the adapters); BASE_DIR the Hugging Face directory the run started from. Loading must log no
warning (but peft's own deprecation notices); every adapter must equal trainyard's exactly and the base must be untouched; the number
of tensors' elements in adapter_model.safetensors must equal the trainable-parameter count peft
gives the same LoraConfig. MERGED_DIR (`export --format hf --base BASE_DIR`) must load with
from_pretrained and equal peft's merge_and_unload, tensor for tensor, and its logits the adapted
model's, within fp32 tolerance. Prints what it found and exits 1 on the first difference.
"""

import logging
import os
import sys
import warnings

import torch
import torch.jit._pickle  # restore_type_tag, for LibTorch's pickles
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from loading import Collect, fail


def peft_name(name, state):
    """PEFT's name for trainyard's `name` in a PeftModel: under base_model.model, an adapter as
    the `default` adapter's, a wrapped projection's weight as its base_layer's."""
    candidates = ["base_model.model." + name]
    for suffix, replacement in ((".lora_A.weight", ".lora_A.default.weight"),
                                (".lora_B.weight", ".lora_B.default.weight"),
                                (".weight", ".base_layer.weight")):
        if name.endswith(suffix):
            candidates.append("base_model.model." + name[: -len(suffix)] + replacement)
    return next((key for key in candidates if key in state), None)


def check_merged(model, merged_dir):
    """The merged folder against peft's own merge of the same adapters."""
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)
    tokens = torch.randint(0, merged.config.vocab_size, (2, 16),
                           generator=torch.Generator().manual_seed(3))
    model.eval()
    merged.eval()
    with torch.no_grad():
        adapted = model(input_ids=tokens).logits
        logits = merged(input_ids=tokens).logits
    torch.testing.assert_close(logits, adapted, rtol=1.3e-6, atol=1e-5)
    reference = model.merge_and_unload().state_dict()
    loaded = merged.state_dict()
    for name, tensor in reference.items():
        torch.testing.assert_close(loaded[name], tensor, rtol=1.3e-6, atol=1e-5)
    return (logits - adapted).abs().max().item()


def main(adapters, final_model, base_dir, merged_dir):
    base = LlamaForCausalLM.from_pretrained(base_dir)
    collected = Collect()
    for name in ("peft", "transformers"):
        logging.getLogger(name).addHandler(collected)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(base, adapters)
    # peft reading transformers' deprecated attributes (FutureWarning, DeprecationWarning) says
    # nothing about these files.
    messages = collected.messages + [
        str(w.message) for w in caught
        if not issubclass(w.category, (FutureWarning, DeprecationWarning))
    ]
    if messages:
        fail("PeftModel.from_pretrained warned: " + " | ".join(messages))

    with torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag]):
        trained = torch.load(final_model, weights_only=True)
    state = model.state_dict()
    adapter_count = 0
    for name, tensor in trained.items():
        key = peft_name(name, state)
        if key is None:
            fail(f"trainyard's {name} is not in the PEFT model")
        if not torch.equal(state[key], tensor):
            fail(f"{name} differs from trainyard's by {(state[key] - tensor).abs().max()}")
        adapter_count += ".lora_" in name
    if adapter_count == 0:
        fail("the run's final model holds no adapters")

    saved = load_file(os.path.join(adapters, "adapter_model.safetensors"))
    saved_elements = sum(t.numel() for t in saved.values())
    config = LoraConfig.from_pretrained(adapters)
    config.inference_mode = False  # saved for inference; counted as trained
    fresh = get_peft_model(LlamaForCausalLM(base.config), config)
    trainable, total = fresh.get_nb_trainable_parameters()
    if trainable != saved_elements:
        fail(f"peft trains {trainable} parameters, the adapters hold {saved_elements}")
    difference = check_merged(model, merged_dir)
    print(f"ok: {adapter_count} adapters equal, {len(trained) - adapter_count} base tensors "
          f"untouched, trainable {trainable} of {total} as peft counts, merged as "
          f"merge_and_unload (logits within {difference:.3g})")


if __name__ == "__main__":
    transformers.logging.set_verbosity_warning()
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4])
