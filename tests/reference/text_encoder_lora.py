#!/usr/bin/python3
"""diffusers' DreamBooth LoRA with the text encoder trained too (examples/dreambooth/
train_dreambooth_lora.py of diffusers 0.27.2, --train_text_encoder) and diffusers' loading of
its LoRA file: the reference of difftrain's LoRA training of a UNet and its CLIP text encoder.

    PYTHON tests/reference/text_encoder_lora.py step PIPELINE_DIR STEP.safetensors OUT.safetensors
    PYTHON tests/reference/text_encoder_lora.py load PIPELINE_DIR LORA.safetensors OUT.safetensors

PYTHON is the interpreter tests/reference/peft_env.sh prints (diffusers 0.27.2, transformers
4.40.2, peft 0.10.0).

step: the script's training of the UNet's and the text encoder's adapters, in float64. The
CLIPTextModel of PIPELINE_DIR/text_encoder and the UNet2DConditionModel of PIPELINE_DIR/unet,
frozen, get peft's adapters as the script adds them: add_adapter(LoraConfig(r=rank,
lora_alpha=alpha, init_lora_weights="gaussian", use_dora=..., target_modules=...)), the UNet's
with unet_targets, the text encoder's with text_targets. STEP.safetensors (difftrain's) holds
the batch, x_t [B, C, H, W], timesteps t [B], regression target [B, C, H, W] and token ids [B,
L] (F32), and every adapter tensor's value before the first step, in peft's shapes (A [r, in], B
[out, r]; with DoRA also each module's magnitudes [out], M.lora_magnitude_vector):
unet.M.lora_A.weight and unet.M.lora_B.weight for each adapted module M of the UNet (e.g.
down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q), text_encoder.M.lora_A.weight and
text_encoder.M.lora_B.weight for each of the text encoder (e.g.
text_model.encoder.layers.0.self_attn.q_proj). Its metadata: rank, alpha, use_dora ("true" for
peft's use_dora=True on both models; absent: LoRA), unet_targets and text_targets (JSON lists),
AdamW's lr, beta1, beta2, eps and weight_decay, and steps. The adapters peft made must be
STEP's, name for name and shape for shape; they take STEP's values and are all that is trained,
by one torch AdamW over both models' adapters. Each of the steps, on the same batch: gradients
zeroed; loss F.mse_loss(unet(x_t, t, text_encoder(ids)[0]).sample, target) backward; AdamW
steps. Left out: the script's gradient clipping (max_grad_norm, 1.0 by default) and its loss in
float32 (model_pred.float()). OUT.safetensors: "loss" [steps], each step's loss; "grad.NAME",
the last step's gradient of STEP's adapter tensor NAME; "NAME", its value after the steps.
load: StableDiffusionPipeline.from_pretrained(PIPELINE_DIR), load_lora_weights(LORA) and
fuse_lora() (in 0.27.2 it fuses the UNet's and the text encoder's adapters, at scale 1: W0 +
alpha/r · B·A, alpha a kohya file's alphas, else r: the script's and peft's names carry no
alpha, and diffusers refuses a key without "lora" in it, such as unet.M.alpha). OUT holds every
weight of the UNet and the text encoder the fusing changed, as unet.M.weight and
text_encoder.M.weight (F32). It fails when diffusers refuses the file or leaves any of its
tensors unused (a key that names no adapter, or has neither prefix unet. nor text_encoder.).
diffusers takes the script's names (unet.M.lora.down.weight / lora.up.weight,
text_encoder.M.lora_linear_layer.down.weight / up.weight) and peft's (unet.M.lora_A.weight /
lora_B.weight, text_encoder.M.lora_A.weight / lora_B.weight), but a text encoder's part only
when it adapts the out_proj of every layer, and fc1 and fc2 of every layer when it adapts any MLP.
Exit status: 0, 1 for a mismatch, or 2 for bad usage.
"""

import json
import os
import re
import sys

import safetensors.torch  # noqa: F401  (before diffusers)
import torch
import torch.nn.functional as F
from diffusers import StableDiffusionPipeline, UNet2DConditionModel
from diffusers.utils.state_dict_utils import (convert_state_dict_to_diffusers,
                                              convert_state_dict_to_peft,
                                              convert_unet_state_dict_to_peft)
from peft import LoraConfig
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import CLIPTextModel

ADAPTER = re.compile(r"\.(lora_[AB])\.[^.]+\.weight$")
MAGNITUDE = re.compile(r"\.lora_magnitude_vector\.[^.]+$")


def adapter_parameters(model, prefix):
    """The model's LoRA parameters by STEP's names: prefix.M.lora_A.weight, and DoRA's
    prefix.M.lora_magnitude_vector (peft's adapter name dropped)."""
    found = {}
    for name, param in model.named_parameters():
        match = ADAPTER.search(name)
        if match:
            found[f"{prefix}.{name[:match.start()]}.{match.group(1)}.weight"] = param
        match = MAGNITUDE.search(name)
        if match:
            found[f"{prefix}.{name[:match.start()]}.lora_magnitude_vector"] = param
    return found


def step(pipeline, step_path, out):
    torch.set_default_dtype(torch.float64)
    tensors = load_file(step_path)
    with safe_open(step_path, "pt") as f:
        meta = f.metadata()
    rank = int(meta["rank"])
    alpha = float(meta["alpha"])
    alpha = int(alpha) if alpha.is_integer() else alpha
    steps = int(meta["steps"])
    dora = meta.get("use_dora") == "true"
    text_encoder = CLIPTextModel.from_pretrained(os.path.join(pipeline, "text_encoder")).double()
    unet = UNet2DConditionModel.from_pretrained(os.path.join(pipeline, "unet")).double()
    text_encoder.requires_grad_(False)
    unet.requires_grad_(False)
    # The script's adapters.
    unet.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights="gaussian",
                                use_dora=dora, target_modules=json.loads(meta["unet_targets"])))
    text_encoder.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights="gaussian",
                                        use_dora=dora,
                                        target_modules=json.loads(meta["text_targets"])))
    params = {**adapter_parameters(unet, "unet"),
              **adapter_parameters(text_encoder, "text_encoder")}
    given = {k for k in tensors if k.startswith(("unet.", "text_encoder."))}
    if set(params) != given:
        print(f"peft's adapters and STEP's differ: only peft's {sorted(set(params) - given)}, "
              f"only STEP's {sorted(given - set(params))}", file=sys.stderr)
        return 1
    for name, param in params.items():
        if tuple(param.shape) != tuple(tensors[name].shape):
            print(f"{name}: peft's shape {tuple(param.shape)}, STEP's "
                  f"{tuple(tensors[name].shape)}", file=sys.stderr)
            return 1
        param.data = tensors[name].to(torch.float64).clone()
        param.requires_grad_(True)
    trained = {id(p) for p in params.values()}
    others = [n for model in (unet, text_encoder) for n, p in model.named_parameters()
              if p.requires_grad and id(p) not in trained]
    if others:
        print(f"trainable beyond the adapters: {others}", file=sys.stderr)
        return 1
    unet.train()
    text_encoder.train()
    optimizer = torch.optim.AdamW(list(params.values()), lr=float(meta["lr"]),
                                  betas=(float(meta["beta1"]), float(meta["beta2"])),
                                  eps=float(meta["eps"]),
                                  weight_decay=float(meta["weight_decay"]))
    x_t, t = tensors["x_t"].double(), tensors["t"].double()
    target, ids = tensors["target"].double(), tensors["ids"].round().long()
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        context = text_encoder(ids)[0]
        pred = unet(x_t, t, context).sample
        loss = F.mse_loss(pred, target, reduction="mean")
        loss.backward()
        grads = {name: p.grad.detach().clone() for name, p in params.items()}
        optimizer.step()
        losses.append(loss.item())
    result = {"loss": torch.tensor(losses, dtype=torch.float64)}
    for name, p in params.items():
        result[f"grad.{name}"] = grads[name].contiguous()
        result[name] = p.detach().clone().contiguous()
    save_file(result, out)
    units = sum(k.startswith("unet.") for k in params)
    grad_norm = torch.cat([g.flatten() for g in grads.values()]).norm().item()
    print(f"{steps} steps of {units} UNet and {len(params) - units} text encoder adapter tensors "
          f"(rank {rank}, alpha {alpha}): loss {losses[0]:.6f} -> {losses[-1]:.6f}; last "
          f"|grad| {grad_norm:.6g}")
    return 0


def unused_tensors(pipeline, lora):
    """LORA's tensors that load_lora_weights leaves unused, by diffusers' own reading of the
    file (lora_state_dict, its kohya conversion) and its conversions to peft's names, against
    the adapters it made; or the adapters' tensors LORA leaves unset."""
    state, _ = StableDiffusionPipeline.lora_state_dict(lora)
    problems = [f"{k}: none of the UNet's or the text encoder's" for k in state
                if not k.startswith(("unet.", "text_encoder."))]
    unet = {k[len("unet."):]: v for k, v in state.items() if k.startswith("unet.")}
    text = {k[len("text_encoder."):]: v for k, v in state.items() if k.startswith("text_encoder.")}
    expected = {}
    if unet:
        expected.update({f"unet.{k}": v for k, v in convert_unet_state_dict_to_peft(unet).items()})
    if text:
        text = convert_state_dict_to_peft(convert_state_dict_to_diffusers(text))
        expected.update({f"text_encoder.{k}": v for k, v in text.items()})
    loaded = {**adapter_parameters(pipeline.unet, "unet"),
              **adapter_parameters(pipeline.text_encoder, "text_encoder")}
    for name, value in sorted(expected.items()):
        if name not in loaded:
            problems.append(f"{name}: no such adapter")
        elif not torch.equal(loaded[name].detach(), value.to(loaded[name].dtype)):
            problems.append(f"{name}: the adapter does not hold the file's value")
    problems += [f"{name}: not in the file" for name in sorted(set(loaded) - set(expected))]
    return problems


def load(pipeline_dir, lora, out):
    pipeline = StableDiffusionPipeline.from_pretrained(pipeline_dir, safety_checker=None,
                                                       requires_safety_checker=False)
    before = {}
    for prefix, model in (("unet", pipeline.unet), ("text_encoder", pipeline.text_encoder)):
        for name, value in model.state_dict().items():
            if name.endswith(".weight"):
                before[f"{prefix}.{name}"] = value.detach().clone()
    try:
        pipeline.load_lora_weights(lora)
    except (KeyError, ValueError, RuntimeError) as e:
        print(f"diffusers refuses {lora}: {type(e).__name__} {e}", file=sys.stderr)
        return 1
    problems = unused_tensors(pipeline, lora)
    if problems:
        print("\n".join(["diffusers does not take the file as it is:"] + problems), file=sys.stderr)
        return 1
    pipeline.fuse_lora()
    fused = {}
    for prefix, model in (("unet", pipeline.unet), ("text_encoder", pipeline.text_encoder)):
        for name, value in model.state_dict().items():
            if "lora_" in name or not name.endswith(".weight"):
                continue
            key = f"{prefix}.{name.replace('.base_layer.', '.')}"
            if key not in before:
                print(f"{key}: a weight the pipeline did not have", file=sys.stderr)
                return 1
            if not torch.equal(value, before[key]):
                fused[key] = value.detach().float().contiguous()
    save_file(fused, out)
    units = sum(k.startswith("unet.") for k in fused)
    print(f"fused {lora}: {units} UNet and {len(fused) - units} text encoder weights changed")
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
