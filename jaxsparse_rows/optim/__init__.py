"""Lazy optimizers: optax ``GradientTransformation``s that update only the rows
a RowSparse gradient lists, plus the RowSparse-aware transforms they are built
from."""

from ._accumulate import MultiSteps as MultiSteps
from ._accumulate import MultiStepsState as MultiStepsState
from ._adagrad import ScaleByLazyAdagradState as ScaleByLazyAdagradState
from ._adagrad import ScaleByLazyRowwiseAdagradState as ScaleByLazyRowwiseAdagradState
from ._adagrad import lazy_adagrad as lazy_adagrad
from ._adagrad import lazy_rowwise_adagrad as lazy_rowwise_adagrad
from ._adagrad import scale_by_lazy_adagrad as scale_by_lazy_adagrad
from ._adagrad import scale_by_lazy_rowwise_adagrad as scale_by_lazy_rowwise_adagrad
from ._adam import ScaleByLazyAdamState as ScaleByLazyAdamState
from ._adam import lazy_adam as lazy_adam
from ._adam import lazy_adamw as lazy_adamw
from ._adam import scale_by_lazy_adam as scale_by_lazy_adam
from ._apply import apply_updates as apply_updates
from ._checkpoint import restore_structure as restore_structure
from ._ema import EmaState as EmaState
from ._ema import ema as ema
from ._ema import lookahead as lookahead
from ._exact import ExactLazySgdState as ExactLazySgdState
from ._exact import catch_up as catch_up
from ._exact import flush as flush
from ._ftrl import LazyFtrlState as LazyFtrlState
from ._ftrl import lazy_ftrl as lazy_ftrl
from ._numerics import ApplyIfFiniteState as ApplyIfFiniteState
from ._numerics import ZeroNansState as ZeroNansState
from ._numerics import apply_if_finite as apply_if_finite
from ._numerics import zero_nans as zero_nans
from ._sgd import ScaleByLazySgdState as ScaleByLazySgdState
from ._sgd import lazy_sgd as lazy_sgd
from ._sgd import scale_by_lazy_sgd as scale_by_lazy_sgd
from ._transforms import ScaleByLearningRateState as ScaleByLearningRateState
from ._transforms import SkipNonfiniteState as SkipNonfiniteState
from ._transforms import add_decayed_weights as add_decayed_weights
from ._transforms import clip_by_block_rms as clip_by_block_rms
from ._transforms import clip_by_global_norm as clip_by_global_norm
from ._transforms import global_norm as global_norm
from ._transforms import lift_elementwise as lift_elementwise
from ._transforms import scale_by_learning_rate as scale_by_learning_rate
from ._transforms import skip_nonfinite as skip_nonfinite
from ._wrappers import masked as masked
from ._wrappers import multi_transform as multi_transform

__all__ = [
    "ApplyIfFiniteState",
    "EmaState",
    "ExactLazySgdState",
    "LazyFtrlState",
    "MultiSteps",
    "MultiStepsState",
    "ScaleByLazyAdagradState",
    "ScaleByLazyAdamState",
    "ScaleByLazyRowwiseAdagradState",
    "ScaleByLazySgdState",
    "ScaleByLearningRateState",
    "SkipNonfiniteState",
    "ZeroNansState",
    "add_decayed_weights",
    "apply_if_finite",
    "apply_updates",
    "catch_up",
    "clip_by_block_rms",
    "clip_by_global_norm",
    "ema",
    "flush",
    "global_norm",
    "lazy_adagrad",
    "lazy_adam",
    "lazy_adamw",
    "lazy_ftrl",
    "lazy_rowwise_adagrad",
    "lazy_sgd",
    "lift_elementwise",
    "lookahead",
    "masked",
    "multi_transform",
    "restore_structure",
    "scale_by_lazy_adagrad",
    "scale_by_lazy_adam",
    "scale_by_lazy_rowwise_adagrad",
    "scale_by_lazy_sgd",
    "scale_by_learning_rate",
    "skip_nonfinite",
    "zero_nans",
]
