"""Lazy optimizers: optax ``GradientTransformation``s that update only the rows
a RowSparse gradient lists, plus the RowSparse-aware transforms they are built
from."""

from ._apply import apply_updates as apply_updates
from ._sgd import ScaleByLazySgdState as ScaleByLazySgdState
from ._sgd import lazy_sgd as lazy_sgd
from ._sgd import scale_by_lazy_sgd as scale_by_lazy_sgd
from ._transforms import ScaleByLearningRateState as ScaleByLearningRateState
from ._transforms import add_decayed_weights as add_decayed_weights
from ._transforms import clip_by_global_norm as clip_by_global_norm
from ._transforms import lift_elementwise as lift_elementwise
from ._transforms import scale_by_learning_rate as scale_by_learning_rate

__all__ = [
    "ScaleByLazySgdState",
    "ScaleByLearningRateState",
    "add_decayed_weights",
    "apply_updates",
    "clip_by_global_norm",
    "lazy_sgd",
    "lift_elementwise",
    "scale_by_lazy_sgd",
    "scale_by_learning_rate",
]
