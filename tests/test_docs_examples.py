"""Every ```python block of the docs pages runs, in order, as a reader would paste them.

The blocks of one page share one namespace (later blocks use names defined by
earlier ones). A block that assumes something of the reader (their model, loss,
data or files) gets it from a small preamble in PREAMBLES below, run just
before the block. A preamble runs in its own copy of the namespace and only the
values it binds reach the page, never its imports, so a block that uses `jax`,
`jnp` or `optax` without the page importing it fails here as it would for a
reader. Sizes are small throughout; where a block states a value (`# -> ...`,
`# [0, 1]`, a repr), CHECKS asserts it.

The test fails if a page gains or loses a Python block, or if a new page has
one: update BLOCK_COUNTS, and PREAMBLES / CHECKS for the new block.
"""

from __future__ import annotations

import ast
import doctest
import pathlib
import re
import textwrap
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.experimental import checkify

import jaxsparse_rows as jsr

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"

# The Python blocks of each page. api.md has none (mkdocstrings only).
BLOCK_COUNTS = {
    "index.md": 1,
    "storage.md": 4,
    "ops.md": 4,
    "optimizers.md": 6,
    "training.md": 10,
    "models.md": 11,
    "getting_started.md": 4,
    "migrating_from_mxnet.md": 11,
    "migrating_from_pytorch.md": 4,
    "lazy_or_dense.md": 2,
    "scaling_out.md": 5,
}

# Fence languages the docs may use; anything else (```py, ```pycon, ...) would
# be code this test does not run, so it fails the test until handled here.
KNOWN_FENCE_LANGUAGES = {"python", "bash", "text"}

# What a block assumes of the reader, keyed by (page, block number from 1).
PREAMBLES: dict[tuple[str, int], str] = {
    # `jsr.check(x)`: the user's array.
    ("storage.md", 4): """
x = jsr.row_sparse_array(([[1.0], [2.0]], [0, 3]), shape=(5, 1))
""",
    # "rows = jsr.pull_rows(params["emb"], batch_ids)": an embedding table, a
    # batch of ids (0 is padding, used by block 2) and the user's loss.
    ("ops.md", 1): """
V, D = 20, 3
_rng = np.random.default_rng(0)
params = {"emb": jnp.asarray(_rng.standard_normal((V, D)), jnp.float32), "w": jnp.arange(1.0, 4.0)}
batch_ids = jnp.array([[3, 7, 0], [7, 7, 12], [0, 0, 5], [19, 2, 3]])
batch = {"ids": batch_ids, "y": jnp.array([1.0, -1.0, 0.5, 2.0])}

def loss_fn(rows, w, batch):
    pooled = jsr.take(rows, batch["ids"]).sum(axis=1)
    return jnp.mean((pooled @ w - batch["y"]) ** 2)
""",
    # embedding_bag's `table` is the user's dense embedding table.
    ("ops.md", 2): """
table = params["emb"]
""",
    # The optimizer page's first step: the user's model (table + head) and loss.
    ("optimizers.md", 1): """
V, D = 30, 4
_rng = np.random.default_rng(0)
params = {"emb": jnp.asarray(_rng.standard_normal((V, D)), jnp.float32), "w": jnp.ones(D)}

def loss_fn(params, ids, batch):
    pooled = jsr.take(params["emb"], ids).sum(axis=1)
    return jnp.mean((pooled @ params["w"] - batch) ** 2)
""",
    # The catch_up step is for `lazy_sgd(..., lazy="exact")` (the section it is
    # in) and takes the user's `loss(params, ids, y)`.
    ("optimizers.md", 2): """
opt = jsr.optim.lazy_sgd(0.05, momentum=0.9, weight_decay=0.01, lazy="exact")
loss = loss_fn
""",
    # Mixed precision: the parameters are bfloat16.
    ("optimizers.md", 3): """
params = {"emb": jnp.ones((V, D), jnp.bfloat16), "w": jnp.ones(D, jnp.bfloat16)}
""",
    # inject_hyperparams: float32 parameters again.
    ("optimizers.md", 5): """
params = {"emb": jnp.ones((V, D)), "w": jnp.ones(D)}
""",
    # load_libsvm("train.svm"): the user's file (one-based ids, as the second
    # call's zero_based=False says).
    ("training.md", 1): """
import pathlib
_rng = np.random.default_rng(0)
_lines = []
for _i in range(600):
    _ids = np.sort(_rng.choice(np.arange(1, 51), size=_rng.integers(1, 6), replace=False))
    _feats = " ".join(f"{j}:{v:.3f}" for j, v in zip(_ids, _rng.uniform(-1, 1, _ids.size)))
    _lines.append(f"{_rng.integers(0, 2)} {_feats}")
pathlib.Path("train.svm").write_text("\\n".join(_lines) + "\\n")
""",
    # The CSRIter loop runs the user's `step(params, state, batch)`, here a
    # linear model with a lazy optimizer; "big.svm" is the user's file.
    ("training.md", 2): """
import shutil
shutil.copy("train.svm", "big.svm")
opt = jsr.optim.lazy_sgd(0.1)
params = {"w": jnp.zeros((x.shape[1], 1))}
state = opt.init(params)

@jax.jit
def step(params, state, batch):
    def loss(view):
        pred = jsr.dot(batch.x, view["w"])[:, 0]
        return 0.5 * jnp.sum(jnp.where(batch.mask, pred - batch.y, 0.0) ** 2) / batch.num_rows
    grads = jsr.grad(loss)({"w": jsr.pull_rows(params["w"], batch.x.indices)})
    updates, state = opt.update(grads, state, params)
    return jsr.optim.apply_updates(params, updates), state
""",
    # SVRG: the user's loss over a batch, parameters and batches (the data of
    # examples/svrg_linear_regression.py, smaller).
    ("training.md", 4): """
svrg_x = jsr.random.csr(jax.random.key(0), (40, 10), 0.3, minval=-1.0, maxval=1.0)
_y = svrg_x.to_scipy() @ np.arange(1.0, 11.0) + 0.1 * np.random.default_rng(0).standard_normal(40)
svrg_y = jnp.asarray(_y, jnp.float32)
batches = jsr.io.CSRIter(svrg_x, svrg_y, batch_size=10, shuffle=True, seed=0)
params = {"w": jnp.zeros((10, 1)), "b": jnp.zeros((1,))}

def loss(view, batch):
    pred = jsr.dot(batch.x, view["w"])[:, 0] + view["b"]
    err = jnp.where(batch.mask, pred - batch.y, 0.0)
    return 0.5 * jnp.sum(err**2) / batch.num_rows
""",
    # Micro-batches: the user's per-micro-batch loss, model and optimizer.
    ("training.md", 5): """
V, D, M, B, L = 40, 4, 3, 5, 2
_rng = np.random.default_rng(0)
params = {"emb": jnp.asarray(_rng.standard_normal((V, D)), jnp.float32), "w": jnp.ones(D)}
opt = jsr.optim.lazy_adam(1e-2)
state = opt.init(params)
ids = jnp.asarray(_rng.integers(0, V, (M, B, L)), jnp.int32)
ys = jnp.asarray(_rng.standard_normal((M, B)), jnp.float32)

def loss_fn(view, ids, y):                     # one micro-batch: ids [B, L], y [B]
    pooled = jsr.take(view["emb"], ids).sum(axis=1)
    return jnp.mean((pooled @ view["w"] - y) ** 2)
""",
    # Compiling ahead of time: the user's initialiser, (unjitted) step and one
    # batch with its ShapeDtypeStructs.
    ("training.md", 6): """
V, D, B, L = 1000, 8, 16, 4
opt = jsr.optim.lazy_adam(1e-2)

def init_params():
    return {"emb": jnp.zeros((V, D)), "w": jnp.ones(D)}

def loss_fn(params, ids, y):
    pooled = jsr.take(params["emb"], ids).sum(axis=1)
    return jnp.mean((pooled @ params["w"] - y) ** 2)

def step(params, state, ids, y):
    view = {**params, "emb": jsr.pull_rows(params["emb"], ids)}
    loss, grads = jsr.value_and_grad(loss_fn)(view, ids, y)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state

_rng = np.random.default_rng(0)
ids = jnp.asarray(_rng.integers(0, V, (B, L)), jnp.int32)
y = jnp.asarray(_rng.standard_normal(B), jnp.float32)
ids_spec = jax.ShapeDtypeStruct(ids.shape, ids.dtype)
y_spec = jax.ShapeDtypeStruct(y.shape, y.dtype)
""",
    # Several hosts, checkpoints: orbax is a test extra.
    ("training.md", 9): """
import pytest
pytest.importorskip("orbax.checkpoint", reason="orbax-checkpoint is not installed (test extra)")
""",
    # The framework recipes need the test extra's flax, orbax and equinox.
    ("models.md", 4): """
import pytest
pytest.importorskip("flax.nnx", reason="flax is not installed (test extra)")
""",
    ("models.md", 7): """
import pytest
pytest.importorskip("orbax.checkpoint", reason="orbax-checkpoint is not installed (test extra)")
""",
    # linen and equinox modules are dataclasses, which look their module up in
    # sys.modules: the page's namespace stands for the reader's script there.
    ("models.md", 8): """
import sys, types
sys.modules.setdefault(__name__, types.ModuleType(__name__))
""",
    ("models.md", 10): """
import pytest
pytest.importorskip("equinox", reason="equinox is not installed (test extra)")
""",
}

# Imports a fragment takes for granted and that the test supplies in the
# page's namespace (only for pages that are not tutorials).
FRAGMENT_IMPORTS: dict[tuple[str, int], str] = {}

# Blocks that warn on purpose: (category, message regex).
EXPECTED_WARNINGS = {
    ("storage.md", 3): (
        jsr.StorageFallbackWarning,
        re.escape(
            "log(row_sparse): no sparse implementation, the sparse inputs are densified and "
            "the result is dense (correct but as costly as the dense op)."
        ),
    ),
    ("migrating_from_mxnet.md", 5): (
        jsr.StorageFallbackWarning,
        re.escape("log(row_sparse): no sparse implementation"),
    ),
}

# Size reductions, as tests/test_readme.py does: (page, block) -> [(old, new)].
# The blocks' own sizes are already small (the 2**20 feature counts only set
# a CSR's column count and a [2**20, 1] weight), so none is needed yet.
SHRINK: dict[tuple[str, int], list[tuple[str, str]]] = {}

CHECKS = {}


def check(page: str, block: int):
    """Registers ``fn(ns, shown)``, run after the block: ``ns`` is the page's
    namespace, ``shown`` maps each bare expression of the block (its source
    text) to its value, as a REPL would show it."""

    def register(fn):
        CHECKS[page, block] = fn
        return fn

    return register


# --- the blocks -------------------------------------------------------------

_FENCE = re.compile(r"^( *)```(\S*)[^\n]*\n(.*?)^\1```[ \t]*$", flags=re.S | re.M)


def fenced_blocks(text: str):
    """(language, first line number of the code, dedented code) of every fence."""
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start(3)) + 1
        yield m.group(2), line, textwrap.dedent(m.group(3))


def python_blocks(page: str) -> list[tuple[int, str]]:
    text = (DOCS / page).read_text()
    return [(line, code) for lang, line, code in fenced_blocks(text) if lang == "python"]


def run_statements(code: str, ns: dict, filename: str, line: int) -> dict:
    """Runs ``code`` in ``ns`` statement by statement; returns the values of
    its bare expressions by source text. Tracebacks point at the docs line."""
    source = "\n" * (line - 1) + code
    shown = {}
    for stmt in ast.parse(source, filename).body:
        if isinstance(stmt, ast.Expr):
            expr = compile(ast.Expression(stmt.value), filename, "eval")
            shown[ast.get_source_segment(source, stmt)] = eval(expr, ns)
        else:
            exec(compile(ast.Module([stmt], type_ignores=[]), filename, "exec"), ns)
    return shown


def run_doctest(code: str, ns: dict, name: str, filename: str, line: int) -> None:
    """A ``>>>`` block: runs it as a doctest (the pytest doctest options)."""
    test = doctest.DocTestParser().get_doctest(code, ns, name, filename, line - 1)
    flags = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
    out: list[str] = []
    runner = doctest.DocTestRunner(optionflags=flags)
    result = runner.run(test, out=out.append, clear_globs=False)
    assert result.failed == 0, "".join(out)


def run_preamble(code: str, ns: dict) -> None:
    """Runs a preamble in a copy of ``ns`` that also has jax, jnp, np, optax and
    jsr; copies back what it binds, but no module (nor ``_private`` names), so the page's own blocks
    must import what they use."""
    private = {"jax": jax, "jnp": jnp, "np": np, "optax": optax, "jsr": jsr, **ns}
    exec(compile(textwrap.dedent(code), "<preamble>", "exec"), private)
    for name, value in private.items():
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        if name not in ns or ns[name] is not value:
            ns[name] = value


def run_page(page: str) -> None:
    blocks = python_blocks(page)
    assert len(blocks) == BLOCK_COUNTS[page], (
        f"{page} has {len(blocks)} python blocks, the test knows {BLOCK_COUNTS[page]}: "
        "update BLOCK_COUNTS, PREAMBLES and CHECKS"
    )
    filename = str(DOCS / page)
    ns: dict = {"__name__": f"docs_{page[:-3]}"}
    for number, (line, code) in enumerate(blocks, start=1):
        key = (page, number)
        for old, new in SHRINK.get(key, []):
            assert old in code, f"{page} block {number} no longer contains {old!r}"
            code = code.replace(old, new)
        if key in FRAGMENT_IMPORTS:
            exec(FRAGMENT_IMPORTS[key], ns)
        if key in PREAMBLES:
            run_preamble(PREAMBLES[key], ns)
        shown: dict = {}
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            if key in EXPECTED_WARNINGS:
                category, match = EXPECTED_WARNINGS[key]
                with pytest.warns(category, match=match):
                    shown = run_statements(code, ns, filename, line)
            elif code.lstrip().startswith(">>>"):
                run_doctest(code, ns, f"{page} block {number}", filename, line)
            else:
                shown = run_statements(code, ns, filename, line)
        if key in CHECKS:
            CHECKS[key](ns, shown)


# --- what the blocks state ------------------------------------------------------


@check("index.md", 1)
def _(ns, shown):
    expected = [[0, 0], [1, 2], [0, 0], [0, 0], [3, 4], [0, 0]]
    np.testing.assert_array_equal(shown["a.asnumpy()"], expected)
    assert shown["(a * 2).stype"] == "row_sparse"
    assert shown["jsr.stype(a + jnp.ones((6, 2)))"] == "default"
    assert repr(ns["g"]) == "RowSparse(float32[5, 2], rows=3)"
    g_dense = [[7, 7], [9, 9], [8, 8], [0, 0], [0, 0]]
    np.testing.assert_allclose(ns["params"]["w"], -0.1 * np.array(g_dense), rtol=1e-6)
    stepped = ns["step"](ns["params"], ns["g"])  # the jitted update runs
    np.testing.assert_allclose(stepped["w"], -0.2 * np.array(g_dense), rtol=1e-6)


@check("storage.md", 1)
def _(ns, shown):
    assert repr(shown["a"]) == "RowSparse(float32[6, 2], rows=2)"
    data, indices = shown["a.data, a.indices"]
    np.testing.assert_array_equal(data, [[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(indices, [1, 4])
    expected = [[0, 0], [1, 2], [0, 0], [0, 0], [3, 4], [0, 0]]
    np.testing.assert_array_equal(shown["a.asnumpy()"], expected)


@check("storage.md", 2)
def _(ns, shown):
    assert jsr.stype(ns["rsp"]) == "row_sparse"
    assert jsr.stype(ns["dense"]) == "default"
    assert jsr.stype(ns["csr"]) == "csr"
    np.testing.assert_array_equal(ns["dense"], np.ones((2, 2)))
    np.testing.assert_array_equal(ns["csr"].todense(), np.ones((2, 2)))


@check("storage.md", 3)
def _(ns, shown):
    assert jsr.stype(ns["d"]) == "default"  # "the result is dense"
    np.testing.assert_array_equal(ns["d"], jnp.log(ns["a"].todense()))


@check("storage.md", 4)
def _(ns, shown):
    # `x` (valid) did not raise; "raises if x breaks an invariant":
    x = ns["x"]
    broken = jax.tree.unflatten(jax.tree.structure(x), [x.data, x.indices[::-1]])
    err, _ = checkify.checkify(jax.jit(jsr.check))(broken)
    with pytest.raises(checkify.JaxRuntimeError):
        err.throw()


@check("ops.md", 1)
def _(ns, shown):
    rows, g_rows, g_w = ns["rows"], ns["g_rows"], ns["g_w"]
    assert isinstance(g_rows, jsr.RowSparse)
    np.testing.assert_array_equal(g_rows.indices, rows.indices)  # "the same indices"
    params, batch, loss_fn = ns["params"], ns["batch"], ns["loss_fn"]
    dense_loss, (g_table, g_w_dense) = jax.value_and_grad(loss_fn, argnums=(0, 1))(
        params["emb"], params["w"], batch
    )
    np.testing.assert_allclose(ns["loss"], dense_loss, rtol=1e-5)
    np.testing.assert_allclose(g_rows.todense(), g_table, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_w, g_w_dense, rtol=1e-5)  # "exactly as jax gives it"


@check("ops.md", 2)
def _(ns, shown):
    ids, table = np.asarray(ns["ids"]), np.asarray(ns["table"])
    pooled = ns["pooled"]
    assert pooled.shape == (ids.shape[0], table.shape[1])  # [B, D]
    for b, bag in enumerate(ids):
        real = bag[bag != 0]
        expected = table[real].mean(axis=0) if real.size else np.zeros(table.shape[1])
        np.testing.assert_allclose(pooled[b], expected, rtol=1e-5, atol=1e-6)
    # the view does not list the padding row 0
    assert 0 not in np.asarray(ns["view"].indices)


@check("ops.md", 3)
def _(ns, shown):
    np.testing.assert_array_equal(shown["jsr.retain(a, [0, 1]).indices"], [0, 1])
    np.testing.assert_array_equal(
        jsr.retain(ns["a"], [0, 1]).data, [[1.0, 2.0], [0.0, 0.0]]
    )  # "row 1 is stored, as zeros"


@check("optimizers.md", 1)
def _(ns, shown):
    params, state, step = ns["params"], ns["state"], ns["step"]
    mu = optax.tree_utils.tree_get(state, "mu")  # "dense [V, ...] state"
    assert jax.tree.map(jnp.shape, mu) == jax.tree.map(jnp.shape, params)
    batch_a = (jnp.array([[1, 5], [5, 9], [2, 1]]), jnp.array([1.0, -1.0, 0.5]))
    batch_b = (jnp.array([[3, 4], [4, 7], [3, 3]]), jnp.array([0.5, 2.0, -1.0]))
    for ids, batch in (batch_a, batch_b):
        new_params, state = step(params, state, ids, batch)
        moved = np.any(np.asarray(new_params["emb"] != params["emb"]), axis=1)
        # Lazy: only the rows of this batch move. (A dense gradient would move
        # batch_a's rows again on the second step, through Adam's momentum.)
        np.testing.assert_array_equal(np.nonzero(moved)[0], np.unique(np.asarray(ids)))
        params = new_params
    assert int(optax.tree_utils.tree_get(state, "count")) == 2


@check("optimizers.md", 2)
def _(ns, shown):
    # "With catch_up, training equals dense SGD to float tolerance after flush."
    params, opt, loss = ns["params"], ns["opt"], ns["loss"]
    step = jax.jit(ns["step"])
    dense_opt = optax.chain(optax.add_decayed_weights(0.01), optax.sgd(0.05, momentum=0.9))

    @jax.jit
    def dense_step(params, state, ids, y):
        updates, state = dense_opt.update(jax.grad(loss)(params, ids, y), state, params)
        return optax.apply_updates(params, updates), state

    state, dense_params, dense_state = opt.init(params), params, dense_opt.init(params)
    batches = [
        (jnp.array([[1, 2], [3, 4]]), jnp.array([1.0, -1.0])),
        (jnp.array([[5, 6], [7, 8]]), jnp.array([0.5, 2.0])),
        (jnp.array([[1, 5], [2, 9]]), jnp.array([-1.0, 1.0])),
    ]
    for ids, y in batches:
        params, state = step(params, state, ids, y)
        dense_params, dense_state = dense_step(dense_params, dense_state, ids, y)
    params, state = jsr.optim.flush(params, state)
    for name in ("emb", "w"):
        np.testing.assert_allclose(params[name], dense_params[name], rtol=1e-5, atol=1e-6)


@check("optimizers.md", 3)
def _(ns, shown):
    moments = ns["opt"].init(ns["params"])  # the first state: "mu float32, nu bf16"
    mu, nu = (optax.tree_utils.tree_get(moments, name) for name in ("mu", "nu"))
    assert {leaf.dtype for leaf in jax.tree.leaves(mu)} == {jnp.dtype(jnp.float32)}
    assert {leaf.dtype for leaf in jax.tree.leaves(nu)} == {jnp.dtype(jnp.bfloat16)}
    state = ns["state"]  # the second, built from float32 shapes
    floats = [leaf for leaf in jax.tree.leaves(state) if jnp.issubdtype(leaf.dtype, jnp.floating)]
    assert floats and {leaf.dtype for leaf in floats} == {jnp.dtype(jnp.float32)}


@check("optimizers.md", 5)
def _(ns, shown):
    opt, state, params = ns["opt"], ns["state"], ns["params"]
    assert float(state.hyperparams["learning_rate"]) == pytest.approx(3e-4)
    grads = {
        "emb": jsr.RowSparse(jnp.full((1, 4), 0.5), [3], shape=(30, 4)),
        "w": jnp.full(4, -0.5),
    }
    update = jax.jit(opt.update)
    updates, _ = update(grads, state, params)
    # Adam's first step moves each entry by about the learning rate: the new one.
    np.testing.assert_allclose(np.abs(updates["emb"].data), 3e-4, rtol=1e-3)
    np.testing.assert_allclose(np.abs(updates["w"]), 3e-4, rtol=1e-3)
    # "a float32 array, like the value it replaces": nothing compiles again;
    # "a Python float ... would compile once more".
    hparams = state.hyperparams
    for value, compiled in ((jnp.asarray(1e-4, jnp.float32), 1), (1e-4, 2)):
        hparams["learning_rate"] = value
        update(grads, state, params)
        assert update._cache_size() == compiled
    hparams["learning_rate"] = jnp.asarray(3e-4, jnp.float32)


@check("optimizers.md", 6)
def _(ns, shown):
    opt, state, params = ns["opt"], ns["state"], ns["params"]
    assert jax.tree.leaves(state.inner_state[0].trace) == []  # no buffer for any leaf
    grads = {
        "emb": jsr.RowSparse(jnp.full((1, 4), 0.5), [3], shape=(30, 4)),
        "w": jnp.full(4, -0.5),
    }
    # "params only where a rule reads them": none here, also under jit.
    updates, _ = jax.jit(opt.update)(grads, state)
    np.testing.assert_allclose(np.asarray(updates["emb"].data), -0.05)
    np.testing.assert_allclose(np.asarray(updates["w"]), 0.05)
    # Without static_args the injected default weight_decay is traced: the
    # update needs params, and the error says how to keep it static.
    injected = optax.inject_hyperparams(jsr.optim.lazy_sgd)(learning_rate=0.1)
    with pytest.raises(ValueError, match=r"needs the current parameters.*static_args"):
        jax.jit(injected.update)(grads, injected.init(params))
    trace = injected.init(params).inner_state[0].trace  # "keeps a [V, D] buffer"
    assert trace["emb"].shape == params["emb"].shape


@check("training.md", 1)
def _(ns, shown):
    x, y = ns["x"], ns["y"]
    assert x.shape == (600, 2**20) and y.shape == (600,)
    assert " 0:" not in pathlib.Path("copy.svm").read_text()  # "one-based ids"
    x2, y2 = jsr.io.load_libsvm("copy.svm", num_features=2**20)  # "round-trips"
    for field in ("data", "indices", "indptr"):
        np.testing.assert_array_equal(getattr(x2, field), getattr(x, field))
    np.testing.assert_array_equal(y2, y)


@check("training.md", 2)
def _(ns, shown):
    assert np.any(np.asarray(ns["params"]["w"]) != 0)  # the epoch's steps ran
    batches = list(ns["it"])  # the LibSVMIter over big.svm
    assert len(batches) == 3  # 600 rows, 256 a batch, the last one padded
    assert sum(int(b.num_rows) for b in batches) == 600
    assert batches[0].x.shape == (256, 2**20)


@check("training.md", 3)
def _(ns, shown):
    assert int(ns["x"].nnz) == 1000  # "exactly 1000 entries"
    assert int(ns["g"].nnz_rows) == 100  # "100 of the rows"


@check("training.md", 4)
def _(ns, shown):
    x, y = ns["svrg_x"], ns["svrg_y"]

    @jax.jit
    def mse(p):
        return jnp.mean((jsr.dot(x, p["w"])[:, 0] + p["b"] - y) ** 2)

    start = {"w": jnp.zeros((10, 1)), "b": jnp.zeros((1,))}
    assert mse(ns["params"]) < 0.1 * mse(start)
    grads = jax.jit(ns["grad_fn"])(start, next(iter(ns["batches"])))
    assert isinstance(grads["w"], jsr.RowSparse)  # "RowSparse for w, dense for b"
    assert isinstance(grads["b"], jax.Array)


@check("training.md", 5)
def _(ns, shown):
    params, ids, ys = ns["params"], ns["ids"], ns["ys"]
    view = {**params, "emb": jsr.pull_rows(params["emb"], ids)}
    grads = jsr.grad(ns["mean_loss"])(view, ids, ys)
    assert isinstance(grads["emb"], jsr.RowSparse)  # one RowSparse, the view's rows
    np.testing.assert_array_equal(grads["emb"].indices, view["emb"].indices)

    dense = jax.grad(ns["mean_loss"])(params, ids, ys)  # jax's dense gradient
    np.testing.assert_allclose(grads["emb"].todense(), dense["emb"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grads["w"], dense["w"], rtol=1e-4)
    new_params, _ = ns["step"](params, ns["state"], ids, ys)
    changed = np.nonzero(np.any(np.asarray(new_params["emb"] != params["emb"]), axis=1))[0]
    np.testing.assert_array_equal(changed, np.unique(np.asarray(ids)))


@check("training.md", 6)
def _(ns, shown):
    assert isinstance(ns["step"], jax.stages.Compiled)  # compiled before the arrays
    params, state = ns["step"](ns["params"], ns["state"], ns["ids"], ns["y"])
    assert int(optax.tree_utils.tree_get(state, "count")) == 2


@check("training.md", 7)
def _(ns, shown):
    it, part, x1 = ns["it"], ns["part"], ns["x1"]
    assert it.rows == range(600)  # one process: every row
    batches = list(part)  # "the lines that start in its range": a quarter of the file
    assert sum(int(b.num_rows) for b in batches) == x1.shape[0] > 0
    assert x1.shape[0] < 600 and x1.shape[1] == 2**20
    whole = [jsr.io.load_libsvm("big.svm", 2**20, False, num_parts=4, part_index=p)[1]
             for p in range(4)]  # fmt: skip
    np.testing.assert_array_equal(np.concatenate(whole), jsr.io.load_libsvm("big.svm")[1])


@check("training.md", 8)
def _(ns, shown):
    params = ns["params"]
    assert params["emb"].sharding.is_equivalent_to(ns["by_rows"], 2)  # "the table's rows"
    assert np.isfinite(float(ns["loss"]))
    mu = optax.tree_utils.tree_get(ns["state"], "mu")
    assert mu["emb"].shape == params["emb"].shape


@check("training.md", 9)
def _(ns, shown):
    restored, params, state = ns["restored"], ns["params"], ns["state"]
    saved = {"params": params, "opt_state": state}
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(saved), strict=True):
        np.testing.assert_array_equal(a, b)
    assert restored["params"]["emb"].sharding.is_equivalent_to(ns["by_rows"], 2)


@check("training.md", 10)
def _(ns, shown):
    start = ns["init_params"]()
    params = ns["svrg_params"]
    assert all(np.all(np.isfinite(np.asarray(leaf))) for leaf in jax.tree.leaves(params))
    assert np.any(np.asarray(params["emb"]) != np.asarray(start["emb"]))
    mu = jsr.svrg.full_gradient(ns["grad_fn"], ns["svrg_state"].snapshot, ns["epoch"])
    np.testing.assert_allclose(ns["svrg_state"].full_grad["w"], mu["w"], rtol=1e-5, atol=1e-7)


@check("models.md", 2)
def _(ns, shown):
    params, ids, y, loss_fn = ns["params"], ns["ids"], ns["y"], ns["loss_fn"]
    g = ns["grads"]
    assert repr(shown['grads["emb"]']) == "RowSparse(float32[10000, 16], rows=4, capacity=6)"
    assert shown['grads["w"].shape'] == (16,)
    dense = jax.grad(loss_fn)(params, ids, y)  # "the values of jax.grad's dense gradient"
    np.testing.assert_allclose(g["emb"].todense(), dense["emb"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(g["w"], dense["w"], rtol=1e-5)
    # "moves rows 3, 7, 42 and 9999 only": one more step, from a copy of the params
    before = jax.tree.map(jnp.copy, params)
    after, _, _ = ns["step"](jax.tree.map(jnp.copy, params), ns["state"], ids, y)
    moved = np.nonzero(np.any(np.asarray(after["emb"] != before["emb"]), axis=1))[0]
    np.testing.assert_array_equal(moved, [3, 7, 42, 9999])


@check("models.md", 3)
def _(ns, shown):
    assert shown['jsr.stype(grads["emb"])'] == "default"
    message = ns["message"]
    assert "`params['emb']`" in message and "`transpose`" in message
    grads = ns["grads"]  # by_size marks "emb" only
    assert isinstance(grads["emb"], jsr.RowSparse) and not isinstance(grads["w"], jsr.RowSparse)


def _moved_rows(before, after):
    return np.nonzero(np.any(np.asarray(before) != np.asarray(after), axis=1))[0]


@check("models.md", 4)
def _(ns, shown):
    assert np.isfinite(float(ns["loss"]))


@check("models.md", 5)
def _(ns, shown):
    from flax import nnx

    g = shown["grads.embed.embedding.get_value()"]
    assert repr(g) == "RowSparse(float32[10000, 16], rows=4, capacity=6)"
    model, ids, labels = ns["model"], ns["ids"], ns["labels"]
    (_, _), dense = nnx.value_and_grad(ns["loss_fn"], has_aux=True)(model, ids, labels)
    np.testing.assert_allclose(g.todense(), dense["embed"]["embedding"][...], rtol=1e-5, atol=1e-7)
    # "moves rows 3, 7, 42 and 9999": a step from a fresh model
    fresh = ns["ClickModel"](10_000, 16, rngs=nnx.Rngs(0))
    before = np.array(fresh.embed.embedding[...])  # a copy: a view would keep the buffer
    opt = nnx.Optimizer(fresh, jsr.optim.lazy_adam(1e-2), wrt=nnx.Param)
    table = fresh.embed.embedding.get_value()
    ns["train_step"](fresh, opt, ids, labels)
    assert table.is_deleted()  # donated
    np.testing.assert_array_equal(_moved_rows(before, fresh.embed.embedding[...]), [3, 7, 42, 9999])


@check("models.md", 6)
def _(ns, shown):
    model, optimizer = ns["model"], ns["optimizer"]
    count = int(model.dropout.rngs.count[...])
    ns["train_step"](model, optimizer, ns["ids"], ns["labels"])
    assert int(model.dropout.rngs.count[...]) == count + 1  # the random stream advances
    assert int(optimizer.step[...]) == 2


@check("models.md", 7)
def _(ns, shown):
    from flax import nnx

    restored = jax.tree.leaves(ns["restored"])
    current = jax.tree.leaves({"model": nnx.state(ns["model"]), "opt": nnx.state(ns["optimizer"])})
    assert len(restored) == len(current)
    for a, b in zip(restored, current, strict=True):
        np.testing.assert_array_equal(a, b)  # the round trip is exact


@check("models.md", 9)
def _(ns, shown):
    state, ids, labels = ns["state"], ns["ids"], ns["labels"]
    assert int(state.step) == 1
    before = ns["model"].init(jax.random.key(0), ids)["params"]["Embed_0"]["embedding"]
    after = np.asarray(state.params["Embed_0"]["embedding"])
    np.testing.assert_array_equal(_moved_rows(before, after), [3, 7, 42, 9999])

    def loss_fn(params):
        logits = state.apply_fn({"params": params}, ids)
        return optax.sigmoid_binary_cross_entropy(logits, labels).mean()

    grads = jsr.grad(loss_fn, sparse="auto")(state.params)
    assert isinstance(grads["Embed_0"]["embedding"], jsr.RowSparse)
    assert not isinstance(grads["Dense_0"]["kernel"], jsr.RowSparse)


@check("models.md", 11)
def _(ns, shown):
    start = ns["EqxClickModel"](10_000, 16, jax.random.key(0)).embed.weight
    after = ns["model"].embed.weight
    np.testing.assert_array_equal(_moved_rows(start, after), [3, 7, 42, 9999])
    assert int(optax.tree_utils.tree_get(ns["opt_state"], "count")) == 1


@check("getting_started.md", 1)
def _(ns, shown):
    assert repr(shown["a"]) == "RowSparse(float32[5, 2], rows=2)"
    np.testing.assert_array_equal(shown["a.indices"], [0, 3])
    expected = [[1, 2], [0, 0], [0, 0], [3, 4], [0, 0]]
    np.testing.assert_array_equal(shown["a.todense()"], expected)


@check("getting_started.md", 2)
def _(ns, shown):
    assert shown["jsr.stype(a * 2)"] == "row_sparse"
    assert shown["jsr.stype(a + jnp.ones((5, 2)))"] == "default"
    assert isinstance(ns["a"] + jnp.ones((5, 2)), jax.Array)  # "a dense jax.Array"


@check("getting_started.md", 3)
def _(ns, shown):
    expected = [[1, 0, 0, 0, 2, 0], [0, 0, 3, 0, 0, 0], [0, 0, 0, 0, 4, 0]]
    np.testing.assert_array_equal(shown["x.todense()"], expected)
    np.testing.assert_array_equal(shown["jsr.dot(x, w)"], [[8], [6], [16]])
    g = shown["jsr.dot(x, jnp.ones((3, 1)), transpose_a=True)"]
    assert isinstance(g, jsr.RowSparse) and int(g.nnz_rows) == 3  # "over features 0, 2, 4"
    np.testing.assert_array_equal(g.indices[:3], [0, 2, 4])
    np.testing.assert_array_equal(g.todense()[:, 0], [1, 0, 3, 0, 6, 0])


@check("getting_started.md", 4)
def _(ns, shown):
    assert float(shown["loss"]) < 0.05  # "about 0.01"
    params, batch = ns["params"], next(iter(ns["batches"]))
    view = {"w": jsr.pull_rows(params["w"], batch.x.indices), "b": params["b"]}
    grads = jsr.grad(ns["loss_fn"])(view, batch)
    assert isinstance(grads["w"], jsr.RowSparse)  # "grads["w"]: RowSparse"
    assert isinstance(grads["b"], jax.Array)


@check("migrating_from_mxnet.md", 1)
def _(ns, shown):
    assert shown["a.stype, c.stype, z.stype"] == ("row_sparse", "csr", "row_sparse")
    np.testing.assert_array_equal(shown["a.indices"], [1, 3])
    np.testing.assert_array_equal(shown["c.indptr"], [0, 2, 2, 3])
    out = shown["a.asnumpy()"]
    assert isinstance(out, np.ndarray) and out.flags.writeable
    np.testing.assert_array_equal(out, [[0, 0], [1, 2], [0, 0], [3, 4]])


@check("migrating_from_mxnet.md", 2)
def _(ns, shown):
    a = ns["a"]
    assert jsr.stype(ns["d"]) == "default"
    assert jsr.stype(ns["r"]) == "row_sparse"
    np.testing.assert_array_equal(ns["r"].indices, [1, 3])  # "rows 1 and 3"
    assert ns["b"] is not a and ns["b"].data is not a.data  # "new buffers"
    np.testing.assert_array_equal(ns["b"].todense(), a.todense())
    assert jsr.stype(ns["e"]) == "default"
    np.testing.assert_array_equal(ns["e"], a.todense())


@check("migrating_from_mxnet.md", 3)
def _(ns, shown):
    np.testing.assert_array_equal(shown["jsr.retain(a, [1, 2]).indices"], [1, 2])
    np.testing.assert_array_equal(jsr.retain(ns["a"], [1, 2]).data, [[1, 2], [0, 0]])
    assert isinstance(ns["g"], jsr.RowSparse)
    np.testing.assert_array_equal(shown["g.todense()"], [[7, 7], [9, 9], [8, 8], [0, 0]])


@check("migrating_from_mxnet.md", 4)
def _(ns, shown):
    values = list(shown.values())
    assert values == ["row_sparse", "row_sparse", "row_sparse", "default"]


@check("migrating_from_mxnet.md", 5)
def _(ns, shown):
    assert jsr.stype(ns["d"]) == "default"
    np.testing.assert_array_equal(ns["d"], jnp.log(ns["a"].todense()))


@check("migrating_from_mxnet.md", 7)
def _(ns, shown):
    lazy = shown["jsr.optim.apply_updates(w, lazy_updates)"]
    dense = shown["jsr.optim.apply_updates(w, dense_updates)"]
    np.testing.assert_allclose(lazy, [[1, 1], [0.94, 0.94], [0.94, 0.94], [1, 1]], rtol=1e-6)
    np.testing.assert_allclose(
        dense, [[0.99, 0.99], [0.94, 0.94], [0.94, 0.94], [0.99, 0.99]], rtol=1e-6
    )


@check("migrating_from_mxnet.md", 8)
def _(ns, shown):
    assert float(ns["mse"]) < 1  # "below 1", as MXNet's tutorial asserts
    assert ns["run_epoch"]._cache_size() == 1  # one compiled epoch


@check("migrating_from_mxnet.md", 9)
def _(ns, shown):
    assert shown["batch.x.shape, batch.y.shape"] == ((100, 100), (100,))
    libsvm = list(ns["libsvm"])
    np.testing.assert_allclose(
        jnp.concatenate([b.x.todense() for b in libsvm]), ns["x"].todense(), rtol=1e-5
    )
    assert sum(int(b.num_rows) for b in ns["arrays"]) == 1000


@check("migrating_from_mxnet.md", 10)
def _(ns, shown):
    assert repr(ns["rows"]) == "RowSparse(float32[1000, 8], rows=3, capacity=4)"
    np.testing.assert_array_equal(shown["rows.indices"], [3, 7, 999, 1000])


@check("migrating_from_mxnet.md", 11)
def _(ns, shown):
    x, y = ns["x"], ns["y"]

    def mse(p):
        return float(jnp.mean((jsr.dot(x, p["w"])[:, 0] + p["b"] - y) ** 2))

    start = {"w": jnp.zeros((100, 1)), "b": jnp.zeros(1)}
    assert mse(ns["svrg_params"]) < 0.5 * mse(start)


@check("migrating_from_pytorch.md", 1)
def _(ns, shown):
    np.testing.assert_array_equal(ns["moved"], [1, 5, 9, 42])
    assert np.isfinite(float(ns["loss"]))


@check("migrating_from_pytorch.md", 2)
def _(ns, shown):
    table, pooled = np.asarray(ns["params"]["emb"]), ns["pooled"]
    assert pooled.shape == (2, 16)
    np.testing.assert_allclose(pooled[0], table[1] + 0.5 * table[5], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pooled[1], 2.0 * table[7], rtol=1e-5, atol=1e-6)
    assert 0 not in np.asarray(ns["view"].indices)


@check("migrating_from_pytorch.md", 3)
def _(ns, shown):
    assert shown['jsr.stype(grads["emb"])'] == "row_sparse"
    params, ids, y = ns["params"], ns["ids"], ns["y"]
    dense = jax.grad(ns["plain_loss"])(params, ids, y)
    np.testing.assert_allclose(ns["grads"]["emb"].todense(), dense["emb"], rtol=1e-5, atol=1e-7)


@check("migrating_from_pytorch.md", 4)
def _(ns, shown):
    assert np.isfinite(float(ns["loss"]))
    accumulators = optax.tree_utils.tree_get(ns["state"], "sum_of_squares")
    assert np.any(np.asarray(accumulators["emb"]) != 0)


@check("lazy_or_dense.md", 1)
def _(ns, shown):
    assert ns["touched"] == pytest.approx(0.064, abs=0.001)  # "about 0.064"


@check("lazy_or_dense.md", 2)
def _(ns, shown):
    updates, w = ns["updates"], ns["w"]
    assert not isinstance(updates, jsr.RowSparse)  # every row, by the dense rule
    dense_opt = optax.adam(1e-3)
    expected, _ = dense_opt.update(ns["grad"].todense(), dense_opt.init(w), w)
    np.testing.assert_allclose(updates, expected, rtol=1e-6, atol=1e-9)


@check("scaling_out.md", 1)
def _(ns, shown):
    assert shown['params["emb"].sharding.is_equivalent_to(by_rows, 2)'] is True
    assert np.isfinite(float(ns["loss"]))


@check("scaling_out.md", 2)
def _(ns, shown):
    assert ns["params"]["emb"].sharding.is_equivalent_to(ns["by_rows"], 2)
    assert np.isfinite(float(ns["loss"]))


@check("scaling_out.md", 3)
def _(ns, shown):
    message = ns["err"].get()  # "the ids name 8 distinct rows ..., more than `capacity` = 2"
    assert "the ids name 8 distinct rows of one shard, more than `capacity` = 2" in message


@check("scaling_out.md", 4)
def _(ns, shown):
    assert list(shown.values())[-1] is True


@check("scaling_out.md", 5)
def _(ns, shown):
    table, v_real = np.asarray(ns["table"]), ns["V_real"]
    np.testing.assert_array_equal(ns["rows"], np.tile(table[v_real - 1], (ns["n"], 1)))


# --- the tests -----------------------------------------------------------------


def test_every_page_with_python_blocks_is_known():
    found = {}
    for path in sorted(DOCS.glob("*.md")):
        langs = [lang for lang, _, _ in fenced_blocks(path.read_text())]
        unknown = set(langs) - KNOWN_FENCE_LANGUAGES
        assert not unknown, f"{path.name}: fences {unknown} that this test does not run"
        if "python" in langs:
            found[path.name] = langs.count("python")
    assert found == BLOCK_COUNTS
    for page, number in [*PREAMBLES, *CHECKS, *EXPECTED_WARNINGS, *FRAGMENT_IMPORTS, *SHRINK]:
        assert 1 <= number <= BLOCK_COUNTS[page], (page, number)


@pytest.mark.parametrize("page", sorted(BLOCK_COUNTS), ids=lambda p: p[:-3])
def test_docs_page_examples_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the blocks read and write files (train.svm, copy.svm)
    run_page(page)
