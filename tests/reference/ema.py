#!/usr/bin/python3
"""diffusers' EMAModel (training_utils, 0.27.2) as the reference of difftrain's EMA schedule
`optimizer.ema_schedule: diffusers` (model/optim/adamw.h, EmaDecayAt):

    PYTHON tests/reference/ema.py DECAY STEPS OUT.json [INV_GAMMA POWER]

PYTHON is the interpreter tests/reference/diffusers_env.sh prints. An EMAModel of decay DECAY
(its other arguments at train_text_to_image.py's defaults; with INV_GAMMA and POWER,
use_ema_warmup on with those, as train_unconditional.py makes it) follows a parameter of four values,
zero at the start and at optimizer step k (1 … STEPS) set to sin(0.1 · k · (i + 1)) before
EMAModel.step. OUT.json holds {"decays": [the decay each step used], "shadow": [the average
after each step, four values]}.
"""
import json
import math
import sys

import torch
from diffusers.training_utils import EMAModel


def main():
    decay, steps, out = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    parameter = torch.nn.Parameter(torch.zeros(4))
    if len(sys.argv) > 4:
        ema = EMAModel([parameter], decay=decay, use_ema_warmup=True,
                       inv_gamma=float(sys.argv[4]), power=float(sys.argv[5]))
    else:
        ema = EMAModel([parameter], decay=decay)
    result = {"decays": [], "shadow": []}
    for k in range(1, steps + 1):
        with torch.no_grad():
            parameter.copy_(torch.tensor([math.sin(0.1 * k * (i + 1)) for i in range(4)]))
        ema.step([parameter])
        result["decays"].append(ema.cur_decay_value)
        result["shadow"].append(ema.shadow_params[0].tolist())
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
