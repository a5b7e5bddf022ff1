#!/usr/bin/env python3
"""The files the bundled Llama recipes read, made with the venv's `tokenizers` and `transformers`
(tools/setup runs this with the venv's Python):

    make_llama_assets.py [--out DIR] [--corpus GLOB]

DIR (default data/llama in the repository, which git ignores) receives

  tokenizer.json    a Llama 3-style byte-level BPE of VOCAB_SIZE tokens trained on the `text`
                    dataset's default corpus (Debian's fortunes, less *.dat and *.u8): Llama 3's
                    split regex, byte-level pre-tokenizer and decoder, <|begin_of_text|> and
                    <|end_of_text|>, a template that puts <|begin_of_text|> before each text
                    (recipes/llama_text.toml)
  tiny-llama/       a Hugging Face model folder as a download looks: a randomly initialised
                    LlamaForCausalLM (seeded) saved by save_pretrained (config.json,
                    generation_config.json, model.safetensors), with tokenizer.json beside it
                    and a tokenizer_config.json naming its special tokens
                    (recipes/llama_finetune.toml)
  assets.json       the SHA-256 of every file and of this script: the folder is complete and
                    current when it exists and agrees with them

The same corpus and this script give the same bytes. A complete, current DIR is left as it is
(the check reads no more than the files' bytes and imports neither library). Otherwise DIR is
built in a temporary folder beside it and renamed into place, so an interrupted run never
leaves half of it.
"""
import argparse
import glob
import hashlib
import json
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = "/usr/share/games/fortunes/*"
EXCLUDED_SUFFIXES = (".dat", ".u8")  # the text dataset's default `exclude`
VOCAB_SIZE = 2048
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
MODEL_DIR = "tiny-llama"
MODEL_SEED = 0
MANIFEST = "assets.json"


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def script_digest():
    return sha256_of(os.path.abspath(__file__))


def is_current(out):
    """Whether `out` holds every file its manifest names, with those bytes, made by this script."""
    try:
        with open(os.path.join(out, MANIFEST), encoding="utf-8") as file:
            manifest = json.load(file)
        files = manifest["files"]
        return manifest["script"] == script_digest() and bool(files) and all(
            sha256_of(os.path.join(out, name)) == digest for name, digest in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def corpus_texts(pattern):
    paths = sorted(p for p in glob.glob(pattern)
                   if not p.endswith(EXCLUDED_SUFFIXES) and os.path.isfile(p)
                   and not os.path.islink(p))
    texts = []
    for path in paths:
        with open(path, "rb") as file:
            texts.append(file.read().decode("utf-8"))
    if not any(texts):
        sys.exit(f"make_llama_assets: no text in '{pattern}' (tools/setup installs Debian's "
                 "fortunes)")
    return texts


def train_tokenizer(texts):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2,
                                  special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=True),
        processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                      special_tokens=[(BOS, tok.token_to_id(BOS))])])
    return tok


def save_model(tok, folder):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()

    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(with_added_tokens=True), hidden_size=128,
        intermediate_size=352, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        bos_token_id=tok.token_to_id(BOS), eos_token_id=tok.token_to_id(EOS))
    torch.manual_seed(MODEL_SEED)
    LlamaForCausalLM(config).save_pretrained(folder)
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as file:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS,
                   "eos_token": EOS, "model_max_length": config.max_position_embeddings},
                  file, indent=2)
        file.write("\n")


def build(staging, corpus):
    tok = train_tokenizer(corpus_texts(corpus))
    tok.save(os.path.join(staging, "tokenizer.json"))
    model = os.path.join(staging, MODEL_DIR)
    save_model(tok, model)
    shutil.copyfile(os.path.join(staging, "tokenizer.json"), os.path.join(model, "tokenizer.json"))
    files = {}
    for folder, _, names in os.walk(staging):
        for name in names:
            path = os.path.join(folder, name)
            files[os.path.relpath(path, staging)] = sha256_of(path)
    with open(os.path.join(staging, MANIFEST), "w", encoding="utf-8") as file:
        json.dump({"script": script_digest(), "files": dict(sorted(files.items()))}, file,
                  indent=2)
        file.write("\n")


def replace(staging, out):
    """Puts `staging` at `out`, the previous `out` (if any) set aside first and then removed."""
    parent, name = os.path.split(out)
    previous = None
    if os.path.lexists(out):
        previous = tempfile.mkdtemp(prefix=f".{name}-old-", dir=parent)
        os.rename(out, os.path.join(previous, name))
    os.rename(staging, out)
    if previous:
        shutil.rmtree(previous)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "data", "llama"))
    parser.add_argument("--corpus", default=CORPUS)
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    if is_current(out):
        return 0
    parent, name = os.path.split(out)
    os.makedirs(parent, exist_ok=True)
    for stale in glob.glob(os.path.join(parent, f".{name}-*")):  # left by an interrupted run
        shutil.rmtree(stale, ignore_errors=True)
    staging = tempfile.mkdtemp(prefix=f".{name}-new-", dir=parent)
    os.chmod(staging, 0o755)
    try:
        build(staging, args.corpus)
        replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"make_llama_assets: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
