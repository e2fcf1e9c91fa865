"""Keeps the benchmark programs in ``benchmarks/`` working: each one runs at
``--smoke`` sizes in a subprocess. torch is never imported here: the programs
are run with ``--without torch``, which also exercises the skip notice (one
test runs torch's contenders where torch is installed). The GPU mode's
choices (sizes, torch's device and threads) are tested by calling
``_harness.select_mode`` with each platform, and one program runs at smoke
sizes with the GPU mode's choices on this CPU (``--platform gpu``)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
# Timings do not matter here: cheaper XLA compilation halves the run time.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def run(args: list[str], timeout: float = 120, status: int = 0) -> str:
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + FAST_COMPILE))
    proc = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=BENCH.parent,
        env=env,
    )
    assert proc.returncode == status, (
        f"{args} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout + proc.stderr


def run_smoke(program: str, tmp_path: Path, *extra: str) -> tuple[str, dict]:
    out_json = tmp_path / "results.jsonl"
    stdout = run(
        [
            str(BENCH / program),
            "--smoke",
            "--without",
            "torch",
            "--json",
            "--json-path",
            str(out_json),
            *extra,
        ]
    )
    lines = out_json.read_text().splitlines()
    assert len(lines) == 1
    return stdout, json.loads(lines[0])


def _harness():
    """The benchmarks' ``_harness`` module (imported from ``benchmarks/``)."""
    return _program("_harness")


def _program(name: str):
    """A module of ``benchmarks/`` (imported with that folder on the path)."""
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))


def check_record(record: dict, benchmark: str) -> None:
    assert record["benchmark"] == benchmark
    assert record["smoke"] is True
    assert record["machine"]["cpu_count"] >= 1
    assert record["machine"]["jax"]
    assert record["tables"] and record["targets"]
    for target in record["targets"]:
        assert target["verdict"] in ("PASS", "MISS", "n/a")
    for table in record["tables"].values():
        for fig in table.values():
            if "skipped" not in fig:
                assert 0 < fig["min_ms"] <= fig["median_ms"] <= fig["max_ms"]
                assert fig["runs"] >= 1


def test_run_all_help():
    out = run([str(BENCH / "run_all.py"), "--help"])
    assert "--only" in out


def test_lazy_update_smoke(tmp_path):
    out, rec = run_smoke("lazy_update.py", tmp_path)
    check_record(rec, "lazy_update")
    assert "[skip] torch SparseAdam" in out and "disabled with --without" in out
    assert len(rec["tables"]) == 4  # adam, sgd, adagrad, rowwise_adagrad
    labels = [t["label"] for t in rec["targets"]]
    assert any("within 1.25x of the floor" in lab for lab in labels)
    # torch targets are reported as n/a, never as failures
    torch_targets = [t for t in rec["targets"] if "torch" in t["label"]]
    assert torch_targets and all(t["verdict"] == "n/a" for t in torch_targets)


def test_embedding_step_smoke(tmp_path):
    out, rec = run_smoke(
        "embedding_step.py", tmp_path, "--memory-paths", "jsr,floor", "--steps", "3"
    )
    check_record(rec, "embedding_step")
    assert "[skip] torch" in out
    mem = rec["extra"]["memory"]["paths"]
    assert mem["jsr (pull_rows + lazy_adam)"]["peak_mb"] > 0
    assert mem["floor (gather/scatter of the touched rows x 3)"]["steady_mb"] > 0
    compile_checks = [t for t in rec["targets"] if "compiles nothing" in t["label"]]
    assert compile_checks and all(t["verdict"] == "PASS" for t in compile_checks)


def test_auto_sparse_smoke(tmp_path):
    """The step written as plain model code with ``sparse="auto"`` against the
    same step written with ``pull_rows`` + ``take``: every target reported."""
    out, rec = run_smoke("auto_sparse.py", tmp_path)
    check_record(rec, "auto_sparse")
    assert "within 1.25x of `hand-written (pull_rows + take)`" in out
    assert "compilation(s) after the first call" in out


def test_spmm_smoke_through_run_all(tmp_path):
    """spmm.py run by run_all.py: its record, its memory traffic beside the
    device copy's, and run_all's summary table printed last."""
    out_json = tmp_path / "results.jsonl"
    out = run(
        [str(BENCH / "run_all.py"), "--only", "spmm", "--smoke", "--without", "torch", "--json"]
        + ["--json-path", str(out_json)]
    )
    (line,) = out_json.read_text().splitlines()
    rec = json.loads(line)
    check_record(rec, "spmm")
    assert "[skip] torch sparse_csr @ dense" in out
    assert len(rec["tables"]) == 2
    assert rec["copy"]["gbps"] > 0 and rec["machine"]["mode"]["sizes"] == "smoke"
    summarised = [b for b in rec["bandwidth"] if b["summary"]]
    assert [b["name"] for b in summarised] == [
        "jsr.dot(csr, dense)",
        "jsr.dot(csr, dense, transpose_a)",
    ]
    assert all(b["gbps"] > 0 and b["of_copy"] > 0 for b in summarised)
    summary = out[out.index("## Summary") :]
    assert "jsr.dot no slower than scipy" in summary and "device copy bandwidth" in summary
    assert "jsr.dot(csr, dense): memory traffic" in summary
    assert summary.rstrip().splitlines()[-1].startswith("all programs:")


def test_libsvm_io_smoke(tmp_path):
    out, rec = run_smoke("libsvm_io.py", tmp_path)
    check_record(rec, "libsvm_io")
    assert "MB/s" in out


def test_row_kernels_smoke(tmp_path):
    """The kernel-level table: every op at every smoke width, the native
    kernel (where built) beside the library's XLA path, and their ratio."""
    from jaxsparse_rows import _native

    out, rec = run_smoke("row_kernels.py", tmp_path)
    assert rec["benchmark"] == "row_kernels" and rec["smoke"] is True
    assert rec["config"]["dims"] == [1, 4, 16]
    for op in ("gather", "scatter-set", "scatter-add", "sum of rows"):
        table = rec["extra"][op]
        assert set(table["ms"][f"XLA {op}"]) == {"1", "4", "16"}
        assert all(ms > 0 for ms in table["ms"][f"XLA {op}"].values())
        if _native.native_kernels_enabled():
            ratios = table["native_over_xla"]
            assert set(ratios) == {"1", "4", "16"} and all(r > 0 for r in ratios.values())
        else:
            assert f"[skip] native {op}" in out


def test_a_target_against_two_floors_takes_the_faster():
    """``Target(slow=(a, b))`` compares with whichever of a and b has the
    smaller median in this run, skips one that was not measured, and is n/a
    when neither was."""
    h = _harness()

    def res(name, *ms):
        return h.Result(name, times=[m / 1e3 for m in ms])

    results = {
        "jsr": res("jsr", 1.0, 1.1, 1.2),
        "xla floor": res("xla floor", 1.3, 1.4, 1.5),
        "kernel floor": res("kernel floor", 0.7, 0.8, 0.9),
    }
    t = h.Target("jsr within 1.25x of the floor", "jsr", ("xla floor", "kernel floor"), 0.8)
    check = t.check(results)
    assert check["slow"] == "kernel floor" and check["verdict"] == "MISS"
    assert abs(check["ratio"] - 0.8 / 1.1) < 1e-12
    del results["kernel floor"]
    check = t.check(results)
    assert check["slow"] == "xla floor" and check["verdict"] == "PASS"
    del results["xla floor"]
    assert t.check(results)["verdict"] == "n/a"


def test_flat_in_v_verdict_reports_both_ends_against_the_floor():
    """The flat-in-V verdict compares growths and, for its reader, gives the
    step's time as a multiple of the floor's at the smallest and largest V:
    here a step faster than its floor at the small end misses on growth
    while it matches the floor at the large end."""
    h = _harness()

    class Rep:
        def __init__(self):
            self.got = []

        def verdict(self, label, value, ok, text):
            self.got.append((label, value, ok, text))

    sweep = {
        "ms": {
            "jsr": {"10000": 1.0, "1000000": 1.5, "10000000": 3.0},
            "floor": {"10000": 2.0, "1000000": 2.5, "10000000": 3.0},
        },
        "growth": {"jsr": 3.0, "floor": 1.5},
    }
    rep = Rep()
    h.flat_in_v_verdict(rep, sweep, "jsr", "floor", 1000)
    ((label, value, ok, text),) = rep.got
    assert label == "jsr flat in V" and value == 2.0 and ok is False
    assert text.endswith("0.50x the floor's time at V=10000, 1.00x at V=10000000")
    del sweep["ms"]["floor"]["10000"]  # an end timed for one of the two only
    rep = Rep()
    h.flat_in_v_verdict(rep, sweep, "jsr", "floor", 1000)
    assert rep.got[0][3].endswith("0.60x the floor's time at V=1000000, 1.00x at V=10000000")


def test_one_at_a_time_rounds_split_runs_over_fresh_setups():
    """Timed one contender at a time with ``rounds=3``, each contender is set
    up afresh in every round, in a new order each round, and runs its share of
    the runs there; compile figures come from the first round; a contender
    that skips is set up once; a contender out of budget is not set up again."""
    h = _harness()

    log = []

    def contender(name, *, skip=False, seconds=0.0):
        def setup():
            log.append(("setup", name))
            if skip:
                raise h.Skip("not here")

            def step():
                log.append(("run", name))
                time.sleep(seconds)

            return step

        return h.Contender(name, setup, jax=False)

    cs = [contender("a"), contender("b"), contender("gone", skip=True)]
    res = h.measure(cs, 7, warmup=1, budget_s=100.0, interleave=False, rounds=3)
    assert list(res) == ["a", "b", "gone"]  # the contenders' order, for the tables
    assert [len(res[n].times) for n in ("a", "b")] == [7, 7]
    assert res["gone"].skipped == "not here" and not res["gone"].times
    setups = [n for kind, n in log if kind == "setup"]
    assert setups.count("a") == setups.count("b") == 3 and setups.count("gone") == 1
    rounds = [setups[0:3], setups[3:5], setups[5:7]]
    assert sorted(rounds[0]) == ["a", "b", "gone"] and sorted(rounds[1]) == ["a", "b"]
    assert len({tuple(n for n in r if n != "gone") for r in rounds}) == 2  # shuffled
    # per round: first call + 1 warm-up + the round's share (3, 5, 7 in all)
    per_setup = []
    for kind, n in log:
        if kind == "setup":
            per_setup.append([n, 0])
        else:
            per_setup[-1][1] += 1
    assert [c for n, c in per_setup if n == "a"] == [2 + 3, 2 + 2, 2 + 2]
    assert res["a"].first_s > 0 and math.isnan(res["a"].compile_s)  # not JAX code

    # a contender whose budget is spent in the first round is not set up again
    log.clear()
    res = h.measure(
        [contender("slow", seconds=0.05)], 30, warmup=0, min_runs=1, budget_s=0.03,
        interleave=False, rounds=3,
    )  # fmt: skip
    assert [n for kind, n in log if kind == "setup"] == ["slow"]
    assert len(res["slow"].times) == 1
    with pytest.raises(ValueError, match="rounds"):
        h.measure(cs, 3, rounds=2)


def test_select_mode_picks_sizes_devices_and_threads():
    """Mode, sizes and torch's device from (platform, torch installed, torch
    has CUDA): a GPU backend takes the GPU sizes and torch on CUDA (skipped
    without CUDA); a CPU backend takes the CPU sizes and torch on the CPU with
    as many threads as XLA's pool, and a 1-thread column beside it."""
    h = _harness()
    cpu = h.select_mode("cpu", torch_installed=True, torch_cuda=True, cpu_threads=2)
    assert (cpu.gpu, cpu.sizes, cpu.torch_device, cpu.torch_threads) == (False, "cpu", "cpu", 2)
    assert cpu.torch_one_thread_column
    one = h.select_mode("cpu", torch_installed=True, torch_cuda=False, cpu_threads=1)
    assert one.torch_threads == 1 and not one.torch_one_thread_column
    pinned = h.select_mode(
        "cpu", torch_installed=True, torch_cuda=False, cpu_threads=4, torch_threads=3
    )
    assert pinned.torch_threads == 3 and pinned.cpu_threads == 4
    gpu = h.select_mode("gpu", torch_installed=True, torch_cuda=True, gpu_requested=True)
    assert (gpu.gpu, gpu.sizes, gpu.torch_device) == (True, "gpu", "cuda")
    assert not gpu.torch_one_thread_column
    no_cuda = h.select_mode("gpu", torch_installed=True, torch_cuda=False)
    assert no_cuda.torch_device is None and "CUDA" in no_cuda.torch_note
    absent = h.select_mode("gpu", torch_installed=False, torch_cuda=False)
    assert absent.torch_device is None and "not installed" in absent.torch_note
    smoke = h.select_mode("gpu", torch_installed=True, torch_cuda=True, smoke=True)
    assert smoke.sizes == "smoke" and smoke.torch_device == "cuda"
    with pytest.raises(h.NoGPU, match="default backend is 'cpu'"):
        h.select_mode("cpu", torch_installed=True, torch_cuda=False, gpu_requested=True)

    lazy, emb, spmm = (_program(n) for n in ("lazy_update", "embedding_step", "spmm"))
    assert h.pick_sizes(lazy.SIZES, gpu) == {"vocab": 10**7, "dim": 64, "touched": 262_144}
    assert h.pick_sizes(lazy.SIZES, cpu) == {"vocab": 10**6, "dim": 64, "touched": 4096}
    assert h.pick_sizes(emb.SIZES, gpu) == {"vocab": 10**7, "dim": 64, "batch": 16_384, "bag": 16}
    assert h.pick_sizes(spmm.SIZES, gpu) == {
        "rows": 16_384,
        "cols": 10**6,
        "nnz_per_row": 32,
        "width": 128,
    }
    for name in ("auto_sparse", "row_kernels", "libsvm_io"):
        assert set(_program(name).SIZES) == {"cpu", "gpu", "smoke"}


def test_xla_cpu_threads_follows_affinity_and_pjrt_nproc(monkeypatch):
    h = _harness()
    monkeypatch.delenv("PJRT_NPROC", raising=False)
    monkeypatch.delenv("NPROC", raising=False)
    assert h.xla_cpu_threads() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("NPROC", "5")
    assert h.xla_cpu_threads() == 5
    monkeypatch.setenv("PJRT_NPROC", "3")
    assert h.xla_cpu_threads() == 3


def test_torch_errors_skip_and_sync_brackets_timed_calls():
    """A contender's guarded exception (in setup or its first call) skips it
    with the message; ``prepare`` runs before every call and ``sync`` right
    before and after each, so the timed region covers the device's work."""
    h = _harness()
    log = []

    def fails_in_setup():
        raise RuntimeError("no kernel for this op on CUDA\nsecond line")

    def fails_on_first_call():
        def step():
            raise NotImplementedError("sparse op")

        return step

    def works():
        return lambda: log.append("step")

    res = h.measure(
        [
            h.Contender("a", fails_in_setup, jax=False, guard=h.TORCH_ERRORS),
            h.Contender("b", fails_on_first_call, jax=False, guard=h.TORCH_ERRORS),
            h.Contender(
                "c",
                works,
                jax=False,
                prepare=lambda: log.append("prepare"),
                sync=lambda: log.append("sync"),
            ),
        ],
        2,
        warmup=0,
    )
    assert res["a"].skipped == "RuntimeError: no kernel for this op on CUDA"
    assert res["b"].skipped == "NotImplementedError: sparse op" and not res["b"].times
    assert len(res["c"].times) == 2
    calls = log[1:]  # "prepare" before setup, then one group per call
    assert calls == ["prepare", "sync", "step", "sync"] * 3  # the first call and 2 timed
    with pytest.raises(ValueError, match="unguarded"):
        h.measure([h.Contender("d", lambda: (_ for _ in ()).throw(ValueError("unguarded")))], 1)


def test_gpu_flag_without_a_gpu_stops_run_all():
    """``run_all.py --gpu`` where JAX has no GPU: the first program says so
    and exits with status 3, and run_all.py runs nothing else."""
    out = run([str(BENCH / "run_all.py"), "--gpu", "--smoke", "--without", "torch"], status=3)
    assert "--gpu: JAX's default backend is 'cpu', not 'gpu'" in out
    assert "embedding_step.py" not in out


def test_lazy_update_with_the_gpu_modes_choices(tmp_path):
    """lazy_update.py at smoke sizes with the choices of a GPU run
    (``--platform gpu``, on this CPU): the native-kernel floor is skipped as
    CPU-only, torch has no 1-thread column, and the memory traffic is
    reported against the device copy."""
    out, rec = run_smoke("lazy_update.py", tmp_path, "--platform", "gpu", "--optimizers", "adam")
    check_record(rec, "lazy_update")
    assert rec["machine"]["mode"]["platform"] == "gpu"
    assert "[skip] floor, jsr row kernels (adam): jsr's row kernels are CPU-only" in out
    assert "[skip] torch SparseAdam:" in out and "SparseAdam, 1 thread" not in out
    assert [b["name"] for b in rec["bandwidth"] if b["summary"]] == ["floor (adam)"]


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_lazy_update_times_torch_with_xla_threads_and_one_thread(tmp_path):
    """Where torch is installed: its optimizer runs with as many threads as
    XLA's CPU pool, and a 1-thread column beside it that no target uses."""
    out_json = tmp_path / "results.jsonl"
    out = run(
        [str(BENCH / "lazy_update.py"), "--smoke", "--optimizers", "adam", "--json"]
        + ["--json-path", str(out_json)]
    )
    rec = json.loads(out_json.read_text())
    (table,) = rec["tables"].values()
    threads = rec["machine"]["mode"]["torch_threads"]
    assert threads == _harness().xla_cpu_threads()
    assert "median_ms" in table["torch SparseAdam"]
    if threads > 1:
        assert "median_ms" in table["torch SparseAdam, 1 thread"]
    (torch_target,) = [t for t in rec["targets"] if "torch" in t["label"]]
    assert torch_target["slow"] == "torch SparseAdam"
    assert f"torch {threads} intra-op thread(s)" in out
