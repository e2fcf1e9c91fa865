"""The cost of ``sparse="auto"``: a training step written with unmodified model
code against the same step written by hand with ``pull_rows`` + ``take``.

Model (as in ``embedding_step.py``): ids [B = 1024, 4] into a table
[V = 1,000,000 x D = 64] float32 (on a GPU: ids [16,384, 16] into
[10,000,000 x 64]), sum-pool over the ids of each example, a linear head
[D -> 1], MSE against a target, backward, ``jsr.optim.lazy_adam``; one jitted
step with the parameters and optimizer state donated. Contenders:

* ``hand-written``: ``view = pull_rows(params["emb"], ids)``, the loss reads
  ``jsr.take(view["emb"], ids)``, ``jsr.value_and_grad``;
* ``auto, x[ids]``: the loss reads ``params["emb"][ids]`` (plain JAX model
  code), ``jsr.value_and_grad(loss, sparse="auto")``;
* ``auto, jnp.take``: the loss reads ``jnp.take(params["emb"], ids, axis=0)``
  (what flax's ``Embed`` layers run), ``sparse="auto"``;
* ``auto, shared table``: a word2vec-style loss that looks the same table up
  twice (centre word ``ids[:, 0]``, context words ``ids[:, 1:]``),
  ``sparse="auto"``, against its own hand-written form (one ``pull_rows``
  of both id sets).

Target: each ``auto`` step within 1.25x of the time of its hand-written step
(ratio of medians, contenders interleaved in one process). The compile time
of each step function (tracing, the rewrite, lowering, XLA) is reported, and
no step compiles after its first call.

Run ``python benchmarks/auto_sparse.py --help`` for the options.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h  # noqa: E402
from embedding_step import init_params  # noqa: E402

import jaxsparse_rows as jsr  # noqa: E402

LR = 1e-3
N_BATCHES = 8
# table rows V, width D, examples B, ids per example, by mode (as embedding_step.py)
SIZES = {
    "cpu": {"vocab": 1_000_000, "dim": 64, "batch": 1024, "bag": 4},
    "gpu": {"vocab": 10_000_000, "dim": 64, "batch": 16_384, "bag": 16},
    "smoke": {"vocab": 5000, "dim": 8, "batch": 64, "bag": 4},
}

HAND = "hand-written (pull_rows + take)"
AUTO = 'auto, x[ids] (sparse="auto")'
AUTO_TAKE = 'auto, jnp.take (sparse="auto")'
HAND_W2V = "hand-written, shared table"
AUTO_W2V = 'auto, shared table (sparse="auto")'


def make_batches(v: int, b: int, bag: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [
        (
            jnp.asarray(rng.integers(0, v, (b, bag)), jnp.int32),
            jnp.asarray(rng.standard_normal(b), jnp.float32),
        )
        for _ in range(N_BATCHES)
    ]


def head_loss(pooled, p, y):
    pred = (pooled @ p["w"])[:, 0] + p["b"][0]
    return jnp.mean(jnp.square(pred - y))


def loss_getitem(params, ids, y):
    return head_loss(params["emb"][ids].sum(axis=1), params, y)


def loss_take(params, ids, y):
    return head_loss(jnp.take(params["emb"], ids, axis=0).sum(axis=1), params, y)


def loss_view(view, ids, y):
    return head_loss(jsr.take(view["emb"], ids).sum(axis=1), view, y)


def w2v_loss(params, ids, y):
    """Centre word ids[:, 0] against context words ids[:, 1:], one table."""
    centre = params["emb"][ids[:, 0]]  # [B, D]
    context = jnp.take(params["emb"], ids[:, 1:], axis=0)  # [B, C, D]
    logits = jnp.einsum("bd,bcd->bc", centre, context)
    labels = (y[:, None] > 0).astype(jnp.float32)
    return jnp.mean(jax.nn.softplus(logits) - labels * logits)


def w2v_view_loss(view, ids, y):
    centre = jsr.take(view["emb"], ids[:, 0])
    context = jsr.take(view["emb"], ids[:, 1:])
    logits = jnp.einsum("bd,bcd->bc", centre, context)
    labels = (y[:, None] > 0).astype(jnp.float32)
    return jnp.mean(jax.nn.softplus(logits) - labels * logits)


def setup(v: int, d: int, batches, loss, *, by_hand: bool):
    opt = jsr.optim.lazy_adam(LR)

    def step(params, state, ids, y):
        if by_hand:
            view = dict(params, emb=jsr.pull_rows(params["emb"], ids))
            _, grads = jsr.value_and_grad(loss)(view, ids, y)
        else:
            _, grads = jsr.value_and_grad(loss, sparse="auto")(params, ids, y)
        updates, state = opt.update(grads, state, params)
        return jsr.optim.apply_updates(params, updates), state

    def make():
        jitted = jax.jit(step, donate_argnums=(0, 1))
        params = init_params(v, d)
        box = [h.block((params, opt.init(params)))]
        pool = itertools.cycle(batches)

        def run():
            box[0] = jitted(*box[0], *next(pool))
            return box[0]

        return run

    return make


def main(argv=None) -> None:
    p = h.parser(__doc__)
    p.add_argument("--vocab", type=int, help="rows V (default 1e6 on CPU, 1e7 on GPU)")
    p.add_argument("--dim", type=int, help="row width D (default 64)")
    p.add_argument("--batch", type=int, help="examples B (default 1024 on CPU, 16,384 on GPU)")
    p.add_argument("--bag", type=int, help="ids per example (default 4 on CPU, 16 on GPU)")
    args = h.parse(p, argv)
    h.apply_sizes(args, SIZES)
    v, d, b, bag = args.vocab, args.dim, args.batch, args.bag
    rep = h.Report("auto_sparse", args, {"V": v, "D": d, "B": b, "bag": bag, "lr": LR})
    batches = make_batches(v, b, bag)
    contenders = [
        h.Contender(HAND, setup(v, d, batches, loss_view, by_hand=True)),
        h.Contender(AUTO, setup(v, d, batches, loss_getitem, by_hand=False)),
        h.Contender(AUTO_TAKE, setup(v, d, batches, loss_take, by_hand=False)),
        h.Contender(HAND_W2V, setup(v, d, batches, w2v_view_loss, by_hand=True)),
        h.Contender(AUTO_W2V, setup(v, d, batches, w2v_loss, by_hand=False)),
    ]
    res = h.measure(contenders, args.runs, budget_s=args.budget)
    within = 1 / 1.25
    targets = [
        h.Target(f"`{AUTO}` within 1.25x of `{HAND}`", AUTO, HAND, within),
        h.Target(f"`{AUTO_TAKE}` within 1.25x of `{HAND}`", AUTO_TAKE, HAND, within),
        h.Target(f"`{AUTO_W2V}` within 1.25x of `{HAND_W2V}`", AUTO_W2V, HAND_W2V, within),
    ]
    rep.table(f"step: V={v} x D={d} float32, B={b} x {bag} ids, lazy_adam", res, targets, HAND)
    rep.no_recompile(res, list(res))
    rep.finish()


if __name__ == "__main__":
    main()
