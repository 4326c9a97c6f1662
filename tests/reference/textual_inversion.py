#!/usr/bin/python3
"""diffusers' textual inversion (examples/textual_inversion/textual_inversion.py of diffusers
0.27.2): the reference of difftrain's (model/train/textual_inversion.h).

    PYTHON tests/reference/textual_inversion.py step PIPELINE_DIR STEP.safetensors OUT.safetensors
    PYTHON tests/reference/textual_inversion.py load PIPELINE_DIR LEARNED.safetensors VECTORS.safetensors

PYTHON is the interpreter tests/reference/diffusers_env.sh prints (diffusers 0.27.2).

step: one training step of the script on a Stable Diffusion pipeline's tokenizer, text encoder
and UNet, in float64. STEP.safetensors (difftrain's) holds the step's x_t [B, C, H, W],
timesteps t [B], regression target [B, C, H, W] and token ids [B, L] (F32), and in its metadata
the token, the initializer token, the vector count, the data's captions ("captions", a JSON
list) and AdamW's lr, betas, eps and weight decay. As the script: the tokens token, token_1, ... are
added to the tokenizer, the text encoder's embeddings resized and the new rows set to the
initializer's; each caption (its token spelled as all the tokens, as the script's
placeholder_token string) tokenized to 77 ids, each of STEP's texts one of them; the loss
F.mse_loss(unet(x_t, t, text_encoder(ids)[0]).sample, target) backward; AdamW (torch's, on
the embedding matrix) steps once. OUT.safetensors: the loss, the new rows' gradient
"grad" [n, D] and their values after the step "updated" [n, D].
load: StableDiffusionPipeline.from_pretrained(PIPELINE_DIR).load_textual_inversion(LEARNED)
(diffusers' own loader of the script's learned_embeds.safetensors); prints the token and its
rows, and fails unless they are VECTORS.safetensors' "vectors" [n, D].
Exit status: 0, 1 for a mismatch, or 2 for bad usage.
"""

import json
import os
import sys

import safetensors.torch  # noqa: F401  (before diffusers)
import torch
import torch.nn.functional as F
from diffusers import StableDiffusionPipeline, UNet2DConditionModel
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import CLIPTextModel, CLIPTokenizer


def step(pipeline, step_path, out):
    torch.set_default_dtype(torch.float64)
    tensors = load_file(step_path)
    with safe_open(step_path, "pt") as f:
        meta = f.metadata()
    token, initializer = meta["token"], meta["initializer_token"]
    vectors = int(meta["vectors"])
    tokenizer = CLIPTokenizer.from_pretrained(os.path.join(pipeline, "tokenizer"))
    text_encoder = CLIPTextModel.from_pretrained(os.path.join(pipeline, "text_encoder"))
    unet = UNet2DConditionModel.from_pretrained(os.path.join(pipeline, "unet"))
    # The script's set-up of the tokens.
    placeholder_tokens = [token] + [f"{token}_{i}" for i in range(1, vectors)]
    if tokenizer.add_tokens(placeholder_tokens) != vectors:
        print(f"the tokenizer already holds {token}", file=sys.stderr)
        return 1
    initializer_ids = tokenizer.encode(initializer, add_special_tokens=False)
    if len(initializer_ids) != 1:
        print(f"the initializer {initializer} is {len(initializer_ids)} tokens", file=sys.stderr)
        return 1
    placeholder_ids = tokenizer.convert_tokens_to_ids(placeholder_tokens)
    text_encoder.resize_token_embeddings(len(tokenizer))
    embeddings = text_encoder.get_input_embeddings()
    with torch.no_grad():
        for i in placeholder_ids:
            embeddings.weight[i] = embeddings.weight[initializer_ids[0]].clone()
    text_encoder, unet = text_encoder.double(), unet.double()
    unet.requires_grad_(False)
    text_encoder.text_model.encoder.requires_grad_(False)
    text_encoder.text_model.final_layer_norm.requires_grad_(False)
    text_encoder.text_model.embeddings.position_embedding.requires_grad_(False)
    # Each caption as the script makes a text: the token spelled as all of them. Each of
    # difftrain's texts must be one of them, token for token.
    spelled = " ".join(placeholder_tokens)
    captions = [t.replace(token, spelled) for t in json.loads(meta["captions"])]
    tokenized = tokenizer(captions, padding="max_length", truncation=True,
                          max_length=tokenizer.model_max_length, return_tensors="pt").input_ids
    ids = tensors["ids"].round().long()
    for row in ids:
        if not any(torch.equal(row, t) for t in tokenized):
            print(f"difftrain's ids {row.tolist()} are none of the captions' {tokenized.tolist()}",
                  file=sys.stderr)
            return 1
    optimizer = torch.optim.AdamW(embeddings.parameters(), lr=float(meta["lr"]),
                                  betas=(float(meta["beta1"]), float(meta["beta2"])),
                                  weight_decay=float(meta["weight_decay"]),
                                  eps=float(meta["eps"]))
    context = text_encoder(ids)[0]
    pred = unet(tensors["x_t"].double(), tensors["t"].double(), context).sample
    loss = F.mse_loss(pred, tensors["target"].double(), reduction="mean")
    loss.backward()
    grad = embeddings.weight.grad[placeholder_ids].clone()
    optimizer.step()
    updated = embeddings.weight.detach()[placeholder_ids].clone()
    save_file({"loss": loss.detach().reshape(1), "grad": grad, "updated": updated}, out)
    print(f"loss {loss.item():.6f}; |grad| {grad.norm().item():.6g}")
    return 0


def load(pipeline_dir, learned, vectors_path):
    pipeline = StableDiffusionPipeline.from_pretrained(pipeline_dir, safety_checker=None,
                                                       requires_safety_checker=False)
    file = load_file(learned)
    if len(file) != 1:
        print(f"{learned} holds {len(file)} tensors, not one", file=sys.stderr)
        return 1
    token = next(iter(file))
    pipeline.load_textual_inversion(learned)
    expected = load_file(vectors_path)["vectors"]
    tokens = [token] + [f"{token}_{i}" for i in range(1, expected.shape[0])]
    ids = pipeline.tokenizer.convert_tokens_to_ids(tokens)
    rows = pipeline.text_encoder.get_input_embeddings().weight.detach()[ids]
    print(f"{token}: ids {ids}, rows {tuple(rows.shape)}")
    if not torch.equal(rows, expected.to(rows.dtype)):
        print(f"rows differ: {rows} against {expected}", file=sys.stderr)
        return 1
    return 0


def main(argv):
    if len(argv) == 5 and argv[1] == "step":
        return step(argv[2], argv[3], argv[4])
    if len(argv) == 5 and argv[1] == "load":
        return load(argv[2], argv[3], argv[4])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
