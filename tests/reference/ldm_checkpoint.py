#!/usr/bin/python3
"""An original Stable Diffusion checkpoint (the CompVis latent-diffusion layout, one
model.safetensors) made of a diffusers pipeline, and diffusers' own reading of it, the reference
of difftrain's (model/io/ldm_checkpoint.h):

    PYTHON tests/reference/ldm_checkpoint.py write PIPELINE OUT.safetensors [openclip|sdxl|refiner]

PYTHON is the interpreter tests/reference/diffusers_env.sh prints (diffusers 0.27.2).

PIPELINE is a StableDiffusionPipeline folder whose UNet and VAE the layout holds
(sd_pipeline.py make … ldm1|ldm2). OUT gets the UNet under model.diffusion_model.*, the VAE under
first_stage_model.* (its attention's q, k, v and proj_out as 1x1 convolutions, as the original
holds them) and the CLIP text model under cond_stage_model.transformer.* (SD 1.x's), or with
`openclip` as SD 2.x's OpenCLIP text model under cond_stage_model.model.* (each layer's q, k, v
as one in_proj, ln_1, ln_2, c_fc, c_proj, positional_embedding, ln_final, and a text_projection
[D, D] of random values, which a CLIPTextModel does not use), renamed here; OUT.yaml gets the
original config that says the same model. The file is then read back by diffusers'
StableDiffusionPipeline.from_single_file(OUT, original_config_file=OUT.yaml) (its
convert_ldm_unet_checkpoint and convert_ldm_vae_checkpoint), whose UNet and VAE must equal the
pipeline's tensor for tensor, and the OpenCLIP text model by diffusers'
create_text_encoder_from_open_clip_checkpoint, which must give the pipeline's text model: so
OUT is what diffusers takes for this pipeline. With `sdxl`, PIPELINE is a
StableDiffusionXLPipeline, written in SDXL's original (SGM) layout (write_sdxl); with
`refiner`, SDXL's refiner's pipeline (sd_pipeline.py make … ldmxl_refiner) in the refiner's.
Exit status: 0; 1 when diffusers reads back other weights; 2 for bad usage.
"""

import os
import sys

import safetensors.torch  # noqa: F401  (before diffusers)
import torch
import yaml
from diffusers import StableDiffusionPipeline
from safetensors.torch import save_file

RESNET = {"norm1": "in_layers.0", "conv1": "in_layers.2", "time_emb_proj": "emb_layers.1",
          "norm2": "out_layers.0", "conv2": "out_layers.3", "conv_shortcut": "skip_connection"}


def resnet(rest, names):
    head, _, tail = rest.partition(".")
    return f"{names.get(head, head)}.{tail}"


def unet_name(name, per_level, up_attends):
    """The original name of the diffusers UNet tensor `name`."""
    top = {"conv_in.": "input_blocks.0.0.", "time_embedding.linear_1.": "time_embed.0.",
           "time_embedding.linear_2.": "time_embed.2.", "conv_norm_out.": "out.0.",
           "conv_out.": "out.2.", "add_embedding.linear_1.": "label_emb.0.0.",
           "add_embedding.linear_2.": "label_emb.0.2."}
    for old, new in top.items():
        if name.startswith(old):
            return new + name[len(old):]
    parts = name.split(".")
    step = per_level + 1
    if parts[0] == "down_blocks":
        b, kind = int(parts[1]), parts[2]
        if kind == "downsamplers":
            return f"input_blocks.{(b + 1) * step}.0.op." + ".".join(parts[5:])
        block = 1 + b * step + int(parts[3])
        rest = ".".join(parts[4:])
        return (f"input_blocks.{block}.0." + resnet(rest, RESNET) if kind == "resnets"
                else f"input_blocks.{block}.1." + rest)
    if parts[0] == "mid_block":
        rest = ".".join(parts[3:])
        if parts[1] == "attentions":
            return "middle_block.1." + rest
        return f"middle_block.{2 * int(parts[2])}." + resnet(rest, RESNET)
    if parts[0] == "up_blocks":
        b, kind = int(parts[1]), parts[2]
        if kind == "upsamplers":
            return (f"output_blocks.{b * step + per_level}.{2 if b in up_attends else 1}.conv."
                    + ".".join(parts[5:]))
        block = b * step + int(parts[3])
        rest = ".".join(parts[4:])
        return (f"output_blocks.{block}.0." + resnet(rest, RESNET) if kind == "resnets"
                else f"output_blocks.{block}.1." + rest)
    raise ValueError(f"no original name for {name}")


def vae_name(name, levels):
    """The original name of the diffusers VAE tensor `name`."""
    coder, _, rest = name.partition(".")
    parts = rest.split(".")
    shortcut = {"conv_shortcut": "nin_shortcut"}
    if rest.startswith("conv_norm_out."):
        rest = "norm_out." + rest[len("conv_norm_out."):]
    elif parts[0] == "down_blocks":
        i = int(parts[1])
        rest = (f"down.{i}.block.{parts[3]}." + resnet(".".join(parts[4:]), shortcut)
                if parts[2] == "resnets" else f"down.{i}.downsample." + ".".join(parts[4:]))
    elif parts[0] == "up_blocks":
        i = levels - 1 - int(parts[1])
        rest = (f"up.{i}.block.{parts[3]}." + resnet(".".join(parts[4:]), shortcut)
                if parts[2] == "resnets" else f"up.{i}.upsample." + ".".join(parts[4:]))
    elif parts[0] == "mid_block" and parts[1] == "resnets":
        rest = f"mid.block_{int(parts[2]) + 1}." + resnet(".".join(parts[3:]), shortcut)
    elif parts[0] == "mid_block":
        layer = ".".join(parts[3:])
        for old, new in (("group_norm.", "norm."), ("to_q.", "q."), ("to_k.", "k."),
                         ("to_v.", "v."), ("to_out.0.", "proj_out.")):
            if layer.startswith(old):
                layer = new + layer[len(old):]
        rest = "mid.attn_1." + layer
    return f"{coder}.{rest}"


def original_config(pipeline):
    unet, vae = pipeline.unet.config, pipeline.vae.config
    channels = list(unet.block_out_channels)
    attends = [2 ** i for i, t in enumerate(unet.down_block_types) if t.startswith("CrossAttn")]
    params = {"image_size": unet.sample_size, "in_channels": unet.in_channels,
              "out_channels": unet.out_channels, "model_channels": channels[0],
              "attention_resolutions": attends, "num_res_blocks": unet.layers_per_block,
              "channel_mult": [c // channels[0] for c in channels],
              "use_spatial_transformer": True, "transformer_depth": 1,
              "context_dim": unet.cross_attention_dim, "legacy": False}
    if unet.use_linear_projection:
        params.update(num_head_channels=64, use_linear_in_transformer=True)
    else:
        params.update(num_heads=unet.attention_head_dim)
    ddconfig = {"double_z": True, "z_channels": vae.latent_channels, "resolution": 256,
                "in_channels": vae.in_channels, "out_ch": vae.out_channels,
                "ch": vae.block_out_channels[0],
                "ch_mult": [c // vae.block_out_channels[0] for c in vae.block_out_channels],
                "num_res_blocks": vae.layers_per_block, "attn_resolutions": [], "dropout": 0.0}
    return {"model": {
        "target": "ldm.models.diffusion.ddpm.LatentDiffusion",
        "params": {"linear_start": 0.00085, "linear_end": 0.012, "timesteps": 1000,
                   "scale_factor": vae.scaling_factor,
                   "unet_config": {"target": "ldm.modules.diffusionmodules.openaimodel.UNetModel",
                                   "params": params},
                   "first_stage_config": {"target": "ldm.models.autoencoder.AutoencoderKL",
                                          "params": {"embed_dim": vae.latent_channels,
                                                     "ddconfig": ddconfig}},
                   "cond_stage_config": {
                       "target": "ldm.modules.encoders.modules.FrozenCLIPEmbedder"}}}}


def open_clip(text_encoder):
    """The CLIP text model's tensors as OpenCLIP's text model names them: SD 2.x's (a
    CLIPTextModel: a text_projection of random values), SDXL's second (a
    CLIPTextModelWithProjection: its projection transposed)."""
    state = text_encoder.state_dict()
    hidden = text_encoder.config.hidden_size
    projection = state.get("text_projection.weight")
    tensors = {"token_embedding.weight": state["text_model.embeddings.token_embedding.weight"],
               "positional_embedding": state["text_model.embeddings.position_embedding.weight"],
               "ln_final.weight": state["text_model.final_layer_norm.weight"],
               "ln_final.bias": state["text_model.final_layer_norm.bias"],
               "text_projection": (torch.randn(hidden, hidden) if projection is None
                                   else projection.t())}
    for i in range(text_encoder.config.num_hidden_layers):
        layer, block = f"text_model.encoder.layers.{i}.", f"transformer.resblocks.{i}."
        for kind in ("weight", "bias"):
            tensors[block + f"attn.in_proj_{kind}"] = torch.cat(
                [state[layer + f"self_attn.{x}_proj.{kind}"] for x in "qkv"])
            for old, new in (("self_attn.out_proj", "attn.out_proj"), ("layer_norm1", "ln_1"),
                             ("layer_norm2", "ln_2"), ("mlp.fc1", "mlp.c_fc"),
                             ("mlp.fc2", "mlp.c_proj")):
                tensors[block + f"{new}.{kind}"] = state[layer + f"{old}.{kind}"]
    return tensors


def unet_and_vae(pipeline):
    """The pipeline's UNet and VAE under the original names."""
    unet = pipeline.unet.state_dict()
    per_level = pipeline.unet.config.layers_per_block
    up_attends = {b for b, t in enumerate(pipeline.unet.config.up_block_types)
                  if t.startswith("CrossAttn")}
    tensors = {"model.diffusion_model." + unet_name(k, per_level, up_attends): v
               for k, v in unet.items()}
    levels = len(pipeline.vae.config.block_out_channels)
    for k, v in pipeline.vae.state_dict().items():
        name = vae_name(k, levels)
        if ".mid.attn_1." in name and v.ndim == 2:
            v = v[:, :, None, None]  # 1x1 convolutions in the original
        tensors["first_stage_model." + name] = v
    return tensors


def same(what, want, got):
    """Whether the state dicts `want` and `got` are equal, tensor for tensor (else says so)."""
    if want.keys() != got.keys():
        print(f"{what}: diffusers reads back other tensors: {sorted(set(want) ^ set(got))[:5]}",
              file=sys.stderr)
        return False
    for k in want:
        if not torch.equal(want[k], got[k].to(want[k].dtype)):
            print(f"{what}: diffusers reads back another {k}", file=sys.stderr)
            return False
    return True


def write_sdxl(folder, out, refiner=False):
    """SDXL's original (SGM) layout: the UNet's addition embedding as label_emb.0, the text
    models under conditioner.embedders.0.transformer (CLIP) and .1.model (OpenCLIP); the
    refiner's (a StableDiffusionXLImg2ImgPipeline of text_encoder_2 alone) its OpenCLIP model
    under conditioner.embedders.0.model. Read back by diffusers' own conversions
    (convert_ldm_unet_checkpoint, convert_ldm_vae_checkpoint,
    create_text_encoder_from_ldm_clip_checkpoint, create_text_encoder_from_open_clip_checkpoint,
    the refiner's with its prefix) with the pipeline's configs, as from_single_file reads SDXL's
    file with SDXL's."""
    from diffusers import StableDiffusionXLImg2ImgPipeline, StableDiffusionXLPipeline
    from diffusers.loaders.single_file_utils import (
        convert_ldm_unet_checkpoint, convert_ldm_vae_checkpoint,
        create_text_encoder_from_ldm_clip_checkpoint,
        create_text_encoder_from_open_clip_checkpoint)
    # In the dtype the pipeline was saved in (SDXL ships float16).
    from safetensors import safe_open
    with safe_open(os.path.join(folder, "unet", "diffusion_pytorch_model.safetensors"),
                   "pt") as f:
        dtype = f.get_tensor(next(iter(f.keys()))).dtype
    pipeline_class = StableDiffusionXLImg2ImgPipeline if refiner else StableDiffusionXLPipeline
    pipeline = pipeline_class.from_pretrained(folder, torch_dtype=dtype)
    tensors = unet_and_vae(pipeline)
    second_prefix = "conditioner.embedders.0.model." if refiner else \
        "conditioner.embedders.1.model."
    if not refiner:
        for k, v in pipeline.text_encoder.state_dict().items():
            tensors["conditioner.embedders.0.transformer." + k] = v
    for k, v in open_clip(pipeline.text_encoder_2).items():
        tensors[second_prefix + k] = v
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    save_file(tensors, out)
    unet = convert_ldm_unet_checkpoint(tensors, dict(pipeline.unet.config))
    vae = convert_ldm_vae_checkpoint(tensors, dict(pipeline.vae.config))
    second = create_text_encoder_from_open_clip_checkpoint(
        os.path.join(folder, "text_encoder_2"), tensors, prefix=second_prefix,
        has_projection=True, local_files_only=True)
    if not (same("unet", pipeline.unet.state_dict(), unet)
            and same("vae", pipeline.vae.state_dict(), vae)
            and same("text_encoder_2", pipeline.text_encoder_2.state_dict(),
                     second.state_dict())):
        return 1
    if not refiner:
        first = create_text_encoder_from_ldm_clip_checkpoint(
            os.path.join(folder, "text_encoder"), tensors, local_files_only=True)
        if not same("text_encoder", pipeline.text_encoder.state_dict(), first.state_dict()):
            return 1
    print(f"wrote {out} ({len(tensors)} tensors); diffusers reads back the SDXL pipeline's "
          "UNet, VAE and text encoders")
    return 0


def write(folder, out, openclip=False):
    pipeline = StableDiffusionPipeline.from_pretrained(folder, safety_checker=None,
                                                       requires_safety_checker=False)
    unet = pipeline.unet.state_dict()
    levels = len(pipeline.vae.config.block_out_channels)
    tensors = unet_and_vae(pipeline)
    if openclip:
        for k, v in open_clip(pipeline.text_encoder).items():
            tensors["cond_stage_model.model." + k] = v
    else:
        for k, v in pipeline.text_encoder.state_dict().items():
            tensors["cond_stage_model.transformer." + k] = v
    save_file({k: v.contiguous() for k, v in tensors.items()}, out)
    config = out + ".yaml"
    with open(config, "w") as f:
        yaml.safe_dump(original_config(pipeline), f)
    read = StableDiffusionPipeline.from_single_file(
        out, original_config_file=config, image_size=pipeline.unet.config.sample_size * 2 ** (
            levels - 1), text_encoder=pipeline.text_encoder, tokenizer=pipeline.tokenizer,
        local_files_only=True)
    if not (same("unet", unet, read.unet.state_dict())
            and same("vae", pipeline.vae.state_dict(), read.vae.state_dict())):
        return 1
    if openclip:
        from diffusers.loaders.single_file_utils import \
            create_text_encoder_from_open_clip_checkpoint
        read_text = create_text_encoder_from_open_clip_checkpoint(
            os.path.join(folder, "text_encoder"), tensors, local_files_only=True).state_dict()
        want = pipeline.text_encoder.state_dict()
        if want.keys() != read_text.keys() or any(
                not torch.equal(want[k], read_text[k]) for k in want):
            print("text encoder: diffusers reads back another OpenCLIP text model",
                  file=sys.stderr)
            return 1
    for key in ("cross_attention_dim", "attention_head_dim", "use_linear_projection",
                "block_out_channels", "layers_per_block"):
        if read.unet.config[key] != pipeline.unet.config[key]:
            print(f"unet config {key}: {read.unet.config[key]} read back, "
                  f"{pipeline.unet.config[key]} written", file=sys.stderr)
            return 1
    print(f"wrote {out} ({len(tensors)} tensors); diffusers reads back the pipeline's UNet and VAE")
    return 0


def main(argv):
    if len(argv) == 5 and argv[1] == "write" and argv[4] in ("sdxl", "refiner"):
        return write_sdxl(argv[2], argv[3], refiner=argv[4] == "refiner")
    if len(argv) in (4, 5) and argv[1] == "write" and argv[4:] in ([], ["openclip"]):
        return write(argv[2], argv[3], len(argv) == 5)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
