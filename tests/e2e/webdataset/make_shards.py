"""WebDataset shards for tests/e2e/webdataset_test.cpp, written into OUT:

  train-000000.tar .. train-000003.tar  4 shards of 50 samples: a 16x16 colour PNG each (pixels
                                        around its class's colour, so a model can learn them)
                                        under keys "shard<s>/<n>"; labels .cls in the first three
                                        shards, .json {"label": n} in the last; every fifth sample
                                        also has a .txt member, and in the first three shards a
                                        .json of metadata without a label: both ignored
  test-000000.tar                       20 samples as above
  bad/missing_cls.tar                   10 samples; key "bad/0003" has no label member
  bad/truncated.tar                     10 samples cut off inside the PNG of key "bad/0006"
  bad/bad_crc.tar                       10 samples; the PNG of key "bad/0004" has a damaged IDAT
                                        chunk (its CRC no longer matches)
  bad/out_of_range.tar                  10 samples; key "bad/0002" is labelled 9 (classes: 4)

Sample n of a shard has class n % 4."""

import io
import json
import sys
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

COLOURS = [(200, 40, 40), (40, 200, 40), (40, 40, 200), (200, 200, 40)]


def png(rng, label):
    pixels = np.clip(rng.normal(COLOURS[label], 30, (16, 16, 3)), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="PNG")
    return out.getvalue()


def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def write_shard(path, prefix, count, rng, json_labels=False, edit=None):
    """Writes `count` samples; `edit(n, members)` may change sample n's {extension: bytes}."""
    with tarfile.open(path, "w") as tar:
        for n in range(count):
            label = n % 4
            members = {"png": png(rng, label)}
            if json_labels:
                members["json"] = json.dumps({"label": label}).encode()
            else:
                members["cls"] = str(label).encode()
            if n % 5 == 0:
                members["txt"] = b"a caption the dataset does not read"
                if not json_labels:
                    members["json"] = json.dumps({"width": 16, "height": 16}).encode()
            if edit:
                edit(n, members)
            for extension, data in members.items():
                add(tar, f"{prefix}/{n:04d}.{extension}", data)


def damage_idat(data):
    at = data.index(b"IDAT") + 4 + 2
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]


def write_bad(out, rng):
    bad = out / "bad"
    bad.mkdir(parents=True, exist_ok=True)
    write_shard(bad / "missing_cls.tar", "bad", 10, rng,
                edit=lambda n, m: m.pop("cls") if n == 3 else None)
    write_shard(bad / "out_of_range.tar", "bad", 10, rng,
                edit=lambda n, m: m.update(cls=b"9") if n == 2 else None)

    def crc(n, members):
        if n == 4:
            members["png"] = damage_idat(members["png"])
    write_shard(bad / "bad_crc.tar", "bad", 10, rng, edit=crc)

    whole = bad / "whole.tar"
    write_shard(whole, "bad", 10, rng)
    with tarfile.open(whole) as tar:
        cut = next(m for m in tar.getmembers() if m.name == "bad/0006.png")
        end = cut.offset_data + cut.size // 2
    (bad / "truncated.tar").write_bytes(whole.read_bytes()[:end])
    whole.unlink()


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for s in range(4):
        write_shard(out / f"train-{s:06d}.tar", f"shard{s}", 50, rng, json_labels=(s == 3))
    write_shard(out / "test-000000.tar", "test", 20, rng)
    write_bad(out, rng)


if __name__ == "__main__":
    main()
