"""Lazy optimizer steps on a large embedding table: ``jsr.optim.lazy_adam``,
``lazy_sgd`` (momentum), ``lazy_adagrad`` and ``lazy_rowwise_adagrad`` against
the dense optax update on the densified gradient, torch's sparse optimizers and
the gather/scatter floor.

Default workload on CPU: parameters [V = 1,000,000 x D = 64] float32, a
RowSparse gradient with K = 4096 distinct rows; on a GPU, V = 10,000,000 and
K = 262,144 (the table, the state and the gradients on the device, torch's
optimizers on CUDA). Every JAX step is one jitted
function with the parameters and optimizer state donated, doing update + apply.
The floor is a jitted, donated step that only gathers and scatters those K rows
of the parameters and of each state array, in two implementations: XLA's
gather and scatter, and the row kernels jsr's own steps use (its native CPU
kernels, where built). The target takes the faster of the two in each run.
It is the least a JAX step with one gather and one scatter per array does,
not the least work a machine could do: a fused loop over the rows outside
JAX would be faster still. A pool of gradients with different rows is cycled
so no contender keeps its rows in cache.

jsr's row kernels are CPU-only (on a GPU its lazy steps run fused Pallas
kernels, timed rule by rule in ``fused_rows.py``, and its row moves are
XLA's), so on a GPU the floor is XLA's alone. Each table is followed by its
memory traffic: the bytes the update must move (read and write the K rows of
every array, read the gradient) over the median time, in GB/s, beside a
device copy's bandwidth.

Targets, for each optimizer: at least 40x faster than dense optax, at least 1.8x
faster than the torch sparse optimizer (torch with as many threads as XLA's
CPU pool; a 1-thread torch column is timed beside it), within 1.25x of the
faster floor.
``--sweep`` adds V from 1e4 to 1e7 at fixed K (the lazy step must stay flat in
V: its time may grow with V no more than 1.25x as fast as the XLA floor's,
whose growth is cache and TLB misses alone; every cell of this sweep times one
contender at a time, as the 1e7 cell must, in ``--rounds`` blocks with a fresh
setup each) and K from 256 to 65,536 at fixed V.

Run ``python benchmarks/lazy_update.py --help`` for the options.
"""

from __future__ import annotations

import functools
import itertools
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h  # noqa: E402

import jaxsparse_rows as jsr  # noqa: E402

LR = 1e-3
N_GRADS = 8  # size of the pool of gradients cycled through
# rows V, row width D, distinct rows K, by mode
SIZES = {
    "cpu": {"vocab": 1_000_000, "dim": 64, "touched": 4096},
    "gpu": {"vocab": 10_000_000, "dim": 64, "touched": 262_144},
    "smoke": {"vocab": 5000, "dim": 8, "touched": 64},
}


@dataclass
class Workload:
    v: int
    d: int
    k: int
    grads: list[tuple[np.ndarray, np.ndarray]]  # (sorted unique indices [K], data [K, D])


def make_workload(v: int, d: int, k: int, seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)
    k = min(k, v)
    grads = []
    for _ in range(N_GRADS):
        idx = np.sort(rng.choice(v, k, replace=False)).astype(np.int32)
        grads.append((idx, rng.standard_normal((k, d), dtype=np.float32)))
    return Workload(v, d, k, grads)


def init_params(v: int, d: int) -> jax.Array:
    """A fresh [V, D] table, built on the device (no host copy)."""
    return jax.jit(lambda k: jax.random.normal(k, (v, d), jnp.float32) * 0.01)(jax.random.key(0))


def jax_grads(w: Workload) -> list[tuple[jax.Array, jax.Array]]:
    return [(jnp.asarray(i), jnp.asarray(x)) for i, x in w.grads]


def stateful(step_fn: Callable, state: tuple, grads: list) -> Callable[[], object]:
    """Wraps ``state = step_fn(*state, *grad)`` cycling over ``grads``."""
    box = [h.block(state)]  # finish building the state before the first timed call
    pool = itertools.cycle(grads)

    def step():
        box[0] = step_fn(*box[0], *next(pool))
        return box[0]

    return step


# --------------------------------------------------------------------------- jsr


def jsr_contender(name: str, factory: str, w: Workload, **kw) -> h.Contender:
    def setup():
        make = h.require_attr(jsr, f"optim.{factory}", name)
        apply = h.require_attr(jsr, "optim.apply_updates", name)
        opt = make(LR, **kw)
        params = init_params(w.v, w.d)
        state = opt.init(params)
        shape = (w.v, w.d)

        def step(p, s, idx, data):
            g = jsr.RowSparse._make(data, idx, shape)
            u, s = opt.update(g, s, p)
            return apply(p, u), s

        f = jax.jit(step, donate_argnums=(0, 1))
        return stateful(f, (params, state), jax_grads(w))

    return h.Contender(name, setup)


# ------------------------------------------------------------------- dense optax


def dense_contender(name: str, opt: optax.GradientTransformation, w: Workload) -> h.Contender:
    def setup():
        params = init_params(w.v, w.d)
        state = opt.init(params)

        def step(p, s, idx, data):
            g = jnp.zeros_like(p).at[idx].set(data, mode="drop", indices_are_sorted=True)
            u, s = opt.update(g, s, p)
            return optax.apply_updates(p, u), s

        f = jax.jit(step, donate_argnums=(0, 1))
        return stateful(f, (params, state), jax_grads(w))

    return h.Contender(name, setup)


def dense_rowwise_adagrad(lr: float, eps: float = 1e-8) -> optax.GradientTransformation:
    """Row-wise AdaGrad over every row (what a dense-gradient user would write)."""

    def init(p):
        return jnp.zeros(p.shape[:1], p.dtype)

    def update(g, acc, p=None):
        acc = acc + jnp.mean(g * g, axis=1)
        return -lr * g / (jnp.sqrt(acc) + eps)[:, None], acc

    return optax.GradientTransformation(init, update)


# ------------------------------------------------------------------------- floor


def _xla_rows():
    kw = dict(indices_are_sorted=True, unique_indices=True)

    def gather(a, idx):
        return a.at[idx].get(mode="fill", fill_value=0, **kw)

    def scatter(a, idx, rows):
        return a.at[idx].set(rows, mode="drop", **kw)

    return gather, scatter


def _jsr_rows():
    """The row gather/scatter jsr's lazy steps use (its native CPU kernels where
    built, else the same XLA ops); private API, for this comparison only."""
    moves = h.require("jaxsparse_rows._rowops")
    if h.mode().gpu:
        raise h.Skip("jsr's row kernels are CPU-only: on GPU its row moves are XLA's")
    if not jsr.native_kernels_enabled():
        raise h.Skip("jsr's native kernels are not built or are turned off")
    return functools.partial(moves.gather_rows, ids_sorted=True), moves.scatter_rows


def floor_contender(
    name: str, w: Workload, n_full: int, n_rowwise: int = 0, rows=_xla_rows
) -> h.Contender:
    """Gathers and scatters the K rows of the params and ``n_full - 1`` [V, D]
    state arrays (plus ``n_rowwise`` [V] arrays), in one donated jitted step.
    ``rows`` gives the gather and scatter: XLA's ops by default (the floor of the
    targets), or jsr's row kernels (how much of a step is gather and scatter)."""

    def setup():
        gather, scatter = rows()
        arrays = tuple(init_params(w.v, w.d) for _ in range(n_full))
        arrays += tuple(jnp.zeros((w.v,), jnp.float32) for _ in range(n_rowwise))

        def step(*args):
            *arrs, idx, data = args
            out = []
            for i, a in enumerate(arrs):
                new = gather(a, idx) + (data if a.ndim == 2 else data[:, 0]) * (0.5 + i)
                out.append(scatter(a, idx, new))
            return tuple(out)

        f = jax.jit(step, donate_argnums=tuple(range(len(arrays))))
        return stateful(lambda *a: f(*a), arrays, jax_grads(w))

    return h.Contender(name, setup)


def handwritten_lazy_adam(name: str, w: Workload) -> h.Contender:
    """A hand-written lazy Adam step (gather, update, scatter) for orientation."""
    b1, b2, eps = 0.9, 0.999, 1e-8

    def setup():
        p = init_params(w.v, w.d)
        m = jnp.zeros_like(p)
        v = jnp.zeros_like(p)
        t = jnp.zeros([], jnp.int32)

        def step(p, m, v, t, idx, data):
            t = t + 1
            kw = dict(indices_are_sorted=True, unique_indices=True)
            mr = b1 * m.at[idx].get(mode="fill", fill_value=0, **kw) + (1 - b1) * data
            vr = b2 * v.at[idx].get(mode="fill", fill_value=0, **kw) + (1 - b2) * data * data
            tf = t.astype(jnp.float32)
            u = -LR * (mr / (1 - b1**tf)) / (jnp.sqrt(vr / (1 - b2**tf)) + eps)
            p = p.at[idx].add(u, mode="drop", **kw)
            m = m.at[idx].set(mr, mode="drop", **kw)
            v = v.at[idx].set(vr, mode="drop", **kw)
            return p, m, v, t

        f = jax.jit(step, donate_argnums=(0, 1, 2))
        return stateful(f, (p, m, v, t), jax_grads(w))

    return h.Contender(name, setup)


# ------------------------------------------------------------------------- torch


def torch_contenders(name: str, make_opt: Callable, w: Workload) -> list[h.Contender]:
    """The torch optimizer on a sparse gradient, on the mode's device (and on
    CPU a 1-thread column beside it, see ``h.torch_contenders``)."""

    def build(torch, device):
        param = torch.nn.Parameter(torch.randn(w.v, w.d, device=device) * 0.01)
        opt = make_opt(torch, param)
        grads = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "sparse invariant checks are disabled"
            for idx, data in w.grads:
                g = torch.sparse_coo_tensor(
                    torch.from_numpy(idx.astype(np.int64))[None].to(device),
                    torch.from_numpy(data).to(device),
                    (w.v, w.d),
                )
                grads.append(g.coalesce())
        pool = itertools.cycle(grads)

        def step():
            param.grad = next(pool)
            opt.step()

        return step

    return h.torch_contenders(name, build)


# ----------------------------------------------------------------------- tables


@dataclass
class Family:
    key: str
    jsr_name: str
    jsr_factory: str
    jsr_kwargs: dict
    dense_name: str
    dense: Callable[[], optax.GradientTransformation]
    torch_name: str | None
    torch_make: Callable | None
    floor_full: int
    floor_rowwise: int = 0


FAMILIES = [
    Family(
        "adam",
        "jsr lazy_adam",
        "lazy_adam",
        {},
        "optax.adam (dense grad)",
        lambda: optax.adam(LR),
        "torch SparseAdam",
        lambda torch, p: torch.optim.SparseAdam([p], lr=LR),
        3,
    ),
    Family(
        "sgd",
        "jsr lazy_sgd momentum",
        "lazy_sgd",
        {"momentum": 0.9},
        "optax.sgd momentum (dense grad)",
        lambda: optax.sgd(LR, momentum=0.9),
        "torch SGD momentum (sparse grad)",
        lambda torch, p: torch.optim.SGD([p], lr=LR, momentum=0.9),
        2,
    ),
    Family(
        "adagrad",
        "jsr lazy_adagrad",
        "lazy_adagrad",
        {},
        "optax.adagrad (dense grad)",
        lambda: optax.adagrad(LR),
        "torch Adagrad (sparse grad)",
        lambda torch, p: torch.optim.Adagrad([p], lr=LR),
        2,
    ),
    Family(
        "rowwise_adagrad",
        "jsr lazy_rowwise_adagrad",
        "lazy_rowwise_adagrad",
        {},
        "dense rowwise adagrad (jnp)",
        lambda: dense_rowwise_adagrad(LR),
        None,
        None,
        1,
        1,
    ),
]


def family_contenders(
    fam: Family, w: Workload, *, dense: bool = True, torch: bool = True, one_thread: bool = True
):
    cs = [jsr_contender(fam.jsr_name, fam.jsr_factory, w, **fam.jsr_kwargs)]
    if dense:
        cs.append(dense_contender(fam.dense_name, fam.dense(), w))
    if torch and fam.torch_name:
        made = torch_contenders(fam.torch_name, fam.torch_make, w)
        cs.extend(made if one_thread else made[:1])
    cs.append(floor_contender(f"floor ({fam.key})", w, fam.floor_full, fam.floor_rowwise))
    cs.append(
        floor_contender(
            f"floor, jsr row kernels ({fam.key})", w, fam.floor_full, fam.floor_rowwise, _jsr_rows
        )
    )
    if fam.key == "adam":
        cs.append(handwritten_lazy_adam("hand-written lazy adam (jnp)", w))
    return cs


def update_bytes(fam: Family, w: Workload) -> int:
    """The bytes a lazy update must move at least: read and write the K rows of
    the parameters and of every state array, read the gradient (values and
    ids); float32 values, int32 ids."""
    rows = fam.floor_full * w.k * w.d + fam.floor_rowwise * w.k
    return 4 * (2 * rows + w.k * w.d + w.k)


def family_targets(fam: Family) -> list[h.Target]:
    ts = [h.Target(f"{fam.jsr_name} >= 40x faster than dense", fam.jsr_name, fam.dense_name, 40)]
    if fam.torch_name:
        ts.append(
            h.Target(f"{fam.jsr_name} >= 1.8x faster than torch", fam.jsr_name, fam.torch_name, 1.8)
        )
    # Two implementations of the floor (XLA's gather/scatter, and jsr's own
    # row kernels): the target is the faster of the two in each run.
    ts.append(
        h.Target(
            f"{fam.jsr_name} within 1.25x of the floor (the faster of two)",
            fam.jsr_name,
            (f"floor ({fam.key})", f"floor, jsr row kernels ({fam.key})"),
            1 / 1.25,
        )
    )
    return ts


def main(argv=None) -> None:
    p = h.parser(__doc__)
    p.add_argument("--vocab", type=int, help="rows V (default 1e6 on CPU, 1e7 on GPU)")
    p.add_argument("--dim", type=int, help="row width D (default 64)")
    p.add_argument(
        "--touched", type=int, help="distinct rows K (default 4096 on CPU, 262,144 on GPU)"
    )
    p.add_argument(
        "--optimizers",
        default="adam,sgd,adagrad,rowwise_adagrad",
        help="comma-separated subset of adam,sgd,adagrad,rowwise_adagrad",
    )
    args = h.parse(p, argv)
    h.apply_sizes(args, SIZES)
    keys = [k.strip() for k in args.optimizers.split(",") if k.strip()]
    fams = [f for f in FAMILIES if f.key in keys]
    rep = h.Report(
        "lazy_update", args, {"V": args.vocab, "D": args.dim, "K": args.touched, "lr": LR}
    )
    w = make_workload(args.vocab, args.dim, args.touched)
    rep.copy()
    for fam in fams:
        res = h.measure(family_contenders(fam, w), args.runs, budget_s=args.budget)
        title = f"{fam.key}: V={w.v} x D={w.d} float32, K={w.k} rows"
        rep.table(title, res, family_targets(fam), reference=fam.jsr_name)
        rep.no_recompile(res, [fam.jsr_name])
        floors = [f"floor ({fam.key})", f"floor, jsr row kernels ({fam.key})"]
        moved = [fam.jsr_name, *floors, *(n for n in res if n.startswith("torch"))]
        h.print_bandwidth(
            rep,
            title,
            res,
            {n: update_bytes(fam, w) for n in moved},
            "the bytes of the lazy update (read + write the K rows of every array, read the "
            "gradient) / median time",
            summarise=floors,
        )

    if args.sweep:
        fam = next((f for f in fams if f.key == "adam"), fams[0])
        vs = [1000, 10_000, 100_000] if args.smoke else [10_000, 100_000, 1_000_000, 10_000_000]
        k_fixed = min(args.touched, vs[0])
        rows = []
        for v in vs:
            wv = make_workload(v, args.dim, k_fixed)
            cs = family_contenders(
                fam, wv, dense=v <= max(args.vocab, 10_000), torch=True, one_thread=False
            )
            # Every cell one contender at a time, as the 10^7 cell must be (its
            # states do not fit together): interleaved cells read up to 1.6x
            # slower, so mixing the two modes bent the growth the verdict uses.
            # Split into rounds, each with a fresh setup, so that one noisy
            # block cannot set a cell's median.
            res = h.measure(
                cs, args.runs, budget_s=args.budget, interleave=False, rounds=args.rounds
            )
            rows.append((v, res))
        sw = h.sweep_table(f"sweep {fam.key}: V at K={k_fixed}, D={args.dim}", "V", rows)
        rep.add("sweep_V", sw)
        h.flat_in_v_verdict(rep, sw, fam.jsr_name, f"floor ({fam.key})", vs[-1] // vs[0])
        ks = [16, 64, 256] if args.smoke else [256, 1024, 4096, 16_384, 65_536]
        rows = []
        for k in ks:
            wk = make_workload(args.vocab, args.dim, k)
            cs = family_contenders(fam, wk, dense=False, one_thread=False)
            rows.append((k, h.measure(cs, args.runs, budget_s=args.budget)))
        rep.add("sweep_K", h.sweep_table(f"sweep {fam.key}: K at V={args.vocab}", "K", rows))
    rep.finish()


if __name__ == "__main__":
    main()
