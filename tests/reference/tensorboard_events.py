#!/usr/bin/python3
"""TensorBoard's own reader as the reference of difftrain's event files (model/io/tensorboard.h):

    PYTHON tests/reference/tensorboard_events.py DIR OUT.json

PYTHON is the interpreter tests/reference/tensorboard_env.sh prints. Every event file in DIR
is read by TensorBoard's EventAccumulator, as `tensorboard --logdir DIR` loads a run (its
default purge of orphaned data on a SessionLog START included), nothing sampled away.
OUT.json holds {"scalars": {tag: [[step, value], ...]}, "images": {tag: [[step, width,
height, the encoded bytes as hex], ...]}, "files": [the event files' names]}.
"""
import json
import os
import sys

from tensorboard.backend.event_processing import event_accumulator


def main():
    directory, out = sys.argv[1], sys.argv[2]
    accumulator = event_accumulator.EventAccumulator(
        directory, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.IMAGES: 0})
    accumulator.Reload()
    tags = accumulator.Tags()
    result = {
        "scalars": {tag: [[e.step, e.value] for e in accumulator.Scalars(tag)]
                    for tag in tags["scalars"]},
        "images": {tag: [[e.step, e.width, e.height, e.encoded_image_string.hex()]
                         for e in accumulator.Images(tag)]
                   for tag in tags["images"]},
        "files": sorted(os.listdir(directory)),
    }
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
