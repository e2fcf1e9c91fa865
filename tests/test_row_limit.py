"""Dense tables with more rows than the index dtype can address.

Row ids are int32 unless ``jax_enable_x64`` is on, and a table's row count
``V`` is the padding id, so a table may have at most 2**31 - 1 rows. Every
place a dense table enters refuses a larger one, naming it, from its shape
(so under ``jax.jit`` too). The tables here are 1-D uint8 arrays of
2**31 + 5 rows: one 2 GiB allocation shared by the module."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_switch import kernels_set

import jaxsparse_rows as jsr
from jaxsparse_rows._limits import check_table_rows, max_table_rows

N = 2**31 + 5
LIMIT = 2**31 - 1

pytestmark = pytest.mark.skipif(
    jax.config.jax_enable_x64, reason="the row limit is that of int32 ids (x64 off)"
)


def message(name, size=N, what="rows"):
    """The error's pattern: the table's name, its size, the limit and the fix."""
    return (
        rf"`{name}` has {size} {what}, more than int32 ids can address: at most {LIMIT} "
        rf"= 2\*\*31 - 1 .* the count itself is the padding id\. Enable 64-bit indices with "
        rf"`jax\.config\.update\('jax_enable_x64', True\)`"
    )


def test_take_and_pull_rows_on_a_big_table_work_with_x64():
    """With 64-bit ids the same table is addressed correctly, rows past
    2**31 included (a subprocess: x64 is process-wide)."""
    code = textwrap.dedent(
        f"""
        import jax
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp, numpy as np
        import jaxsparse_rows as jsr
        n = {N}
        fill = lambda: jnp.zeros(n, jnp.uint8).at[3].set(9).at[{LIMIT}].set(5).at[n - 2].set(7)
        t = jax.jit(fill)()
        ids = jnp.array([3, 7, n - 2, {LIMIT}, n])
        for native in (False, True):
            jsr.set_native_kernels(native)
            print(jsr.take(t, ids).tolist(), jax.jit(jsr.take)(t, ids).tolist())
            view = jsr.pull_rows(t, ids)
            print(view.indices.tolist(), view.data.tolist())
        """
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    taken = str([9, 0, 7, 5, 0])
    pulled = f"{[3, 7, LIMIT, N - 2, N]} {[9, 0, 5, 7, 0]}"
    assert lines == [f"{taken} {taken}", pulled] * 2, proc.stdout


@pytest.fixture(scope="module")
def big():
    """A 1-D uint8 table of 2**31 + 5 rows (2 GiB), for the whole module."""
    table = jnp.zeros(N, jnp.uint8)
    yield table
    table.delete()


IDS = np.array([3, 7])


def _optimizer_update(table, ids):
    """A lazy optimizer's update with a RowSparse gradient of the table's shape
    (made with ``_make``, as no public constructor accepts that shape)."""
    opt = jsr.optim.lazy_sgd(0.1)  # no momentum: the state holds no [V] array
    params = {"emb": table}
    grad = jsr.RowSparse._make(
        jnp.ones((2,), jnp.float32), jnp.asarray(ids, jnp.int32), tuple(table.shape)
    )
    return opt.update({"emb": grad}, opt.init(params), params)


def _apply_updates(table, ids):
    update = jsr.RowSparse._make(
        jnp.ones((2,), table.dtype), jnp.asarray(ids, jnp.int32), tuple(table.shape)
    )
    return jsr.optim.apply_updates({"emb": table}, {"emb": update})


# (entry point, the name its error gives the table)
ENTRIES = {
    "take": (lambda t, ids: jsr.take(t, ids), "x"),
    "pull_rows": (lambda t, ids: jsr.pull_rows(t, ids), "table"),
    "embedding_bag": (lambda t, ids: jsr.embedding_bag(t, ids[None], mode="sum"), "table"),
    "cast_storage": (lambda t, ids: jsr.cast_storage(t, "row_sparse"), "x"),
    "fromdense": (lambda t, ids: jsr.RowSparse.fromdense(t, max_rows=2), "x"),
    "optimizer update": (_optimizer_update, r"params\['emb'\]"),
    "apply_updates": (_apply_updates, r"params\['emb'\]"),
}


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_every_entry_refuses_a_table_too_big_for_int32_ids(big, entry, jit_mode):
    fn, name = ENTRIES[entry]
    with pytest.raises(ValueError, match=message(name)):
        jit_mode(fn)(big, jnp.asarray(IDS))


@pytest.mark.parametrize("native", [False, True])
def test_take_refuses_with_the_kernels_on_and_off(big, native):
    """Refused whichever gather would run: past 2**31 - 1 rows the XLA gather
    with int32 ids reads zeros where the table holds values."""
    if native and not jsr.native_kernels_available():
        pytest.skip("native kernels not built here")
    with kernels_set(native), pytest.raises(ValueError, match=message("x")):
        jsr.take(big, jnp.asarray(IDS))


def test_gradients_and_traced_entries_refuse_from_the_shape_alone():
    """Shapes only (``jax.eval_shape``): the gradient of ``take``, exact
    SGD's ``catch_up``, CSR conversion (rows and columns) and the row limit
    itself, which a table of exactly 2**31 - 1 rows meets."""
    ids = jnp.asarray(IDS)
    table = jax.ShapeDtypeStruct((N,), jnp.float32)
    loss = lambda t: jsr.take(t, ids).sum()  # noqa: E731
    with pytest.raises(ValueError, match=message("x")):
        jax.eval_shape(jax.grad(loss), table)
    view_loss = jsr.grad(lambda v: jsr.take(v, ids).sum())
    with pytest.raises(ValueError, match=message("table")):
        jax.eval_shape(lambda t: view_loss(jsr.pull_rows(t, ids)), table)
    opt = jsr.optim.lazy_sgd(0.1, momentum=0.5, lazy="exact")

    def catch_up(p):
        return jsr.optim.catch_up(p, opt.init(p), {"emb": ids})

    with pytest.raises(ValueError, match=message(r"params\['emb'\]")):
        jax.eval_shape(catch_up, {"emb": table})
    csr = lambda x: jsr.CSR.fromdense(x, nse=1)  # noqa: E731
    with pytest.raises(ValueError, match=message("x")):
        jax.eval_shape(csr, jax.ShapeDtypeStruct((N, 1), jnp.float32))
    with pytest.raises(ValueError, match=message("x", what="columns")):
        jax.eval_shape(csr, jax.ShapeDtypeStruct((1, N), jnp.float32))
    # At the limit: accepted, and the results have the right shapes.
    at_limit = jax.ShapeDtypeStruct((LIMIT,), jnp.float32)
    assert max_table_rows() == LIMIT
    check_table_rows(at_limit, "table")
    assert jax.eval_shape(loss, at_limit).shape == ()
    assert jax.eval_shape(lambda t: jsr.pull_rows(t, ids), at_limit).shape == (LIMIT,)
    with pytest.raises(ValueError, match=message("t", LIMIT + 1)):
        check_table_rows(jax.ShapeDtypeStruct((LIMIT + 1, 2), jnp.float32), "t")
