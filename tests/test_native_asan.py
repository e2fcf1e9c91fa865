"""The native kernels built with AddressSanitizer and UBSan, driven with edge
cases and malformed input (``asan_probe.py``, in a subprocess): any
out-of-bounds access or undefined behaviour fails the test with the
sanitizer's report. The tests elsewhere check values; this one checks the
memory safety that the kernels' docs promise for unchecked input under jit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from jaxlib import version as jaxlib_version

SOURCES = Path(__file__).resolve().parents[1] / "jaxsparse_rows" / "_native"


def _runtime(name: str) -> str | None:
    """The path of a gcc runtime library, or None where g++ does not have it."""
    try:
        out = subprocess.run(
            ["g++", f"-print-file-name={name}"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return out if os.path.isabs(out) and os.path.exists(out) else None


def _jaxlib_include() -> str | None:
    import jaxlib

    include = Path(jaxlib.__file__).resolve().parent / "include"
    return str(include) if (include / "xla" / "ffi" / "api" / "ffi.h").exists() else None


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_kernels_are_clean_under_address_and_ub_sanitizers(tmp_path):
    asan, cxx = _runtime("libasan.so"), _runtime("libstdc++.so")
    include = _jaxlib_include()
    if not (asan and cxx and include):
        pytest.skip(f"no sanitizer runtime or FFI headers here: {asan=}, {cxx=}, {include=}")
    lib = tmp_path / "_kernels_asan.so"
    flags = [
        # -O0: every memory access stays instrumented (at -O1 the compiler may
        # drop some), and the kernels compile 3x faster (about 17 s of the suite).
        "-std=c++17", "-O0", "-g", "-fPIC", "-fsanitize=address,undefined",
        "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer",
        f"-I{include}", f"-I{SOURCES}",
        f'-DJSR_BUILT_WITH_JAXLIB="{jaxlib_version.__version__}"',
    ]  # fmt: skip
    objects, compiles = [], []
    for source in sorted(SOURCES.glob("*.cc")):  # compiled in parallel
        objects.append(str(tmp_path / f"{source.stem}.o"))
        compiles.append(
            subprocess.Popen(
                ["g++", *flags, "-c", str(source), "-o", objects[-1]],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for c in compiles:
        _, err = c.communicate()
        assert c.returncode == 0, err[-3000:]
    link = ["g++", "-shared", "-fsanitize=address,undefined", *objects, "-o", str(lib)]
    subprocess.run(link, check=True, capture_output=True, text=True)
    env = dict(
        os.environ,
        LD_PRELOAD=f"{asan}:{cxx}",
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:exitcode=66",
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
        JAXSPARSE_ROWS_NATIVE="1",
    )
    probe = Path(__file__).with_name("asan_probe.py")
    proc = subprocess.run(
        [sys.executable, str(probe), str(lib)], capture_output=True, text=True, env=env
    )
    report = proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "AddressSanitizer" not in proc.stderr, report
    assert "runtime error" not in proc.stderr, report
    assert proc.returncode == 0 and "asan probe ok" in proc.stdout, report
