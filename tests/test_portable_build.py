"""Portable builds: the native core compiled without -march=native (CMake -DMIITA_NATIVE_ARCH=OFF,
llama.cpp's GGML_NATIVE=OFF convention) gives the same numbers as a build for this CPU, and its
object code uses no instruction beyond the x86-64 baseline (SSE2), so a wheel built that way runs on
a CPU without AVX or AVX2.

Both variants of the kernels are built here with tools/kernel_check.cpp (the same driver that
tools/aarch64_kernels.sh runs under qemu), against the ggml that llama-cpp-python installed; each
checks every kernel against scalar references, and the two builds' outputs are compared.
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
CXX = os.environ.get("CXX", "g++")
X86 = platform.machine() in ("x86_64", "AMD64")
PORTABLE = ["-march=x86-64", "-mtune=generic"] if X86 else []


def _ggml_paths():
    import llama_cpp

    d = Path(llama_cpp.__file__).parent
    return d.parent / "include", d / "lib"


DISPATCH = ROOT / "csrc" / "isa_dispatch.cpp"
DISPATCHED = ("head_kernels.cpp", "recall_scans.cpp")  # compiled twice in a portable x86-64 build


def dispatched_functions() -> list[str]:
    """The kernels isa_dispatch.cpp forwards (each defined in a DISPATCHED source)."""
    return sorted(set(re.findall(r"use_v3\(\) \? (miita_\w+)_v3", DISPATCH.read_text())))


def _compile(out: Path, arch_flags: list[str], dispatch: bool = False) -> subprocess.Popen:
    """The core (csrc/*.cpp but bindings.cpp) + tools/kernel_check.cpp. dispatch=True builds as CMake's
    portable x86-64 build does: the DISPATCHED sources twice (baseline, x86-64-v3), renamed by -D,
    and isa_dispatch.cpp choosing between them at run time."""
    inc, lib = _ggml_paths()
    core = sorted(p for p in (ROOT / "csrc").glob("*.cpp") if p.name != "bindings.cpp")
    out.mkdir(parents=True, exist_ok=True)
    objs = []
    cmds = []
    base = [CXX, "-std=c++17", "-O3", "-fopenmp", "-Wno-psabi", f"-I{ROOT / 'csrc'}", f"-I{inc}"]
    units = [(src, src.stem, list(arch_flags)) for src in core + [ROOT / "tools" / "kernel_check.cpp"]]
    if dispatch:
        names = dispatched_functions()
        units = []
        for src in core + [ROOT / "tools" / "kernel_check.cpp"]:
            if src.name in DISPATCHED:
                for variant, march in (("base", PORTABLE), ("v3", ["-march=x86-64-v3"])):
                    units.append((src, f"{src.stem}_{variant}", march + [f"-D{f}={f}_{variant}" for f in names]))
            elif src == DISPATCH:
                units.append((src, src.stem, PORTABLE + ["-DMIITA_ISA_DISPATCH"]))
            else:
                units.append((src, src.stem, list(PORTABLE)))
    for src, stem, flags in units:
        obj = out / (stem + ".o")
        objs.append(obj)
        cmds.append(base + flags + ["-c", str(src), "-o", str(obj)])
    link = [CXX, "-fopenmp", *map(str, objs), f"-L{lib}", "-lggml-cpu", "-lggml-base", f"-Wl,-rpath,{lib}",
            "-o", str(out / "kernel_check")]
    script = " && ".join(" ".join(map(_q, c)) for c in cmds + [link])
    return subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _q(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    if shutil.which(CXX) is None:
        pytest.skip(f"no C++ compiler ({CXX})")
    base = tmp_path_factory.mktemp("kernel-builds")
    procs = {"portable": _compile(base / "portable", PORTABLE), "native": _compile(base / "native", ["-march=native"])}
    if X86 and DISPATCH.exists():
        procs["dispatch"] = _compile(base / "dispatch", PORTABLE, dispatch=True)
    for name, p in procs.items():  # both compile at once (2 cores)
        log = p.communicate(timeout=600)[0]
        assert p.returncode == 0, f"{name} build failed:\n{log[-3000:]}"
    return base


def _run(build: Path, outdir: Path, env=None):
    outdir.mkdir(exist_ok=True)
    return subprocess.run([str(build / "kernel_check"), str(outdir)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def _runs():
    runs = [("portable", "portable", {}), ("native", "native", {})]
    if X86 and DISPATCH.exists():
        runs += [("dispatch", "dispatch", {}), ("dispatch-baseline", "dispatch", {"MIITA_KERNEL_ISA": "baseline"})]
    return runs


def test_portable_build_gives_the_numbers_of_the_native_one(builds, tmp_path):
    res = {}
    for name, build, env in _runs():
        r = _run(builds / build, tmp_path / name, env)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        lines = r.stdout.splitlines()
        assert lines[-1].startswith("passed: 0 failure(s)")
        assert sum(line.startswith("ok ") for line in lines) >= 60 and not any(line.startswith("FAIL") for line in lines)
        res[name] = tmp_path / name
    files = sorted(p.name for p in res["native"].iterdir())
    assert len(files) >= 30
    for other in (n for n in res if n != "native"):
        assert files == sorted(p.name for p in res[other].iterdir()), other
        for f in files:
            a = np.fromfile(res["native"] / f, np.uint8)
            b = np.fromfile(res[other] / f, np.uint8)
            assert a.size == b.size, (other, f)
            if f.startswith(("W_", "rows_", "topk_", "i8_recall")):  # bytes, rows, indices: identical
                assert np.array_equal(a, b), (other, f)
            else:  # float results: the same to float rounding (FMA contraction and vector width differ)
                x, y = a.view(np.float32), b.view(np.float32)
                assert np.abs(x - y).max() <= 1e-6 * max(np.abs(x).max(), 1e-30), (other, f)


@pytest.mark.skipif(not X86, reason="x86-64 instruction check")
def test_portable_objects_need_no_avx(builds):
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("no objdump")
    core = sorted(p.stem for p in (ROOT / "csrc").glob("*.cpp") if p.name != "bindings.cpp")
    avx = re.compile(r"%[yz]mm\d|\bv(fmadd|fmsub|cvtph2ps|cvtps2ph|broadcast|perm|pmov)\w*")
    for stem in core:
        dis = subprocess.run([objdump, "-d", str(builds / "portable" / f"{stem}.o")], capture_output=True,
                             text=True, check=True).stdout
        assert dis.count("\n") > 100
        hits = avx.findall(dis)
        assert not hits, f"{stem}.o (portable) uses AVX instructions: {hits[:5]}"
    # the check can fail: the native build of this machine does use them
    dis = subprocess.run([objdump, "-d", str(builds / "native" / f"{core[0]}.o")], capture_output=True, text=True).stdout
    if "avx2" in Path("/proc/cpuinfo").read_text():
        assert avx.search(dis)


def test_the_kernel_check_detects_a_wrong_row(builds, tmp_path):
    r = _run(builds / "portable", tmp_path / "fault", env={"MIITA_KERNEL_CHECK_FAULT": "1"})
    assert r.returncode == 1
    assert any(line.startswith("FAIL rows q8_0") for line in r.stdout.splitlines())
    assert r.stdout.splitlines()[-1].startswith("FAILED: 1 failure(s)")

