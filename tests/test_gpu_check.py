"""benchmarks/gpu_check.py and gpu_check.sh on the CPU: what the GPU check fails on and what it refuses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_error_fails_the_equality_step_in_every_dtype(dtype, tmp_path, monkeypatch):
    # On an H200 the bfloat16 step exited 0 over 30 "CUDA error: misaligned address" lines: errors were counted
    # with bfloat16's (reported, not failed) differences. A CUDA error also marks every later config NOT RUN.
    build = gpu_check._build

    def broken(name, *args):
        if name == "prompt_lookup":
            raise RuntimeError("CUDA error: misaligned address (simulated)")
        return build(name, *args)

    monkeypatch.setattr(gpu_check, "_build", broken)
    rc = gpu_check.main(["equality", "--out", str(tmp_path), "--device", "cpu", "--dtype", dtype, "--max-new-tokens",
                         "4", "--equality-prompts", "1", "--only", "vanilla,prompt_lookup,speculative"])
    text = (tmp_path / f"equality_{dtype}.txt").read_text()
    assert rc == 1
    assert "prompt_lookup            ERROR RuntimeError: CUDA error" in text
    assert "speculative              NOT RUN (the CUDA context was lost in prompt_lookup)" in text


def test_bfloat16_differences_alone_do_not_fail(tmp_path, monkeypatch):
    # bfloat16: divergent tokens are reported (a one-token forward and a batched one round differently), not failed
    monkeypatch.setattr(gpu_check, "_build", lambda name, *a: _Shifted() if name == "speculative" else
                        _Vanilla())
    rc = gpu_check.main(["equality", "--out", str(tmp_path), "--device", "cpu", "--dtype", "bfloat16",
                         "--max-new-tokens", "4", "--equality-prompts", "1", "--only", "speculative"])
    assert rc == 0 and "first divergence at token 0" in (tmp_path / "equality_bfloat16.txt").read_text()
    assert gpu_check.main(["equality", "--out", str(tmp_path), "--device", "cpu", "--dtype", "float32",
                           "--max-new-tokens", "4", "--equality-prompts", "1", "--only", "speculative"]) == 1


class _Vanilla:
    def generate(self, ids, max_new_tokens):
        return type("R", (), {"token_ids": (1, 2, 3)})()


class _Shifted:
    def generate(self, ids, max_new_tokens):
        return type("R", (), {"token_ids": (9, 2, 3)})()


def test_an_output_folder_that_is_a_file_is_refused_in_one_line(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    out = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", str(afile)],
                         capture_output=True, text=True, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"error: output folder {afile} is a file; give a folder"]
