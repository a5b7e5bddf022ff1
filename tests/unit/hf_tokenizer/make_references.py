"""Reference tokenizers and ids for tests/unit/hf_tokenizer_test.cpp, made offline with Python's
`tokenizers`, `sentencepiece` and `transformers` (the venv's): nothing here shares code with the
C++ under test.

    make_references.py OUT STRESS_FILE [--corpus GLOB] [--tokenizers-only]

Trains, on Debian's fortunes (the `text` dataset's default corpus: /usr/share/games/fortunes/*
less *.dat and *.u8), one tokenizer of each layout the C++ reader supports, writes each to
OUT/<name>.json (OUT/spm.model for SentencePiece), and unless --tokenizers-only, the ids and
decoded texts of every corpus file and every distinct line, and of the stress file, to
OUT/<name>.reference.json. OUT/manifest.json lists the texts (in order) and the tokenizers.

What it makes depends only on this script, the texts and the versions of the three packages, so
it is kept under $XDG_CACHE_HOME/trainyard/hf-tokenizer-references/<a hash of them> (default
~/.cache) and copied from there when the same inputs come again; --no-cache makes it afresh."""

import argparse
import glob
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile

MISSING = 77  # the exit status that tells the test the environment lacks something

try:
    import sentencepiece  # noqa: F401  (used in sentencepiece_model)
    import transformers  # noqa: F401  (used in converted_llama)
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, processors, trainers)
except ImportError as error:
    print(f"make_references: {error} (tools/setup --tests installs it)", file=sys.stderr)
    sys.exit(MISSING)

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Words given a vocab entry of their own that no merge reaches, so that Llama 3's
# ignore_merges (a whole pre-token found in the vocab is emitted as is) changes ids.
UNMERGED_WORDS = [" Theory", " 日本", " programmers", " computers", " fortunes",
                  " Supercalifragilisticexpialidocious", " naïve", " Москва", " quickly"]
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]


def byte_level(text):
    """GPT-2's byte-to-unicode map applied to the UTF-8 bytes of `text`."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) +
                 list(range(0xAE, 0x100)))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return "".join(table[b] for b in text.encode("utf-8"))


def corpus_files(pattern):
    return sorted(p for p in glob.glob(pattern)
                  if not p.endswith((".dat", ".u8")) and os.path.isfile(p)
                  and not os.path.islink(p))


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8")


def lines_of(texts):
    seen, out = set(), []
    for text in texts:
        for line in text.split("\n"):
            if line not in seen:
                seen.add(line)
                out.append(line)
    return out


def train_byte_level(lines, pre_tokenizer, special, vocab_size, ignore_merges=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(lines, trainer=trainer)
    tok.decoder = decoders.ByteLevel()
    return tok


def gpt2(lines):
    tok = train_byte_level(lines, pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"],
                           4000)
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    return tok


def gpt2_prefix_space(gpt2_tok):
    """GPT-2's layout with add_prefix_space, merges written in the legacy "a b" form."""
    data = json.loads(gpt2_tok.to_str())
    data["pre_tokenizer"]["add_prefix_space"] = True
    data["model"]["merges"] = [" ".join(pair) for pair in data["model"]["merges"]]
    return Tokenizer.from_str(json.dumps(data))


def llama3(lines):
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok = train_byte_level(lines, pre, ["<|begin_of_text|>", "<|end_of_text|>"], 4000,
                           ignore_merges=True)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for word in UNMERGED_WORDS:
        encoded = byte_level(word)
        if encoded not in vocab:
            vocab[encoded] = len(vocab)
    tok = Tokenizer.from_str(json.dumps(data))
    tok.add_special_tokens([
        AddedToken("<|reserved_0|>", special=True, normalized=False),
        AddedToken("<mask>", special=True, lstrip=True, normalized=False)])
    tok.add_tokens([AddedToken("[tag]", single_word=True, normalized=True),
                    AddedToken("@@", rstrip=True, normalized=False)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=True),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    return tok


def llama2(lines, byte_fallback=True):
    """Llama 2's tokenizer.json layout: Prepend/Replace normalizer, no pre-tokenizer, BPE with
    byte fallback over <0x00>..<0xFF>, <unk> <s> </s> first, a <s> template."""
    trainer_tok = Tokenizer(models.BPE())
    trainer_tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                                   normalizers.Replace(" ", "▁")])
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never",
                                                         split=True)
    trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, limit_alphabet=150,
                                  special_tokens=[], show_progress=False)
    trainer_tok.train_from_iterator(lines, trainer=trainer)
    trained = json.loads(trainer_tok.to_str())["model"]
    order = sorted(trained["vocab"].items(), key=lambda item: item[1])
    vocab = {}
    for token in ["<unk>", "<s>", "</s>"] + BYTE_TOKENS + [t for t, _ in order]:
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
                               byte_fallback=byte_fallback))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ["<unk>", "<s>", "</s>"]])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return tok


def llama2_metaspace(llama2_tok):
    """Llama 2's vocab and merges with the non-legacy layout: no normalizer, a Metaspace
    pre-tokenizer that prepends only at the start (prepend_scheme "first") and does not split."""
    data = json.loads(llama2_tok.to_str())
    data["normalizer"] = None
    data["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                             "split": False}
    data["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                       "split": False}
    return Tokenizer.from_str(json.dumps(data))


def sentencepiece_model(corpus_txt, out):
    import sentencepiece as spm
    spm.SentencePieceTrainer.train(
        input=corpus_txt, model_prefix=os.path.join(out, "spm"), vocab_size=2000,
        model_type="bpe", byte_fallback=True, character_coverage=0.9995, num_threads=2,
        minloglevel=2, max_sentence_length=1 << 16)
    return spm.SentencePieceProcessor(model_file=os.path.join(out, "spm.model"))


def converted_llama(out):
    """What transformers writes for a Llama tokenizer made from a SentencePiece BPE model: the
    vocab and merges extracted from the .model, a Metaspace pre-tokenizer (prepend "first", no
    split), byte fallback, no unk token."""
    from transformers import LlamaTokenizer
    from transformers.convert_slow_tokenizer import SentencePieceExtractor

    extracted = SentencePieceExtractor(os.path.join(out, "spm.model")).extract(None)
    return LlamaTokenizer(**extracted).backend_tokenizer


def hf_reference(tok, texts, lines, stress_lines):
    return {
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "text_ids": [tok.encode(t).ids for t in texts],
        "text_decoded": [tok.decode(tok.encode(t).ids) for t in texts],
        "text_decoded_plain": [
            tok.decode(tok.encode(t, add_special_tokens=False).ids, skip_special_tokens=False)
            for t in texts],
        "line_ids": [e.ids for e in tok.encode_batch(lines)],
        "stress_line_ids_plain": [tok.encode(t, add_special_tokens=False).ids for t in stress_lines],
        "stress_line_decoded_with_special": [
            tok.decode(tok.encode(t).ids, skip_special_tokens=False) for t in stress_lines],
    }


def spm_reference(sp, texts, lines, stress_lines):
    """The same entries as hf_reference's: sentencepiece adds no special tokens, and its decode
    drops control tokens whatever it is asked."""
    decoded = [sp.decode(sp.encode(t)) for t in texts]
    return {
        "vocab_size": sp.get_piece_size(),
        "bos": sp.bos_id(),
        "eos": sp.eos_id(),
        "text_ids": [sp.encode(t) for t in texts],
        "text_decoded": decoded,
        "text_decoded_plain": decoded,
        "line_ids": sp.encode(lines),
        "stress_line_ids_plain": sp.encode(stress_lines),
        "stress_line_decoded_with_special": [sp.decode(sp.encode(t)) for t in stress_lines],
    }


def cache_folder(args, files):
    """Where the output of these inputs is kept: a hash of this script, every text (name and
    bytes, in order), the options and the package versions."""
    key = hashlib.sha256()
    for path in [os.path.abspath(__file__), args.stress] + files:
        with open(path, "rb") as f:
            key.update(os.path.basename(path).encode() + b"\0" + f.read() + b"\0")
    key.update(b"tokenizers-only" if args.tokenizers_only else b"all")
    for package in ("tokenizers", "sentencepiece", "transformers"):
        key.update(f"{package}={importlib.metadata.version(package)}".encode())
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "trainyard", "hf-tokenizer-references", key.hexdigest()[:32])


def copy_from_cache(cached, out, paths):
    """The kept output into OUT, the manifest naming this checkout's texts."""
    for name in os.listdir(cached):
        if name != "manifest.json":
            shutil.copy2(os.path.join(cached, name), os.path.join(out, name))
    with open(os.path.join(cached, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    manifest["texts"] = paths
    with open(os.path.join(out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, ensure_ascii=False)


def keep_in_cache(out, cached):
    """OUT's files under `cached`, whole or not at all (a rename of a complete copy)."""
    parent = os.path.dirname(cached)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(dir=parent)
    for name in os.listdir(out):
        shutil.copy2(os.path.join(out, name), os.path.join(staging, name))
    try:
        os.rename(staging, cached)
    except OSError:  # another process kept the same output first
        shutil.rmtree(staging, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("stress")
    parser.add_argument("--corpus", default="/usr/share/games/fortunes/*")
    parser.add_argument("--tokenizers-only", action="store_true")
    parser.add_argument("--no-cache", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    files = corpus_files(args.corpus)
    if not files:
        print(f"make_references: no corpus files match {args.corpus} (tools/setup installs "
              "Debian's fortunes)", file=sys.stderr)
        sys.exit(MISSING)
    cached = None if args.no_cache else cache_folder(args, files)
    if cached and os.path.exists(os.path.join(cached, "manifest.json")):
        copy_from_cache(cached, args.out, files + [args.stress])
        return
    make(args, files)
    if cached:
        keep_in_cache(args.out, cached)


def make(args, files):
    corpus = [read_text(p) for p in files]
    corpus_lines = lines_of(corpus)
    corpus_txt = os.path.join(args.out, "corpus.txt")
    with open(corpus_txt, "w", encoding="utf-8") as f:
        f.write("\n".join(line for line in corpus_lines if line.strip()) + "\n")

    made = {}
    made["gpt2"] = gpt2(corpus_lines)
    made["gpt2_prefix_space"] = gpt2_prefix_space(made["gpt2"])
    made["llama3"] = llama3(corpus_lines)
    made["llama2"] = llama2(corpus_lines)
    made["llama2_unk"] = llama2(corpus_lines, byte_fallback=False)
    made["llama2_metaspace"] = llama2_metaspace(made["llama2"])
    sp = sentencepiece_model(corpus_txt, args.out)
    made["llama_converted"] = converted_llama(args.out)
    for name, tok in made.items():
        tok.save(os.path.join(args.out, f"{name}.json"))
    names = list(made) + ["spm"]
    paths = files + [args.stress]
    texts = corpus + [read_text(args.stress)]
    lines = lines_of(texts)
    stress_lines = read_text(args.stress).split("\n")
    manifest = {"texts": paths, "tokenizers": {n: f"{n}.json" for n in made}, "lines": lines}
    manifest["tokenizers"]["spm"] = "spm.model"
    with open(os.path.join(args.out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, ensure_ascii=False)
    if args.tokenizers_only:
        return
    for name in names:
        if name == "spm":
            reference = spm_reference(sp, texts, lines, stress_lines)
        else:
            reloaded = Tokenizer.from_file(os.path.join(args.out, f"{name}.json"))
            reference = hf_reference(reloaded, texts, lines, stress_lines)
        with open(os.path.join(args.out, f"{name}.reference.json"), "w", encoding="utf-8") as f:
            json.dump(reference, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
