"""An independent PyTorch port of the parts of DiT's diffusion code (facebookresearch/DiT,
diffusion/gaussian_diffusion.py and respace.py) that difftrain reproduces: the quantities
derived from the beta schedule, the posterior q(x_{t-1} | x_t, x0), the model's reverse
step with a learned variance range, the variational-bound terms of the learn_sigma
objective, and timestep respacing.

Written from the algorithm (Ho et al. 2020; Nichol & Dhariwal 2021, "Improved DDPM"), in
float64 throughout: it is the exact value the C++ code is compared against. DiT itself
computes in float32 with the per-timestep coefficients rounded to float32.
"""

import math

import numpy as np
import torch


class Diffusion:
    """Every per-timestep array of a beta schedule, float64 numpy, named as DiT names them."""

    def __init__(self, betas):
        betas = np.asarray(betas, dtype=np.float64)
        assert betas.ndim == 1 and (betas > 0).all() and (betas <= 1).all()
        self.betas = betas
        self.num_timesteps = len(betas)
        alphas = 1.0 - betas
        self.alphas_cumprod = np.cumprod(alphas)
        self.alphas_cumprod_prev = np.append(1.0, self.alphas_cumprod[:-1])
        self.sqrt_recip_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod)
        self.sqrt_recipm1_alphas_cumprod = np.sqrt(1.0 / self.alphas_cumprod - 1.0)
        self.posterior_variance = betas * (1.0 - self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        # The posterior variance is 0 at t = 0; its log is clipped by taking t = 1's instead.
        if self.num_timesteps > 1:
            self.posterior_log_variance_clipped = np.log(
                np.append(self.posterior_variance[1], self.posterior_variance[1:]))
        else:
            self.posterior_log_variance_clipped = np.log(betas)  # difftrain's 1-step convention
        self.posterior_mean_coef1 = betas * np.sqrt(self.alphas_cumprod_prev) / (1.0 - self.alphas_cumprod)
        self.posterior_mean_coef2 = (1.0 - self.alphas_cumprod_prev) * np.sqrt(alphas) / (1.0 - self.alphas_cumprod)

    def at(self, name, t, ndim):
        """Array `name` at timesteps t [B], shaped [B, 1, ..., 1] for broadcasting."""
        values = torch.from_numpy(getattr(self, name))[t]
        return values.reshape((-1,) + (1,) * (ndim - 1))

    def q_posterior_mean(self, x0, x_t, t):
        return self.at("posterior_mean_coef1", t, x_t.dim()) * x0 + self.at("posterior_mean_coef2", t, x_t.dim()) * x_t

    def predict_x0_from_eps(self, x_t, t, eps):
        return (self.at("sqrt_recip_alphas_cumprod", t, x_t.dim()) * x_t
                - self.at("sqrt_recipm1_alphas_cumprod", t, x_t.dim()) * eps)

    def p_mean_variance_learned_range(self, eps, var_values, x_t, t, clip_denoised=False):
        """The model's reverse step for a learned-range output: (mean, log_variance, x0)."""
        min_log = self.at("posterior_log_variance_clipped", t, x_t.dim())
        max_log = torch.from_numpy(np.log(self.betas))[t].reshape(min_log.shape)
        frac = (var_values + 1) / 2
        log_variance = frac * max_log + (1 - frac) * min_log
        x0 = self.predict_x0_from_eps(x_t, t, eps)
        if clip_denoised:
            x0 = x0.clamp(-1, 1)
        return self.q_posterior_mean(x0, x_t, t), log_variance, x0


def linear_betas(steps=1000, beta_start=1e-4, beta_end=0.02):
    return np.linspace(beta_start, beta_end, steps, dtype=np.float64)


def cosine_betas(steps=1000, max_beta=0.999):
    """Improved DDPM's cosine schedule: beta_i = 1 - abar((i+1)/T) / abar(i/T), capped."""
    abar = lambda s: math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2  # noqa: E731
    return np.array([min(1 - abar((i + 1) / steps) / abar(i / steps), max_beta)
                     for i in range(steps)], dtype=np.float64)


def min_snr_weights(diffusion, t, gamma):
    """Min-SNR-gamma weights of the eps-MSE: min(SNR_t, gamma) / SNR_t, SNR = abar/(1-abar)."""
    abar = torch.from_numpy(diffusion.alphas_cumprod)[t]
    snr = abar / (1 - abar)
    return torch.clamp(snr, max=gamma) / snr


def normal_kl(mean1, logvar1, mean2, logvar2):
    """KL(N(mean1, exp(logvar1)) || N(mean2, exp(logvar2))), element-wise, in nats."""
    return 0.5 * (-1.0 + logvar2 - logvar1 + torch.exp(logvar1 - logvar2)
                  + (mean1 - mean2) ** 2 * torch.exp(-logvar2))


def approx_standard_normal_cdf(x):
    """The tanh approximation of the standard normal CDF that DiT uses."""
    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def discretized_gaussian_log_likelihood(x, means, log_scales):
    """log P(x) for data in [-1, 1] quantised to 256 levels (bins of width 2/255), under a
    Gaussian discretised to those bins; the two edge bins extend to infinity."""
    centered = x - means
    inv_stdv = torch.exp(-log_scales)
    cdf_plus = approx_standard_normal_cdf(inv_stdv * (centered + 1.0 / 255.0))
    cdf_min = approx_standard_normal_cdf(inv_stdv * (centered - 1.0 / 255.0))
    log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
    log_one_minus_cdf_min = torch.log((1.0 - cdf_min).clamp(min=1e-12))
    log_cdf_delta = torch.log((cdf_plus - cdf_min).clamp(min=1e-12))
    return torch.where(x < -0.999, log_cdf_plus,
                       torch.where(x > 0.999, log_one_minus_cdf_min, log_cdf_delta))


def mean_flat(x):
    return x.mean(dim=tuple(range(1, x.dim())))


def vb_terms_bpd(diffusion, eps, var_values, x0, x_t, t):
    """Per-sample variational-bound term in bits: KL of the model's step from the true
    posterior, or at t = 0 the decoder NLL."""
    true_mean = diffusion.q_posterior_mean(x0, x_t, t)
    true_log_variance = diffusion.at("posterior_log_variance_clipped", t, x_t.dim())
    mean, log_variance, _ = diffusion.p_mean_variance_learned_range(eps, var_values, x_t, t)
    kl = mean_flat(normal_kl(true_mean, true_log_variance, mean, log_variance)) / math.log(2.0)
    nll = -discretized_gaussian_log_likelihood(x0, mean, 0.5 * log_variance)
    nll = mean_flat(nll) / math.log(2.0)
    return torch.where(t == 0, nll, kl)


def training_loss(diffusion, output, x0, x_t, noise, t, learn_sigma, weights=None):
    """The batch's loss: mean over samples of weights * MSE(eps, noise) (+ vb with learn_sigma,
    which sees eps detached, so only the variance channels get its gradient)."""
    C = x_t.shape[1]
    eps = output[:, :C]
    loss = mean_flat((eps - noise) ** 2)
    if weights is not None:
        loss = loss * weights
    if learn_sigma:
        var_values = output[:, C:]
        loss = loss + vb_terms_bpd(diffusion, eps.detach(), var_values, x0, x_t, t)
    return loss.mean()


def space_timesteps(num_timesteps, count):
    """The timesteps DiT's space_timesteps(num_timesteps, "<count>") keeps: `count` of them,
    evenly strided from 0 to num_timesteps - 1 and rounded (Python's round: half to even)."""
    if count > num_timesteps:
        raise ValueError(f"cannot keep {count} of {num_timesteps} steps")
    stride = 1 if count <= 1 else (num_timesteps - 1) / (count - 1)
    kept, position = [], 0.0
    for _ in range(count):
        kept.append(round(position))
        position += stride
    return sorted(set(kept))


def respaced_betas(base_betas, kept):
    """The betas of the respaced process: consecutive kept alpha_bar values as its steps."""
    alphas_cumprod = np.cumprod(1.0 - np.asarray(base_betas, dtype=np.float64))
    betas, last = [], 1.0
    for i in sorted(kept):
        betas.append(1.0 - alphas_cumprod[i] / last)
        last = alphas_cumprod[i]
    return np.array(betas)
