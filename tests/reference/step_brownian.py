"""diffusers' DPMSolverSDEScheduler with difftrain's step noise in place of torchsde's Brownian
tree (tests/reference/schedulers.py and sd_pipeline.py).

The scheduler's module imports torchsde for its tree, which is replaced here: a stand-in module
lets it import without torchsde (`dpm_solver_sde_module`). `StepBrownian` is the noise sampler:
the tree's normalized increments (W(b) − W(a))/√|b − a| made from a step's two draws z1, z2
(the increments over [σ_mid, σ] and [σ', σ_mid], each normalized), as difftrain's sampler
draws them from a sample's step noise stream.
"""

import sys
import types


def dpm_solver_sde_module():
    """diffusers.schedulers.scheduling_dpmsolver_sde, imported without torchsde."""
    sys.modules.setdefault("torchsde", types.ModuleType("torchsde"))
    from diffusers.schedulers import scheduling_dpmsolver_sde
    return scheduling_dpmsolver_sde


class StepBrownian:
    """Its first call of a step (σ → σ_mid) returns z1, its second (σ → σ') the increment over
    both, (√(σ − σ_mid) z1 + √(σ_mid − σ') z2)/√(σ − σ'). `noise` is [steps, 2, ...]: each
    step's z1 and z2, each of the sample's shape."""

    def __init__(self, noise):
        self.steps = list(noise.unbind(0))
        self.mid = None

    def __call__(self, sigma, sigma_next):
        if self.mid is None:
            self.z1, self.z2 = self.steps.pop(0).unbind(0)
            self.mid = sigma_next
            return self.z1
        first, second = (sigma - self.mid).sqrt(), (self.mid - sigma_next).sqrt()
        self.mid = None
        return (first * self.z1 + second * self.z2) / (sigma - sigma_next).sqrt()
