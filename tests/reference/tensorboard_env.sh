#!/usr/bin/env bash
# Makes the TensorBoard reference's Python environment, from PyPI, in the cache directory
# (DIFFTRAIN_CACHE, default ~/.cache/difftrain; kept between runs), and prints its python:
#   tensorboard-venv/bin/python   tensorboard 2.16.2 (its event file loader and
#                                 EventAccumulator, what `tensorboard --logdir` reads runs with)
#                                 and the protobuf it decodes events with
# Exit status 1 when PyPI cannot be reached: the caller skips.
#   tests/reference/tensorboard_env.sh   # prints e.g. /root/.cache/difftrain/tensorboard-venv/bin/python
set -euo pipefail
exec "$(dirname "$0")/../../scripts/python_venv.sh" tensorboard-venv \
  "tensorboard==2.16.2 protobuf==4.25.3"
