"""An independent PyTorch DiT (Peebles & Xie, facebookresearch/DiT models.py), used as the
reference the C++ model is checked against.

It reproduces DiT's architecture, state-dict names and initialisation, and the linear
beta schedule of its diffusion code. timm is not available, so the three timm pieces DiT
uses (PatchEmbed, Attention, Mlp) are written out here with timm's parameter names.

One deliberate numerical difference: DiT computes the sinusoidal timestep embedding in
float32 whatever the model's dtype; here it is computed in float64 and cast to the model's
dtype. For t near 1000 the float32 argument t * freq carries an absolute error near 1e-4,
which alone makes a float32 embedding differ from the exact one by ~1e-5 relative; the
float64 reference is the exact value, and the C++ model should compute it the same way.
"""

import dataclasses
import math

import numpy as np
import torch
from torch import nn

FREQUENCY_EMBEDDING_SIZE = 256


@dataclasses.dataclass(frozen=True)
class DiTConfig:
    """The constructor arguments of DiT; field names match the debug dump's config JSON."""
    input_size: int = 32
    patch_size: int = 2
    in_channels: int = 4
    hidden_size: int = 1152
    depth: int = 28
    num_heads: int = 16
    mlp_ratio: float = 4.0
    num_classes: int = 1000
    class_dropout_prob: float = 0.1
    learn_sigma: bool = True

    @property
    def out_channels(self):
        return self.in_channels * 2 if self.learn_sigma else self.in_channels

    @property
    def num_patches(self):
        return (self.input_size // self.patch_size) ** 2


# DiT's named models: size -> (depth, hidden size, heads); every size comes with patch 2, 4, 8.
_SIZES = {"S": (12, 384, 6), "B": (12, 768, 12), "L": (24, 1024, 16), "XL": (28, 1152, 16)}
DIT_CONFIGS = {
    f"DiT-{size}/{patch}": DiTConfig(depth=depth, hidden_size=hidden, num_heads=heads, patch_size=patch)
    for size, (depth, hidden, heads) in _SIZES.items()
    for patch in (2, 4, 8)
}


# --- Fixed embeddings -------------------------------------------------------------------

def get_1d_sincos_pos_embed_from_grid(embed_dim, pos):
    """MAE's 1-D embedding: [sin(pos * omega), cos(pos * omega)], omega = 10000^(-2i/dim)."""
    assert embed_dim % 2 == 0
    omega = np.arange(embed_dim // 2, dtype=np.float64) / (embed_dim / 2.0)
    omega = 1.0 / 10000 ** omega
    out = np.einsum("m,d->md", pos.reshape(-1).astype(np.float64), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def get_2d_sincos_pos_embed(embed_dim, grid_size):
    """MAE's 2-D embedding, [grid_size**2, embed_dim] in float64, tokens in row-major order.

    As in MAE, meshgrid puts the column (w) coordinate first, so the first half of each
    token's embedding encodes its column and the second half its row.
    """
    assert embed_dim % 2 == 0
    grid_h = np.arange(grid_size, dtype=np.float32)
    grid_w = np.arange(grid_size, dtype=np.float32)
    grid = np.stack(np.meshgrid(grid_w, grid_h), axis=0).reshape(2, 1, grid_size, grid_size)
    emb_first = get_1d_sincos_pos_embed_from_grid(embed_dim // 2, grid[0])
    emb_second = get_1d_sincos_pos_embed_from_grid(embed_dim // 2, grid[1])
    return np.concatenate([emb_first, emb_second], axis=1)


def timestep_embedding(t, dim=FREQUENCY_EMBEDDING_SIZE, max_period=10000):
    """[cos(t * freqs), sin(t * freqs)] with freqs = exp(-ln(max_period) * i / (dim/2)),
    computed in float64 (see the module docstring)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float64) / half)
    args = t.to(torch.float64)[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


# --- Layers (names follow DiT and timm so that state-dict keys match) --------------------

class PatchEmbed(nn.Module):
    """timm's PatchEmbed: a p x p convolution with stride p, then tokens in row-major order."""

    def __init__(self, cfg, **factory):
        super().__init__()
        self.patch_size = cfg.patch_size
        self.num_patches = cfg.num_patches
        self.proj = nn.Conv2d(cfg.in_channels, cfg.hidden_size, kernel_size=cfg.patch_size,
                              stride=cfg.patch_size, bias=True, **factory)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)  # [N, C, h, w] -> [N, h*w, D]


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden_size, **factory):
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(FREQUENCY_EMBEDDING_SIZE, hidden_size, bias=True, **factory),
            nn.SiLU(),
            nn.Linear(hidden_size, hidden_size, bias=True, **factory),
        )

    def forward(self, t):
        return self.mlp(timestep_embedding(t).to(self.mlp[0].weight.dtype))


class LabelEmbedder(nn.Module):
    """Class labels -> vectors. With dropout for classifier-free guidance the table has one
    extra row, index num_classes, for the "null" label."""

    def __init__(self, num_classes, hidden_size, dropout_prob, **factory):
        super().__init__()
        use_cfg_embedding = int(dropout_prob > 0)
        self.embedding_table = nn.Embedding(num_classes + use_cfg_embedding, hidden_size, **factory)

    def forward(self, labels):
        # Training-time label dropout is left to the caller: the reference runs on labels
        # as the model was fed them, the dropped ones already set to num_classes.
        return self.embedding_table(labels)


class Attention(nn.Module):
    """timm's Attention with qkv bias: heads split as reshape(B, N, 3, H, head_dim)."""

    def __init__(self, dim, num_heads, **factory):
        super().__init__()
        assert dim % num_heads == 0
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=True, **factory)
        self.proj = nn.Linear(dim, dim, **factory)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each [B, H, N, head_dim]
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class Mlp(nn.Module):
    """timm's Mlp: fc1 -> GELU (tanh approximation) -> fc2."""

    def __init__(self, dim, hidden, **factory):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, **factory)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden, dim, **factory)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class DiTBlock(nn.Module):
    """A transformer block whose LayerNorms are modulated by the condition (adaLN-Zero)."""

    def __init__(self, cfg, **factory):
        super().__init__()
        D = cfg.hidden_size
        self.norm1 = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(D, cfg.num_heads, **factory)
        self.norm2 = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(D, int(D * cfg.mlp_ratio), **factory)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(D, 6 * D, bias=True, **factory))

    def forward(self, x, c):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = \
            self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        x = x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


class FinalLayer(nn.Module):
    def __init__(self, cfg, **factory):
        super().__init__()
        D = cfg.hidden_size
        self.norm_final = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(D, cfg.patch_size ** 2 * cfg.out_channels, bias=True, **factory)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(D, 2 * D, bias=True, **factory))

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class DiT(nn.Module):
    """The diffusion transformer. Build on device="meta" to inspect shapes without memory;
    such a model is left uninitialised."""

    def __init__(self, cfg, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.cfg = cfg
        self.x_embedder = PatchEmbed(cfg, **factory)
        self.t_embedder = TimestepEmbedder(cfg.hidden_size, **factory)
        self.y_embedder = LabelEmbedder(cfg.num_classes, cfg.hidden_size, cfg.class_dropout_prob, **factory)
        # A parameter that is not trained, as in DiT, so that it is in the state dict.
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.num_patches, cfg.hidden_size, **factory),
                                      requires_grad=False)
        self.blocks = nn.ModuleList([DiTBlock(cfg, **factory) for _ in range(cfg.depth)])
        self.final_layer = FinalLayer(cfg, **factory)
        if device != "meta":
            self.initialize_weights()

    def initialize_weights(self):
        """DiT's initialisation: Xavier-uniform Linears with zero bias, N(0, 0.02) label
        table and timestep MLP, and zero adaLN and final Linears (adaLN-Zero)."""
        def basic_init(module):
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        self.apply(basic_init)

        grid_size = int(self.cfg.num_patches ** 0.5)
        pos_embed = get_2d_sincos_pos_embed(self.cfg.hidden_size, grid_size)
        self.pos_embed.data.copy_(torch.from_numpy(pos_embed).unsqueeze(0))

        # The patch embedding is initialised like a Linear on flattened patches.
        w = self.x_embedder.proj.weight.data
        nn.init.xavier_uniform_(w.view([w.shape[0], -1]))
        nn.init.zeros_(self.x_embedder.proj.bias)

        nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)

        for linear in [b.adaLN_modulation[-1] for b in self.blocks] + \
                [self.final_layer.adaLN_modulation[-1], self.final_layer.linear]:
            nn.init.zeros_(linear.weight)
            nn.init.zeros_(linear.bias)

    def unpatchify(self, x):
        """[N, T, p*p*c] -> [N, c, H, W]."""
        c = self.cfg.out_channels
        p = self.cfg.patch_size
        h = w = int(x.shape[1] ** 0.5)
        assert h * w == x.shape[1]
        x = x.reshape(x.shape[0], h, w, p, p, c)
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(x.shape[0], c, h * p, w * p)

    def forward(self, x, t, y):
        """x: [N, C, H, W] noised latents, t: [N] timesteps, y: [N] labels (after dropout)."""
        x = self.x_embedder(x) + self.pos_embed
        c = self.t_embedder(t) + self.y_embedder(y)
        for block in self.blocks:
            x = block(x, c)
        x = self.final_layer(x, c)
        return self.unpatchify(x)


# --- Diffusion --------------------------------------------------------------------------

def linear_beta_schedule(steps=1000, beta_start=1e-4, beta_end=0.02):
    """DiT's "linear" betas, float64. DiT scales the end points by 1000/steps; with its 1000
    steps that is 1, and the end points here are taken as given."""
    return np.linspace(beta_start, beta_end, steps, dtype=np.float64)


def q_sample(x0, noise, t, betas):
    """x_t = sqrt(alpha_bar_t) * x0 + sqrt(1 - alpha_bar_t) * noise, in float64."""
    alphas_cumprod = torch.from_numpy(np.cumprod(1.0 - betas))
    shape = (-1,) + (1,) * (x0.dim() - 1)
    a = alphas_cumprod[t].reshape(shape)
    return torch.sqrt(a) * x0.to(torch.float64) + torch.sqrt(1.0 - a) * noise.to(torch.float64)


def epsilon_mse_loss(output, noise):
    """The debug dump's loss: mean of (output[:, :C] - noise)^2 over every element (the
    predicted-noise channels; with learn_sigma the variance channels are not in it)."""
    return ((output[:, :noise.shape[1]] - noise) ** 2).mean()
