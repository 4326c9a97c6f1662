#!/usr/bin/python3
"""Self-test of the PyTorch reference DiT and of check_debug_dump.py.

    /usr/bin/python3 tests/reference/selftest.py

It writes debug dumps the way the C++ model does (one float32 training step, through
safetensors_np), and shows that the checker passes them at its default tolerance, fails a
dump with one gradient off by 1e-3 relative, and rejects malformed files. It also checks
the DiT-XL/2 parameter count and the forward-MAC table of REFERENCE.md against the
reference model's shapes.
"""

import dataclasses
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dit_torch  # noqa: E402
import safetensors_np  # noqa: E402

CHECKER = os.path.join(HERE, "check_debug_dump.py")
DIFFUSION = {"schedule": "linear", "steps": 1000, "beta_start": 0.0001, "beta_end": 0.02}
TINY = dit_torch.DiTConfig(input_size=8, patch_size=2, in_channels=4, hidden_size=64, depth=2,
                           num_heads=4, num_classes=10)

# REFERENCE.md: forward GMACs per sample at 256 px (32 x 32 latents).
GMACS_TABLE = {
    "DiT-S/8": 0.36, "DiT-S/4": 1.41, "DiT-S/2": 6.06,
    "DiT-B/8": 1.42, "DiT-B/4": 5.57, "DiT-B/2": 23.01,
    "DiT-L/8": 5.01, "DiT-L/4": 19.70, "DiT-L/2": 80.70,
    "DiT-XL/8": 7.39, "DiT-XL/4": 29.04, "DiT-XL/2": 118.62,
}


def randomize_weights(model, generator):
    """Gives every trained parameter, DiT's zero-initialised ones included, non-zero random
    values scaled so that activations stay of order 1 (pos_embed keeps its sin-cos)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                std = 0.1 if p.dim() == 1 else p[0].numel() ** -0.5
                p.copy_(torch.randn(p.shape, generator=generator) * std)


def make_dump(path, cfg, seed, batch=3, random_weights=True):
    """Writes the debug dump of one float32 training step, as `difftrain debug-dump` does."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # DiT's initialisation draws from the global generator.
    model = dit_torch.DiT(cfg)
    if random_weights:
        randomize_weights(model, generator)

    image = (batch, cfg.in_channels, cfg.input_size, cfg.input_size)
    x0 = torch.randn(image, generator=generator)
    noise = torch.randn(image, generator=generator)
    t = torch.randint(0, DIFFUSION["steps"], (batch,), generator=generator)
    # Labels as fed after dropout; the first is the null class so that its row is used.
    y = torch.randint(0, cfg.num_classes, (batch,), generator=generator)
    y[0] = cfg.num_classes
    betas = dit_torch.linear_beta_schedule(DIFFUSION["steps"], DIFFUSION["beta_start"], DIFFUSION["beta_end"])
    x_t = dit_torch.q_sample(x0, noise, t, betas).float()

    output = model(x_t, t, y)
    loss = dit_torch.epsilon_mse_loss(output, noise)
    loss.backward()

    tensors = {name: value.numpy() for name, value in model.state_dict().items()}
    tensors.update({"input.x0": x0.numpy(), "input.noise": noise.numpy(), "input.t": t.numpy(),
                    "input.y": y.numpy(), "input.x_t": x_t.numpy(),
                    "output": output.detach().numpy(), "loss": loss.detach().reshape(1).numpy()})
    tensors.update({f"grad.{name}": p.grad.numpy()
                    for name, p in model.named_parameters() if p.requires_grad})
    metadata = {"format": "difftrain-debug-dump", "version": "1",
                "config": json.dumps(dataclasses.asdict(cfg)), "diffusion": json.dumps(DIFFUSION),
                "seed": str(seed)}
    safetensors_np.write(path, tensors, metadata)


def run_checker(path):
    """Returns (exit status, stdout + stderr) of check_debug_dump.py at its default tol."""
    result = subprocess.run([sys.executable, CHECKER, path], capture_output=True, text=True)
    return result.returncode, result.stdout + result.stderr


def forward_gmacs(cfg):
    """Forward multiply-accumulates per sample, in billions, from the model's shapes: every
    Linear costs its weight count once per token it is applied to, attention 2 T^2 D."""
    model = dit_torch.DiT(cfg, device="meta")
    _, T, D = model.pos_embed.shape
    per_token = lambda *linears: T * sum(layer.weight.numel() for layer in linears)  # noqa: E731
    once = lambda *linears: sum(layer.weight.numel() for layer in linears)  # noqa: E731
    macs = per_token(model.x_embedder.proj) + once(model.t_embedder.mlp[0], model.t_embedder.mlp[2])
    for block in model.blocks:
        macs += once(block.adaLN_modulation[1])
        macs += per_token(block.attn.qkv, block.attn.proj, block.mlp.fc1, block.mlp.fc2)
        macs += 2 * T * T * D  # Q K^T and attention x V
    macs += once(model.final_layer.adaLN_modulation[1]) + per_token(model.final_layer.linear)
    return macs / 1e9


class CheckerTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "dump.safetensors")

    def tearDown(self):
        self.dir.cleanup()

    def assertChecker(self, expected_status):
        status, output = run_checker(self.path)
        self.assertEqual(status, expected_status, output)
        return output

    def test_random_weights_pass(self):
        make_dump(self.path, TINY, seed=1)
        print("\n" + self.assertChecker(0).splitlines()[-1])

    def test_dit_init_passes_with_exactly_zero_gradients(self):
        # Zero adaLN and final Linears make most reference gradients exactly 0: the checker
        # must judge those by absolute error.
        cfg = dataclasses.replace(TINY, patch_size=4, input_size=16, depth=3, learn_sigma=False)
        make_dump(self.path, cfg, seed=2, random_weights=False)
        output = self.assertChecker(0)
        self.assertIn(["grad.blocks.0.attn.qkv.weight", "abs", "0.000e+00", "OK"],
                      [line.split() for line in output.splitlines()])
        print("\n" + output.splitlines()[-1])

    def test_gradient_off_by_a_thousandth_fails(self):
        make_dump(self.path, TINY, seed=3)
        tensors, metadata = safetensors_np.read(self.path)
        name = "grad.blocks.1.attn.qkv.weight"
        tensors[name] *= np.float32(1 + 1e-3)
        safetensors_np.write(self.path, tensors, metadata)
        output = self.assertChecker(1)
        failed = [line.split()[0] for line in output.splitlines() if line.endswith("FAIL")]
        self.assertEqual(failed, [name], output)

    def test_missing_tensor_is_malformed(self):
        make_dump(self.path, TINY, seed=4)
        tensors, metadata = safetensors_np.read(self.path)
        del tensors["grad.final_layer.linear.bias"]
        safetensors_np.write(self.path, tensors, metadata)
        self.assertIn("grad.final_layer.linear.bias", self.assertChecker(2))

    def test_truncated_file_is_malformed(self):
        make_dump(self.path, TINY, seed=5)
        with open(self.path, "r+b") as f:
            f.truncate(os.path.getsize(self.path) - 4)
        self.assertChecker(2)


class SafetensorsTest(unittest.TestCase):
    def test_round_trip_keeps_dtypes_shapes_values_and_metadata(self):
        tensors = {"f32": np.arange(6, dtype=np.float32).reshape(2, 3), "f64": np.array([0.1]),
                   "i32": np.array([-3], np.int32), "i64": np.array([[2**40]]),
                   "u8": np.array([255], np.uint8), "empty": np.zeros((0, 4), np.float32)}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.safetensors")
            safetensors_np.write(path, tensors, {"k": "v"})
            read, metadata = safetensors_np.read(path)
        self.assertEqual(metadata, {"k": "v"})
        self.assertEqual(list(read), list(tensors))
        for name, array in tensors.items():
            self.assertEqual(read[name].dtype, array.dtype, name)
            np.testing.assert_array_equal(read[name], array)

    def test_bf16_reads_as_float32(self):
        values = np.array([1.5, -2.0, 3.140625], np.float32)  # exact in bfloat16
        raw = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
        header = json.dumps({"b": {"dtype": "BF16", "shape": [3], "data_offsets": [0, len(raw)]}}).encode()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "b.safetensors")
            with open(path, "wb") as f:
                f.write(struct.pack("<Q", len(header)) + header + raw)
            read, _ = safetensors_np.read(path)
        self.assertEqual(read["b"].dtype, np.float32)
        np.testing.assert_array_equal(read["b"], values)


class ModelSizeTest(unittest.TestCase):
    def test_dit_xl2_has_675129632_parameters(self):
        # DiT counts every parameter, the fixed pos_embed included.
        model = dit_torch.DiT(dit_torch.DIT_CONFIGS["DiT-XL/2"], device="meta")
        self.assertEqual(sum(p.numel() for p in model.parameters()), 675_129_632)

    def test_forward_macs_match_reference_table(self):
        lines = []
        for name, table in GMACS_TABLE.items():
            ours = forward_gmacs(dit_torch.DIT_CONFIGS[name])
            lines.append(f"{name:<9} {ours:8.3f} GMACs (table {table})")
            # 0.5%, or half a unit of the table's last digit: DiT-S/8's 0.358 prints as 0.36.
            self.assertLessEqual(abs(ours - table), max(0.005 * table, 0.005), name)
        print("\n" + "\n".join(lines))


if __name__ == "__main__":
    unittest.main(verbosity=2)
