#!/usr/bin/python3
"""transformers' text encoders on the CPU beside bench_text_encoder (bench/text_encoder.sh):

    PYTHON bench/text_encoder_torch.py save DIR     Stable Diffusion 1.x's text encoder
                                                    (CLIP ViT-L/14's text half: 12 layers,
                                                    768 features, 123.1 M parameters), random
                                                    weights (seed 0), in DIR/text_encoder, and
                                                    CLIP's tokenizer (open_clip's vocabulary) in
                                                    DIR/tokenizer
    PYTHON bench/text_encoder_torch.py time DIR LENGTH TEXTS REPEATS THREADS

`time` loads DIR as a tokenizer + model folder pair (CLIPTokenizer + CLIPTextModel for a
pipeline's folder, AutoTokenizer + AutoModel for MiniLM's) and prints the seconds to tokenize
and embed TEXTS prompts of LENGTH tokens, each run and the median, fp32, torch.no_grad,
THREADS intra-op threads: BERT with its attention mask, CLIP without (as diffusers calls it).
"""

import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "reference"))


def save(out):
    from transformers import CLIPTextConfig, CLIPTextModel
    from tokenizer_reference import make_clip
    import shutil
    make_clip(os.path.join(out, "vocab"))
    shutil.copytree(os.path.join(out, "vocab", "clip"), os.path.join(out, "tokenizer"))
    with open(os.path.join(out, "tokenizer", "tokenizer_config.json"), "w") as f:
        json.dump({"model_max_length": 77, "do_lower_case": True}, f)
    torch.manual_seed(0)
    model = CLIPTextModel(CLIPTextConfig(hidden_size=768, intermediate_size=3072,
                                         num_hidden_layers=12, num_attention_heads=12,
                                         projection_dim=768))
    model.save_pretrained(os.path.join(out, "text_encoder"), safe_serialization=True)


def time_it(folder, length, count, repeats, threads):
    from transformers import AutoModel, AutoTokenizer, CLIPTextModel, CLIPTokenizer
    torch.set_num_threads(threads)
    clip = os.path.isdir(os.path.join(folder, "text_encoder"))
    if clip:
        tokenizer = CLIPTokenizer.from_pretrained(os.path.join(folder, "tokenizer"))
        model = CLIPTextModel.from_pretrained(os.path.join(folder, "text_encoder")).eval()
    else:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModel.from_pretrained(folder).eval()
    texts = [f"a photograph of an astronaut riding a horse, number {k}" for k in range(count)]
    seconds = []
    with torch.no_grad():
        for r in range(repeats):
            t0 = time.perf_counter()
            batch = tokenizer(texts, padding="max_length", max_length=length, truncation=True,
                              return_tensors="pt")
            if clip:
                model(batch.input_ids)
            else:
                model(**batch)
            seconds.append(time.perf_counter() - t0)
            print(f"run {r}: {seconds[-1]:.4f} s")
    print(f"transformers {type(model).__name__}: {count} text(s) of {length} tokens in "
          f"{statistics.median(seconds):.4f} s (median of {repeats})")


def main(argv):
    if len(argv) == 3 and argv[1] == "save":
        save(argv[2])
    elif len(argv) == 7 and argv[1] == "time":
        time_it(argv[2], int(argv[3]), int(argv[4]), int(argv[5]), int(argv[6]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
