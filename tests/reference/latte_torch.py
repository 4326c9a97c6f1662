"""An independent PyTorch Latte (Ma et al., Vchitect/Latte models/latte.py, the
class-conditional and unconditional video model), the reference the C++ Latte is checked
against.

Written from the architecture: DiT's layers (dit_torch: patch embedding, timestep and label
embedders, adaLN-Zero blocks, final layer) over a video [B, F, C, H, W] whose frames are
folded into the batch. Blocks alternate: block 2k is spatial (a batch of B*F frames, each a
sequence of H/p * W/p tokens), block 2k+1 temporal (a batch of B*T token positions, each a
sequence of F frames). The fixed 1-D sin-cos temporal embedding is added once, just before
the first temporal block. The condition c (timestep embedding plus label embedding) is
repeated for every frame of a spatial block and every token of a temporal one, and the
final layer takes the per-frame condition. State-dict names are DiT's plus `temp_embed`; an
unconditional model (num_classes 0) has no y_embedder.
"""

import dataclasses

import torch
from torch import nn

import dit_torch


@dataclasses.dataclass(frozen=True)
class LatteConfig(dit_torch.DiTConfig):
    """DiT's constructor arguments plus the frames of a video; names match the debug dump's
    config JSON."""
    num_frames: int = 16


# Latte's named models share DiT's sizes: "Latte-XL/2" etc.
LATTE_CONFIGS = {
    name.replace("DiT-", "Latte-"): LatteConfig(**dataclasses.asdict(cfg))
    for name, cfg in dit_torch.DIT_CONFIGS.items()
}


def get_1d_sincos_temp_embed(embed_dim, length):
    """[length, embed_dim] float64: frame f is [sin(f * omega), cos(f * omega)]."""
    import numpy as np
    return dit_torch.get_1d_sincos_pos_embed_from_grid(embed_dim, np.arange(length, dtype=np.float64))


class Latte(nn.Module):
    def __init__(self, cfg, device=None, dtype=None):
        super().__init__()
        assert cfg.depth % 2 == 0, "Latte's blocks come in (spatial, temporal) pairs"
        factory = {"device": device, "dtype": dtype}
        self.cfg = cfg
        self.x_embedder = dit_torch.PatchEmbed(cfg, **factory)
        self.t_embedder = dit_torch.TimestepEmbedder(cfg.hidden_size, **factory)
        if cfg.num_classes > 0:
            self.y_embedder = dit_torch.LabelEmbedder(cfg.num_classes, cfg.hidden_size,
                                                      cfg.class_dropout_prob, **factory)
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.num_patches, cfg.hidden_size, **factory),
                                      requires_grad=False)
        self.temp_embed = nn.Parameter(torch.zeros(1, cfg.num_frames, cfg.hidden_size, **factory),
                                       requires_grad=False)
        self.blocks = nn.ModuleList([dit_torch.DiTBlock(cfg, **factory) for _ in range(cfg.depth)])
        self.final_layer = dit_torch.FinalLayer(cfg, **factory)
        if device != "meta":
            grid = int(cfg.num_patches ** 0.5)
            self.pos_embed.data.copy_(torch.from_numpy(
                dit_torch.get_2d_sincos_pos_embed(cfg.hidden_size, grid)).unsqueeze(0))
            self.temp_embed.data.copy_(torch.from_numpy(
                get_1d_sincos_temp_embed(cfg.hidden_size, cfg.num_frames)).unsqueeze(0))

    def unpatchify(self, x):
        """[N, T, p*p*c] -> [N, c, H, W] (DiT's)."""
        c, p = self.cfg.out_channels, self.cfg.patch_size
        h = w = int(x.shape[1] ** 0.5)
        x = torch.einsum("nhwpqc->nchpwq", x.reshape(x.shape[0], h, w, p, p, c))
        return x.reshape(x.shape[0], c, h * p, w * p)

    def forward(self, x, t, y=None):
        """x: [B, F, C, H, W] noised latents, t: [B] timesteps, y: [B] labels (after dropout)."""
        b, f = x.shape[:2]
        x = self.x_embedder(x.reshape(b * f, *x.shape[2:])) + self.pos_embed  # [(b f), T, D]
        T, D = x.shape[1], x.shape[2]
        c = self.t_embedder(t)
        if self.cfg.num_classes > 0:
            c = c + self.y_embedder(y)
        c_spatial = c.repeat_interleave(f, dim=0)  # 'n d -> (n f) d'
        c_temporal = c.repeat_interleave(T, dim=0)  # 'n d -> (n t) d'
        for i in range(0, len(self.blocks), 2):
            x = self.blocks[i](x, c_spatial)
            x = x.reshape(b, f, T, D).transpose(1, 2).reshape(b * T, f, D)  # (b f) t d -> (b t) f d
            if i == 0:
                x = x + self.temp_embed
            x = self.blocks[i + 1](x, c_temporal)
            x = x.reshape(b, T, f, D).transpose(1, 2).reshape(b * f, T, D)  # (b t) f d -> (b f) t d
        x = self.unpatchify(self.final_layer(x, c_spatial))
        return x.reshape(b, f, *x.shape[1:])


def epsilon_mse_loss(output, noise):
    """The debug dump's loss: the mean of (output[:, :, :C] - noise)^2 over every element, the
    predicted-noise channels of each frame."""
    return ((output[:, :, :noise.shape[2]] - noise) ** 2).mean()
