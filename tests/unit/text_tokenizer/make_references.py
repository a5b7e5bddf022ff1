"""Tokenizer files and Python's ids for the `text` dataset's tokenizer tests in
tests/unit/token_shards_test.cpp, made with the venv's `tokenizers` and `sentencepiece`: nothing
here shares code with the C++ under test.

    make_references.py OUT CORPUS_FILE...

Trains, on the corpus files, a Llama 3-style byte-level BPE whose post-processor puts
<|begin_of_text|> before each text (OUT/bos.json), the same vocabulary with a template that also
puts <|end_of_text|> after it (OUT/bos_eos.json), and a SentencePiece BPE (OUT/spm.model). For
each, OUT/<name>.ids holds its vocabulary size on the first line and, on the second, the ids the
dataset must give: each file encoded as Python encodes it by default (tokenizers:
`encode(text).ids`, special tokens added; sentencepiece: `encode(text)`), in the order given."""

import os
import sys

MISSING = 77  # the exit status that tells the test the environment lacks something

try:
    import sentencepiece as spm
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
except ImportError as error:
    print(f"make_references: {error} (tools/setup --tests installs it)", file=sys.stderr)
    sys.exit(MISSING)

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def byte_level_bpe(texts):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=400, min_frequency=2, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.decoder = decoders.ByteLevel()
    return tok


def with_template(tok, single):
    special = [(token, tok.token_to_id(token)) for token in (BOS, EOS)]
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=True),
        processors.TemplateProcessing(single=single, special_tokens=special)])
    return tok


def write_ids(path, vocab_size, ids):
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{vocab_size}\n{' '.join(map(str, ids))}\n")


def main():
    out, files = sys.argv[1], sys.argv[2:]
    texts = []
    for path in files:
        with open(path, "rb") as f:
            texts.append(f.read().decode("utf-8"))

    trained = byte_level_bpe(texts)
    for name, single in [("bos", f"{BOS} $A"), ("bos_eos", f"{BOS} $A {EOS}")]:
        with_template(Tokenizer.from_str(trained.to_str()), single).save(
            os.path.join(out, f"{name}.json"))
        tok = Tokenizer.from_file(os.path.join(out, f"{name}.json"))
        ids = [i for text in texts for i in tok.encode(text).ids]
        write_ids(os.path.join(out, f"{name}.ids"), tok.get_vocab_size(with_added_tokens=True), ids)

    spm.SentencePieceTrainer.train(
        input=files, model_prefix=os.path.join(out, "spm"), vocab_size=120, model_type="bpe",
        character_coverage=1.0, hard_vocab_limit=False, num_threads=1, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(out, "spm.model"))
    write_ids(os.path.join(out, "spm.ids"), sp.get_piece_size(),
              [i for text in texts for i in sp.encode(text)])


if __name__ == "__main__":
    main()
