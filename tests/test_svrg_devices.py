"""jsr.svrg across data-parallel devices (``svrg_devices.py``, run in a
subprocess with 4 host devices because the device count is fixed when JAX
starts; every case runs on a mesh of 4 devices): inside ``shard_map``
with ``axis_name`` (each device reading its own part of the rows), the full
gradient, scanned or looped, and the exact and lazy steps equal one device
reading every row; under ``jax.jit`` with batch-sharded global arrays,
``fit`` and its full gradient equal the unsharded run. A full gradient that
is not summed over the devices, or summed without their row counts, fails
here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

CASES = {
    f"{case}_4"
    for case in (
        "full_gradient_scan",
        "full_gradient_loop",
        "steps_exact",
        "steps_lazy",
        "jit_fit",
        "jit_full_gradient",
    )
}


def test_svrg_on_4_devices_matches_one_device():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "svrg_devices.py"), "4"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(results) == CASES, results
    failed = {k: v for k, v in results.items() if isinstance(v, str) or v > 1e-5}
    assert not failed, failed
