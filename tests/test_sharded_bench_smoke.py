"""Keeps ``benchmarks/sharded_step.py`` working: it runs at ``--smoke`` sizes on
8 host devices in a subprocess and reports, for each contender at both table
sizes, a time, the bytes its compiled program hands to collectives and its
memory; the explicit step's bytes do not grow with the table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
# Timings do not matter here: cheaper XLA compilation shortens the run.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
CONTENDERS = (
    "explicit all_to_all (shard_map)",
    "explicit, capacity 2x mean",
    "jit auto-sharded (P('x', None))",
    "replicated table (jit, P())",
)


def test_sharded_step_smoke(tmp_path):
    out_json = tmp_path / "results.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["XLA_FLAGS"] = FAST_COMPILE  # the program adds the host device count
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "sharded_step.py"),
            "--smoke",
            "--host-devices",
            "8",
            "--without",
            "torch",
            "--json",
            "--json-path",
            str(out_json),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=BENCH.parent,
        env=env,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    (line,) = out_json.read_text().splitlines()
    record = json.loads(line)
    assert record["benchmark"] == "sharded_step" and record["smoke"] is True
    assert record["config"]["devices"] == 8
    v1, v2 = record["config"]["V"]
    assert len(record["tables"]) == 2
    for table in record["tables"].values():
        assert set(table) == set(CONTENDERS)
        for fig in table.values():
            assert 0 < fig["min_ms"] <= fig["median_ms"] <= fig["max_ms"]
    sizes = record["extra"]["sizes"]
    for v in (v1, v2):
        stats = sizes[str(v)]["stats"]
        assert set(stats) == set(CONTENDERS)
        for s in stats.values():
            assert s["arguments_mb"] > 0 and s["temporaries_mb"] >= 0
        explicit = stats[CONTENDERS[0]]["bytes"]
        assert explicit["all-to-all"] > 0 and "all-gather" not in explicit
        assert stats[CONTENDERS[2]]["bytes"].get("all-reduce", 0) > 0
    # The default capacity's exchange does not depend on the table size.
    assert (
        sizes[str(v1)]["stats"][CONTENDERS[0]]["bytes"]
        == (sizes[str(v2)]["stats"][CONTENDERS[0]]["bytes"])
    )
    assert "bytes per step per device" in proc.stdout
