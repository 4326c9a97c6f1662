#!/usr/bin/python3
"""diffusers' DiTPipeline and its Transformer2DModel as the reference of difftrain's DiT in
diffusers' form (`difftrain export --format diffusers` of a DiT, and `--pretrained` /
`checkpoint.init_from` of a DiTPipeline folder; model/io/diffusers_dit.h):

    PYTHON tests/reference/dit_pipeline.py make DIR SEED [untied]
    PYTHON tests/reference/dit_pipeline.py forward MODEL DUMP TOL
    PYTHON tests/reference/dit_pipeline.py run DIR OUT SETTINGS_JSON

PYTHON is the interpreter tests/reference/diffusers_env.sh prints (diffusers 0.27.2).

Where DiT's own code embeds a timestep with frequencies exp(-ln(10000) i / 128), diffusers'
DiT divides by 127 (Timesteps(downscale_freq_shift=1) in CombinedTimestepLabelEmbeddings), so
diffusers' DiTPipeline does not compute DiT's function of the same weights. `forward` and `run`
set every block's downscale_freq_shift to 0, DiT's, to compare the rest exactly; `forward` also
prints how far diffusers' own setting lands.

make: a DiTPipeline of a small Transformer2DModel as DiT's conversion configures one (adaLN-Zero,
patch 2, GELU (tanh), a learned sigma, 1000 classes and the null class, LayerNorm eps 1e-6), every
parameter moved by 0.1 * N(0, 1) from its initialisation and every block's timestep and class
embedders then made block 0's (as a converted DiT's are: DiT has one), a small AutoencoderKL, and
DiT's DDIMScheduler (linear betas 1e-4 to 0.02, no clipping); saved by save_pretrained, with the
ImageNet names of classes 0, 3 and 7 written into model_index.json's id2label as the hub's DiT
pipelines have them. With
`untied`, the blocks' embedders are left apart, as a model trained in diffusers may have them.

forward: MODEL's transformer/ on a `difftrain debug-dump` file's x_t, t and y: exit 1 if its
output is further than TOL (relative L2) from the dump's.

run: SETTINGS_JSON holds classes (or labels: names, DiTPipeline.get_label_ids's), guidance,
steps and seed; the pipeline is called with
latents N(0, 1) [len(classes), 4, h, w] (seeded; its own draw replaced). OUT:
  noise    the latents x_T it started from
  latents  the final latents
  decoded  vae.decode(latents / scaling_factor).sample, as the pipeline decodes them
"""

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402

import diffusers.pipelines.dit.pipeline_dit as pipeline_dit  # noqa: E402
from diffusers import AutoencoderKL, DDIMScheduler, DiTPipeline, Transformer2DModel  # noqa: E402

EMBEDDERS = "norm1.emb."
ID2LABEL = {"0": "tench, Tinca tinca", "3": "tiger shark, Galeocerdo cuvieri", "7": "cock"}


def dit_shift(transformer):
    for block in transformer.transformer_blocks:
        block.norm1.emb.time_proj.downscale_freq_shift = 0


def make(folder, seed, untied):
    torch.manual_seed(seed)
    transformer = Transformer2DModel(
        num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=8,
        num_layers=2, patch_size=2, sample_size=8, attention_bias=True,
        activation_fn="gelu-approximate", num_embeds_ada_norm=1000, norm_type="ada_norm_zero",
        norm_elementwise_affine=False, norm_eps=1e-6)
    with torch.no_grad():
        for p in transformer.parameters():
            p.add_(0.1 * torch.randn_like(p))
        if not untied:
            first = transformer.transformer_blocks[0].norm1.emb.state_dict()
            for block in transformer.transformer_blocks[1:]:
                block.norm1.emb.load_state_dict(first)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(4, 8), norm_num_groups=2)
    with torch.no_grad():
        for p in vae.parameters():
            p.add_(0.1 * torch.randn_like(p))
    scheduler = DDIMScheduler(beta_start=0.0001, beta_end=0.02, beta_schedule="linear",
                              clip_sample=False)
    DiTPipeline(transformer=transformer, vae=vae, scheduler=scheduler).save_pretrained(
        folder, safe_serialization=True)
    # ImageNet's names of a few classes, as facebook/DiT-XL-2-256's model_index.json has them
    # (save_pretrained does not keep DiTPipeline's id2label).
    index_path = os.path.join(folder, "model_index.json")
    with open(index_path) as f:
        index = json.load(f)
    index["id2label"] = ID2LABEL
    with open(index_path, "w") as f:
        json.dump(index, f, indent=2)
    print(f"saved the DiT pipeline to {folder}")
    return 0


def forward(model, dump, tol):
    tensors = safetensors_np.read(dump)
    tensors = tensors[0] if isinstance(tensors, tuple) else tensors
    transformer = Transformer2DModel.from_pretrained(os.path.join(model, "transformer"))
    transformer = transformer.double().eval()
    x = torch.from_numpy(tensors["input.x_t"]).double()
    t = torch.from_numpy(tensors["input.t"])
    y = torch.from_numpy(tensors["input.y"])
    want = tensors["output"].astype(np.float64)

    def error():
        with torch.no_grad():
            got = transformer(x, timestep=t, class_labels=y).sample.numpy()
        return np.linalg.norm(got - want) / np.linalg.norm(want)

    as_diffusers = error()
    dit_shift(transformer)
    as_dit = error()
    print(f"relative L2: {as_dit:.3g} with DiT's timestep frequencies, {as_diffusers:.3g} with "
          "diffusers' own (downscale_freq_shift 1)")
    return 0 if as_dit <= tol else 1


def run(folder, out, settings_path):
    with open(settings_path) as f:
        settings = json.load(f)
    pipeline = DiTPipeline.from_pretrained(folder)
    pipeline.set_progress_bar_config(disable=True)
    transformer = pipeline.transformer
    dit_shift(transformer)
    classes = settings["classes"]
    if settings.get("labels"):  # names, as DiTPipeline reads its id2label
        classes = pipeline.get_label_ids(settings["labels"])
        print(f"labels {settings['labels']} are classes {classes}")
    side = transformer.config.sample_size
    generator = torch.Generator().manual_seed(settings["seed"])
    noise = torch.randn((len(classes), transformer.config.in_channels, side, side),
                        generator=generator)
    pipeline_dit.randn_tensor = lambda *args, **kwargs: noise.clone()
    seen = {}
    decode = pipeline.vae.decode

    def recorded(z, *args, **kwargs):
        seen["latents"] = z * pipeline.vae.config.scaling_factor
        result = decode(z, *args, **kwargs)
        seen["decoded"] = result.sample
        return result

    pipeline.vae.decode = recorded
    with torch.no_grad():
        pipeline(class_labels=classes, guidance_scale=settings["guidance"],
                 num_inference_steps=settings["steps"], output_type="np")
    safetensors_np.write(out, {
        "noise": noise.numpy().astype(np.float32),
        "latents": seen["latents"].numpy().astype(np.float32),
        "decoded": seen["decoded"].numpy().astype(np.float32),
    })
    print(f"wrote {out}")
    return 0


def main(argv):
    if len(argv) >= 3 and argv[0] == "make":
        return make(argv[1], int(argv[2]), len(argv) > 3 and argv[3] == "untied")
    if len(argv) == 4 and argv[0] == "forward":
        return forward(argv[1], argv[2], float(argv[3]))
    if len(argv) == 4 and argv[0] == "run":
        return run(argv[1], argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
