#!/usr/bin/python3
"""diffusers' get_scheduler (diffusers.optimization, 0.27.2) as the reference of difftrain's
`optimizer.lr_schedule: diffusers_NAME` (model/optim/adamw.h, DiffusersLrFactor):

    PYTHON tests/reference/lr_schedule.py CASES.json OUT.json

PYTHON is the interpreter tests/reference/diffusers_env.sh prints. CASES.json is a list of
{"name", "lr", "warmup", "steps", "cycles", "power"}; for each, an AdamW of learning rate lr
over one parameter gets get_scheduler(name, num_warmup_steps=warmup, num_training_steps=steps,
num_cycles=cycles, power=power), and the loop of train_text_to_image.py runs `steps` optimizer
steps (optimizer.step, then lr_scheduler.step). OUT.json holds, for each case, the rate each
step's optimizer.step used.
"""
import json
import sys

import torch
from diffusers.optimization import get_scheduler


def rates(case):
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([parameter], lr=case["lr"])
    scheduler = get_scheduler(case["name"], optimizer, num_warmup_steps=case["warmup"],
                              num_training_steps=case["steps"], num_cycles=case["cycles"],
                              power=case["power"])
    used = []
    for _ in range(case["steps"]):
        parameter.grad = torch.ones(1)
        used.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return used


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    with open(sys.argv[2], "w") as f:
        json.dump([rates(case) for case in cases], f)


if __name__ == "__main__":
    main()
