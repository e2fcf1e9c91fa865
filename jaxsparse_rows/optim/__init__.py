"""Lazy optimizers: optax ``GradientTransformation``s that update only the rows
a RowSparse gradient lists."""
