#!/usr/bin/python3
"""LoRA files in kohya's, peft's and diffusers' older key forms, and diffusers' reading of them
fused into a UNet: the reference of difftrain's FuseLora (model/io/lora.h).

    PYTHON tests/reference/lora.py unet UNET_DIR SEED
    PYTHON tests/reference/lora.py make UNET_DIR OUT_DIR SEED [TEXT_ENCODER_DIR]
    PYTHON tests/reference/lora.py fuse UNET_DIR LORA SCALE OUT.safetensors
    PYTHON tests/reference/lora.py sdxl PIPELINE_DIR OUT.safetensors SEED

PYTHON is the interpreter tests/reference/diffusers_env.sh prints (diffusers 0.27.2).

unet: a small UNet2DConditionModel (two levels, cross-attention of 12 features, 8x8 latents),
every parameter moved by 0.1 * N(0, 1), written by save_pretrained into UNET_DIR.
make: for the UNet2DConditionModel of UNET_DIR (its config.json), random LoRAs of every Linear
and Conv2d in its down, mid and up blocks (kohya's reach; 3x3 convolutions as LoCon: a 3x3
down, a 1x1 up), ranks 4 and 2 by turns, written as
  OUT_DIR/kohya.safetensors     lora_unet_….lora_down.weight / lora_up.weight (F16) and alpha
                                (1, 2 or 8 by turns)
  OUT_DIR/diffusers.safetensors the same converted by diffusers' own kohya conversion (its
                                attention processors' …processor.to_q_lora.down.weight and
                                …conv1.lora.down.weight forms), without alphas
  OUT_DIR/peft.safetensors      unet.MODULE.lora_A.weight / lora_B.weight (F32) of the same
                                modules plus conv_in and time_embedding.linear_1, no alphas
With TEXT_ENCODER_DIR (a CLIPTextModel folder), the kohya and peft files also adapt its
attention and MLP Linears (lora_te_…, text_encoder.…; rank 2, kohya's alpha 4 for all of
them: diffusers gives a text encoder's modules the alpha of their layer, not their own).
fuse: the UNet's weights with LORA's UNet part fused at SCALE into OUT.safetensors (F32, every parameter),
diffusers' way: the file read by LoraLoaderMixin.lora_state_dict (its kohya conversion), the
UNet's part converted by convert_unet_state_dict_to_peft (the names peft's layers take), each
module's weight W += SCALE · alpha/rank · B·A (peft's delta weight: over the flattened input
and kernel), alpha the file's where it has one, else the rank, in float64.
sdxl: a kohya LoRA of an SDXL pipeline (StableDiffusionXLPipeline's folder) as kohya's
sd-scripts name SDXL's modules, by the original (SGM) layout: lora_unet_input_blocks_4_1_
transformer_blocks_0_attn1_to_q, …_in_layers_2 (every Linear of the transformers and the
resnets' convolutions and time projections, ranks 4 and 2, alphas 1, 2 or 8 by turns, F16),
and lora_te1_/lora_te2_ of both text encoders' attention and MLP Linears (rank 2, alpha 4).
diffusers reads it back by its own SGM and kohya conversions (fuse_into with the UNet's config).
Exit status: 0, or 2 for bad usage.
"""

import os
import sys

import safetensors.torch  # noqa: F401  (before diffusers)
import torch
from diffusers import StableDiffusionPipeline, UNet2DConditionModel
from diffusers.loaders.lora_conversion_utils import _convert_kohya_lora_to_diffusers
from diffusers.utils.state_dict_utils import (convert_state_dict_to_peft,
                                              convert_unet_state_dict_to_peft)
from safetensors.torch import save_file
from transformers import CLIPTextModel

BLOCKS = ("down_blocks.", "mid_block.", "up_blocks.")


def adapted_modules(unet, everywhere):
    """The Linear and Conv2d modules a LoRA adapts, by name."""
    return [(name, module) for name, module in unet.named_modules()
            if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d))
            and (everywhere or name.startswith(BLOCKS))]


def random_pair(module, rank, generator):
    """A random LoRA (down, up) of MODULE at RANK, 0.3 · N(0, 1) each: a Linear's [rank, in] and
    [out, rank]; a convolution's down with its kernel and a 1×1 up (LoCon)."""
    if isinstance(module, torch.nn.Linear):
        down = torch.randn((rank, module.in_features), generator=generator)
        up = torch.randn((module.out_features, rank), generator=generator)
    else:
        kh, kw = module.kernel_size
        down = torch.randn((rank, module.in_channels, kh, kw), generator=generator)
        up = torch.randn((module.out_channels, rank, 1, 1), generator=generator)
    return 0.3 * down, 0.3 * up


def small_unet(unet_dir, seed):
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, block_out_channels=(8, 16),
        layers_per_block=1, attention_head_dim=2, norm_num_groups=4, cross_attention_dim=12,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))
    with torch.no_grad():
        for p in unet.parameters():
            p.add_(0.1 * torch.randn_like(p))
    unet.save_pretrained(unet_dir, safe_serialization=True)
    return 0


def make(unet_dir, out_dir, seed, text_encoder_dir=None):
    unet = UNet2DConditionModel.from_pretrained(unet_dir)
    generator = torch.Generator().manual_seed(seed)
    kohya, peft = {}, {}
    if text_encoder_dir:
        encoder = CLIPTextModel.from_pretrained(text_encoder_dir)
        for name, module in encoder.named_modules():
            if isinstance(module, torch.nn.Linear) and (".self_attn." in name or ".mlp." in name):
                down, up = random_pair(module, 2, generator)
                peft[f"text_encoder.{name}.lora_A.weight"] = down
                peft[f"text_encoder.{name}.lora_B.weight"] = up
                base = "lora_te_" + name.replace(".", "_")
                kohya[f"{base}.lora_down.weight"] = down.half()
                kohya[f"{base}.lora_up.weight"] = up.half()
                kohya[f"{base}.alpha"] = torch.tensor(4.0).half()
    for i, (name, module) in enumerate(adapted_modules(unet, everywhere=True)):
        down, up = random_pair(module, 4 if i % 2 == 0 else 2, generator)
        peft[f"unet.{name}.lora_A.weight"] = down
        peft[f"unet.{name}.lora_B.weight"] = up
        if name.startswith(BLOCKS):
            base = "lora_unet_" + name.replace(".", "_")
            kohya[f"{base}.lora_down.weight"] = down.half()
            kohya[f"{base}.lora_up.weight"] = up.half()
            kohya[f"{base}.alpha"] = torch.tensor((1.0, 2.0, 8.0)[i % 3]).half()
    converted, _ = _convert_kohya_lora_to_diffusers(
        {k: v for k, v in kohya.items() if k.startswith("lora_unet_")})
    os.makedirs(out_dir, exist_ok=True)
    save_file({k: v.contiguous() for k, v in kohya.items()}, os.path.join(out_dir, "kohya.safetensors"))
    save_file({k: v.contiguous() for k, v in converted.items()},
              os.path.join(out_dir, "diffusers.safetensors"))
    save_file({k: v.contiguous() for k, v in peft.items()}, os.path.join(out_dir, "peft.safetensors"))
    print(f"{len(kohya) // 3} kohya modules, {len(peft) // 2} peft modules in {out_dir}")
    return 0


def sgm_module(name, layers, up_attends):
    """SDXL's original (SGM) name of the diffusers UNet module NAME (of a resnet or a
    transformer), as kohya's sd-scripts spell SDXL's modules."""
    resnet = {"conv1": "in_layers.2", "time_emb_proj": "emb_layers.1", "conv2": "out_layers.3",
              "conv_shortcut": "skip_connection"}
    parts = name.split(".")
    if parts[0] == "mid_block":
        index = {"resnets.0": 0, "attentions.0": 1, "resnets.1": 2}[".".join(parts[1:3])]
        rest = parts[3:]
        return ".".join(["middle_block", str(index)] + ([resnet[rest[0]]] if parts[1] == "resnets"
                                                         else rest))
    block, kind, layer, rest = int(parts[1]), parts[2], int(parts[3]), parts[4:]
    inner = "0" if kind == "resnets" else "1"
    rest = [resnet[rest[0]]] if kind == "resnets" else rest
    if parts[0] == "down_blocks":
        return ".".join(["input_blocks", str(1 + block * (layers + 1) + layer), inner] + rest)
    return ".".join(["output_blocks", str(block * (layers + 1) + layer), inner] + rest)


def make_sdxl(pipeline_dir, out, seed):
    from transformers import CLIPTextModelWithProjection
    unet = UNet2DConditionModel.from_pretrained(os.path.join(pipeline_dir, "unet"))
    generator = torch.Generator().manual_seed(seed)
    kohya = {}
    for prefix, encoder in (("lora_te1_", CLIPTextModel.from_pretrained(
            os.path.join(pipeline_dir, "text_encoder"))), ("lora_te2_",
            CLIPTextModelWithProjection.from_pretrained(
                os.path.join(pipeline_dir, "text_encoder_2")))):
        for name, module in encoder.named_modules():
            if isinstance(module, torch.nn.Linear) and (".self_attn." in name or ".mlp." in name):
                base = prefix + name.replace(".", "_")
                down, up = random_pair(module, 2, generator)
                kohya[f"{base}.lora_down.weight"] = down.half()
                kohya[f"{base}.lora_up.weight"] = up.half()
                kohya[f"{base}.alpha"] = torch.tensor(4.0).half()
    up_attends = {i for i, t in enumerate(unet.config.up_block_types) if "CrossAttn" in t}
    modules = [(n, m) for n, m in adapted_modules(unet, everywhere=False)
               if ".resnets." in n or ".attentions." in n]
    for i, (name, module) in enumerate(modules):
        down, up = random_pair(module, 4 if i % 2 == 0 else 2, generator)
        base = "lora_unet_" + sgm_module(name, unet.config.layers_per_block, up_attends).replace(
            ".", "_")
        kohya[f"{base}.lora_down.weight"] = down.half()
        kohya[f"{base}.lora_up.weight"] = up.half()
        kohya[f"{base}.alpha"] = torch.tensor((1.0, 2.0, 8.0)[i % 3]).half()
    save_file({k: v.contiguous() for k, v in kohya.items()}, out)
    print(f"{len(kohya) // 3} kohya modules of an SDXL pipeline in {out}")
    return 0


def add_products(state_dict, lora_state, alpha_of, scale):
    """W += SCALE · alpha/rank · B·A (over the flattened input and kernel, peft's delta weight)
    in float64 for each module of the peft-named LORA_STATE, alpha_of(module, rank) its alpha;
    the number of modules."""
    modules = sorted({k.split(".lora_A.")[0] for k in lora_state if ".lora_A." in k})
    for module in modules:
        a = lora_state[f"{module}.lora_A.weight"].double()
        b = lora_state[f"{module}.lora_B.weight"].double()
        rank = b.shape[1]
        weight = state_dict[f"{module}.weight"]
        delta = (b.flatten(1) @ a.flatten(1)).reshape(weight.shape)
        state_dict[f"{module}.weight"] = \
            weight.double() + scale * alpha_of(module, rank) / rank * delta
    return len(modules)


def fuse_text_encoder(state_dict, lora, scale, prefix="text_encoder."):
    """Fuses LORA's text encoder part (PREFIX: SDXL's second is text_encoder_2.) at SCALE into
    the CLIPTextModel STATE_DICT (in place, float64); the number of modules."""
    lora_state, alphas = StableDiffusionPipeline.lora_state_dict(lora)
    lora_state = {k[len(prefix):]: v for k, v in lora_state.items() if k.startswith(prefix)}
    if not lora_state:
        return 0
    if not any("lora_A" in k for k in lora_state):
        lora_state = convert_state_dict_to_peft(lora_state)
    values = {v for k, v in (alphas or {}).items() if k.startswith(prefix)}
    assert len(values) <= 1, "diffusers takes one alpha for a text encoder's layer"
    alpha = values.pop() if values else None
    return add_products(state_dict, lora_state, lambda module, rank: alpha or rank, scale)


def fuse_into(state_dict, lora, scale, unet_config=None):
    """Fuses LORA's UNet part (a file) at SCALE into the UNet STATE_DICT (modified in place,
    float64); the number of modules. With UNET_CONFIG, kohya's SDXL names (the original layout's)
    are mapped as diffusers' SDXL pipeline maps them."""
    lora_state, alphas = StableDiffusionPipeline.lora_state_dict(lora, unet_config=unet_config)
    lora_state = {k: v for k, v in lora_state.items() if not k.startswith("text_encoder")}
    if any(k.startswith("unet.") for k in lora_state):
        lora_state = {k[len("unet."):]: v for k, v in lora_state.items() if k.startswith("unet.")}
    lora_state = convert_unet_state_dict_to_peft(lora_state)
    alphas = convert_unet_state_dict_to_peft(
        {k[len("unet."):]: v for k, v in (alphas or {}).items() if k.startswith("unet.")})
    # As diffusers' get_peft_kwargs names an alpha's module.
    module_alpha = {k.split(".lora_A.")[0].replace(".alpha", ""): v for k, v in alphas.items()}
    return add_products(state_dict, lora_state,
                        lambda module, rank: module_alpha.get(module, rank), scale)


def fuse(unet_dir, lora, scale, out):
    unet = UNet2DConditionModel.from_pretrained(unet_dir)
    state = {k: v.double() for k, v in unet.state_dict().items()}
    fused = fuse_into(state, lora, scale)
    save_file({k: v.float().contiguous() for k, v in state.items()}, out)
    print(f"fused {fused} modules of {lora}")
    return 0


def main(argv):
    if len(argv) == 4 and argv[1] == "unet":
        return small_unet(argv[2], int(argv[3]))
    if len(argv) in (5, 6) and argv[1] == "make":
        return make(argv[2], argv[3], int(argv[4]), argv[5] if len(argv) == 6 else None)
    if len(argv) == 5 and argv[1] == "sdxl":
        return make_sdxl(argv[2], argv[3], int(argv[4]))
    if len(argv) == 6 and argv[1] == "fuse":
        return fuse(argv[2], argv[3], float(argv[4]), argv[5])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
