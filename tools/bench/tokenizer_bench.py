"""Encoding throughput of trainyard's hf_tokenizer library against Python's `tokenizers`, both on
one thread (RAYON_NUM_THREADS=1), on the same text: Debian's fortunes (the `text` dataset's
default corpus), each file encoded whole, special tokens added, best of ROUNDS rounds after a
warm-up round on both sides.

    .venv/bin/python tools/bench/tokenizer_bench.py [--binary build/bin/tokenizer_bench]
        [--rounds 5] [--corpus GLOB] [--tokenizer NAME=tokenizer.json]... [--smoke]

Without --tokenizer, the Llama 3 layout (byte-level BPE, Llama 3's split regex, ignore_merges)
and the Llama 2 layout (byte-fallback BPE) are trained on the corpus by
tests/unit/hf_tokenizer/make_references.py, as the tokenizer test trains them. --smoke: three
corpus files, one round (the test suite's run; no timing is judged there).

Prints one row per tokenizer with both figures in MB/s and their ratio (trainyard / the faster
of Python's `encode` and `encode_batch_fast`; above 1 is faster), and exits 1 when the two sides
disagree on the number of tokens."""

import argparse
import os
import subprocess
import sys
import tempfile
import time

# Before tokenizers starts its thread pool: the batch calls then run on this thread alone.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "unit", "hf_tokenizer"))

import make_references  # noqa: E402  (after the environment above; trains the tokenizers)
from tokenizers import Tokenizer  # noqa: E402


def best_seconds(rounds, encode):
    encode()  # warm-up: the word cache fills, as on the C++ side
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        encode()
        best = min(best, time.perf_counter() - start)
    return best


def python_figures(path, texts, rounds):
    """Tokens, and MB/s of `encode` per text and of `encode_batch_fast` (no offsets) over all."""
    tok = Tokenizer.from_file(path)
    size = sum(len(t.encode("utf-8")) for t in texts)
    tokens = sum(len(tok.encode(t).ids) for t in texts)
    figures = {"encode": size / best_seconds(rounds, lambda: [tok.encode(t) for t in texts]) / 1e6}
    if hasattr(tok, "encode_batch_fast"):
        figures["encode_batch_fast"] = (
            size / best_seconds(rounds, lambda: tok.encode_batch_fast(texts)) / 1e6)
    return tokens, figures


def trainyard_figures(binary, path, files, rounds):
    out = subprocess.run([binary, "--rounds", str(rounds), path] + files, check=True,
                         capture_output=True, text=True).stdout
    line = next(l for l in out.splitlines() if l.startswith("trainyard "))
    fields = dict(field.split("=", 1) for field in line.split()[1:])
    return int(fields["tokens"]), float(fields["mb_per_s"])


def trained_tokenizers(files, folder):
    lines = make_references.lines_of([make_references.read_text(p) for p in files])
    paths = {}
    for name, train in (("llama3", make_references.llama3), ("llama2", make_references.llama2)):
        paths[name] = os.path.join(folder, f"{name}.json")
        train(lines).save(paths[name])
    return paths


def main():
    parser = argparse.ArgumentParser()
    default_build = os.environ.get("TRAINYARD_BUILD_DIR", os.path.join(ROOT, "build"))
    parser.add_argument("--binary", default=os.path.join(default_build, "bin", "tokenizer_bench"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--corpus", default="/usr/share/games/fortunes/*")
    parser.add_argument("--tokenizer", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if not os.access(args.binary, os.X_OK):
        sys.exit(f"tokenizer_bench: no {args.binary} (build the tokenizer_bench target, or name "
                 "it with --binary)")
    files = make_references.corpus_files(args.corpus)
    if not files:
        sys.exit(f"tokenizer_bench: no corpus files match {args.corpus}")
    if args.smoke:
        files, args.rounds = files[:3], 1
    texts = [make_references.read_text(p) for p in files]
    size = sum(len(t.encode("utf-8")) for t in texts)
    with tempfile.TemporaryDirectory(prefix="tokenizer-bench-") as folder:
        if args.tokenizer:
            paths = dict(item.split("=", 1) for item in args.tokenizer)
        else:
            paths = trained_tokenizers(files, folder)
        print(f"encoding {len(files)} files of {args.corpus} ({size / 1e6:.2f} MB), one thread, "
              f"best of {args.rounds} rounds, MB/s")
        print(f"{'tokenizer':16} {'tokens':>9} {'py encode':>10} {'py batch_fast':>14} "
              f"{'trainyard':>10} {'ratio':>7}")
        agreed = True
        for name, path in paths.items():
            tokens, python = python_figures(path, texts, args.rounds)
            our_tokens, ours = trainyard_figures(args.binary, path, files, args.rounds)
            fast = python.get("encode_batch_fast", float("nan"))
            print(f"{name:16} {tokens:9d} {python['encode']:10.2f} {fast:14.2f} {ours:10.2f} "
                  f"{ours / max(python.values()):7.2f}")
            if our_tokens != tokens:
                print(f"tokenizer_bench: {name}: trainyard made {our_tokens} tokens, Python "
                      f"{tokens}", file=sys.stderr)
                agreed = False
    sys.exit(0 if agreed else 1)


if __name__ == "__main__":
    main()
