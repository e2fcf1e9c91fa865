"""Every example runs (`--smoke`, in subprocesses, a few at a time) and prints
its summary line; every example answers `--help`."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NAMES = sorted(p.stem for p in EXAMPLES.glob("*.py") if not p.stem.startswith("_"))
# Examples of a framework in the test extra: skipped where it is not installed.
REQUIRES = {"flax_recommender": "flax", "equinox_text_classifier": "equinox"}
# Arguments of a smoke run beyond --smoke.
SMOKE_ARGS = {"sharded_embedding": ("--host-devices", "4")}


def _run(name: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONWARNINGS="error")
    return subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=EXAMPLES.parent,
    )


# What a smoke run prints beyond its summary line.
OUTPUT = {
    "sparse_linear_regression": ("Epoch 0, MSE = ", "Epoch 1, MSE = "),
    "adagrad_semantics": (
        "AdaGrad: lazy == dense exactly? True",
        "Adam: lazy == dense exactly? False",
    ),
    "svrg_linear_regression": ("SGD MSE", "SVRG MSE"),
    "linear_classification": ("Epoch 1, loss = ", "accuracy = "),
    "sharded_embedding": ("in 4 shards of 1024 rows", "table still sharded by rows: True"),
}


@pytest.fixture(scope="module")
def smoke_runs(request):
    """The smoke runs this session's tests read (under ``JSR_TEST_SHARD`` a
    shard collects some of them), all at once: the subprocesses overlap their
    start-up and compiles."""
    wanted = {
        item.callspec.params["name"]
        for item in request.session.items
        if getattr(item, "module", None) is request.module  # (doctests have no module)
        and getattr(item, "originalname", None) == "test_example_smoke"
    }
    runnable = [
        n
        for n in NAMES
        if n in wanted and (n not in REQUIRES or importlib.util.find_spec(REQUIRES[n]))
    ]
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {
            name: pool.submit(_run, name, "--smoke", *SMOKE_ARGS.get(name, ())) for name in runnable
        }
        return {name: f.result() for name, f in futures.items()}


def test_all_examples_are_listed():
    assert set(OUTPUT) <= set(NAMES)
    assert set(NAMES) >= {
        "adagrad_semantics",
        "embedding_model",
        "linear_classification",
        "sparse_linear_regression",
        "svrg_linear_regression",
        "flax_recommender",
        "equinox_text_classifier",
        "sharded_embedding",
    }


@pytest.mark.parametrize("name", NAMES)
def test_example_smoke(smoke_runs, name):
    if name in REQUIRES:
        pytest.importorskip(
            REQUIRES[name], reason=f"{REQUIRES[name]} is not installed (test extra)"
        )
    proc = smoke_runs[name]
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(f"{name}: "), last  # the one-line summary
    for text in OUTPUT.get(name, ()):
        assert text in proc.stdout, (name, text)
    if name in REQUIRES:  # the framework examples train and evaluate
        assert re.search(r"loss [0-9.]+ -> [0-9.]+; held-out accuracy", proc.stdout)


@pytest.mark.parametrize("name", NAMES)
def test_example_help(name, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    module = importlib.import_module(name)
    with pytest.raises(SystemExit) as exit_info:
        module.parse_args(["--help"])
    assert exit_info.value.code == 0
    assert "--smoke" in capsys.readouterr().out


def test_sparse_linear_regression_at_the_seed_size_reaches_the_seed_mse():
    """Seed 002 trains on a 1000 x 100 CSR (density 0.01) for 10 epochs and
    asserts an MSE below 1; the smoke run is too small to, so this runs the
    example at the seed's sizes (about 10 s)."""
    proc = _run("sparse_linear_regression")
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    epochs = re.findall(r"^Epoch (\d+), MSE = ([0-9.]+)$", proc.stdout, re.MULTILINE)
    assert [int(e) for e, _ in epochs] == list(range(10))
    assert float(epochs[-1][1]) < 1, proc.stdout
