"""The PowerSGD reducer (Vogels, Karimireddy, Jaggi, NeurIPS 2019, "PowerSGD: Practical Low-Rank Gradient
Compression for Distributed Optimization"; PyTorch's `powerSGD_hook`): each gradient matrix M (n x m) is sent as
a rank-r approximation found by one power iteration, P = M Q, allreduced and orthogonalized, then Q = M^T P,
allreduced, and P Q^T is the reduced gradient: (n + m) r numbers travel instead of n m.

- Error feedback: what the approximation left out of each worker's M is added to its next gradient, so nothing
  is lost over the steps, only delayed (the error is each worker's own; the approximation is the same on all).
- Warm start: each step's Q starts from the last step's, so one power iteration a step tracks the top
  subspace; without it Q is drawn afresh each step (the same draw on every worker).
- A conv kernel (kh, kw, c_in, c_out) is the matrix (kh kw c_in) x c_out; vectors (biases, normalization
  scales), sparse gradients (tf.IndexedSlices), local variables and matrices whose compression rate
  n m / ((n + m) r) is below `min_compression_rate` go exactly, by the allreduce of reduce_gradients.
- For the first `start_step` reductions every gradient goes exactly (PyTorch's `start_powerSGD_iter`).

The P and Q allreduces are bucketed as the exact path's are (groups.dense_groups: about `bucket_bytes` of the
gradients' own size per bucket, in the order the backward pass produces them), so a bucket's P allreduce starts
while the backward pass still runs. The options' compression (fp16) applies to P, Q and the exact tensors.

With a rank at least a matrix's smaller side the approximation is the matrix itself, so the reducer equals the
exact allreduce to float tolerance. Its state (the count of reductions, each matrix's error and Q) is variables
(`state()`), saved with the optimizer, so a resumed run continues bit for bit. A step whose reduced P or Q is not
finite (a loss-scaled step that overflowed, which the LossScaleOptimizer skips) leaves the state as it was.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import tensorflow as tf

from hvdkeras._checks import check_int, check_number
from hvdkeras.reduce.allreduce import allreduce_group, reduce_gradients
from hvdkeras.reduce.base import Reduced, Reducer
from hvdkeras.reduce.context import is_reduced, mark_reduced
from hvdkeras.reduce.groups import dense_groups
from hvdkeras.reduce.options import ReductionOptions
from hvdkeras.variables import var_id

log = logging.getLogger("hvdkeras")


def matrix_shape(shape: Any) -> tuple[int, int] | None:
    """The matrix a gradient of `shape` is compressed as, (n, m): every dimension but the last, by the last
    (a conv kernel (kh, kw, c_in, c_out) is (kh kw c_in, c_out)); None for a vector, a scalar or a shape not
    fully defined."""
    shape = tf.TensorShape(shape)
    if shape.rank is None or shape.rank < 2 or not shape.is_fully_defined():
        return None
    n = 1
    for dim in shape[:-1]:
        n *= int(dim)
    return n, int(shape[-1])


def compresses(n: int, m: int, rank: int, min_compression_rate: float) -> bool:
    """Whether an n x m matrix is sent compressed at `rank`: n m numbers against (n + m) r, r = min(rank, n, m),
    at least `min_compression_rate` times fewer (PyTorch's rule)."""
    r = min(rank, n, m)
    return (n + m) * r * min_compression_rate < n * m


class _Matrix:
    """One compressed variable's state: its matrix shape, rank, error (if error feedback) and Q."""

    def __init__(self, index: int, n: int, m: int, r: int, dtype: Any, seed: int, error_feedback: bool):
        self.index, self.n, self.m, self.r = index, n, m, r
        self.dtype = tf.float64 if dtype == tf.float64 else tf.float32
        self.error = (tf.Variable(tf.zeros((n, m), self.dtype), trainable=False, name="powersgd_error")
                      if error_feedback else None)
        self.q = tf.Variable(self.draw(seed, 0), trainable=False, name="powersgd_q")

    def draw(self, seed: int, step: Any) -> tf.Tensor:
        """A random Q (m x r), the same on every worker for a seed, this matrix and a step."""
        ints = tf.stack([tf.cast(seed, tf.int64) * 1_000_003 + self.index, tf.cast(step, tf.int64)])
        return tf.random.stateless_normal((self.m, self.r), seed=ints, dtype=self.dtype)


class PowerSGDReducer(Reducer):
    """Gradient matrices sent as rank-`rank` approximations, with error feedback and warm start.

    Args:
        rank: the approximation's rank r (an integer >= 1; PyTorch's `matrix_approximation_rank`, default 1;
            the paper used 2 for ResNet-18 on CIFAR-10 and 4 for an LSTM).
        start_step: reductions with every gradient sent exactly first (an integer >= 0; PyTorch's
            `start_powerSGD_iter`, default 1,000): the first steps move fast and a low-rank approximation of them
            costs accuracy.
        min_compression_rate: a matrix is compressed only when it sends at least this many times fewer numbers
            (a number >= 0; PyTorch's default 2): smaller ones go exactly. 0 compresses every matrix.
        error_feedback: add what the approximation left out to the next step's gradient (PyTorch's
            `use_error_feedback`, on by default; its memory is one copy of each compressed gradient).
        warm_start: start each step's power iteration from the last step's Q (on by default).
        seed: the seed of the random Q (the same on every worker).
        options: the buckets, compression (fp16 composes) and process set (default: the DistributedOptimizer's
            or the tape's own; `ReductionOptions()` elsewhere). It averages: `op` must be Average.
        local: a function returning the `var_id`s of variables whose gradients stay on each worker (default: the
            DistributedOptimizer's or tape's local variables).

    Raises:
        ValueError: an argument out of range, naming what was received.

    Example:
        >>> opt = hvdkeras.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),
        ...                                     reducer=hvdkeras.reduce.PowerSGDReducer(rank=4, start_step=100))
    """

    averages = True

    def __init__(self, rank: int = 1, start_step: int = 1000, min_compression_rate: float = 2.0,
                 error_feedback: bool = True, warm_start: bool = True, seed: int = 0,
                 options: ReductionOptions | None = None, local: Callable[[], Any] | None = None):
        self.rank = check_int("rank", rank, 1)
        self.start_step = check_int("start_step", start_step, 0)
        self.min_compression_rate = check_number("min_compression_rate", min_compression_rate, 0.0)
        self.error_feedback = bool(error_feedback)
        self.warm_start = bool(warm_start)
        self.seed = check_int("seed", seed, 0)
        self.bind_defaults(options, local)
        self.steps: tf.Variable | None = None
        self._matrices: dict[int, _Matrix] = {}

    def __repr__(self) -> str:
        return (f"PowerSGDReducer(rank={self.rank}, start_step={self.start_step}, min_compression_rate="
                f"{self.min_compression_rate:g}, error_feedback={self.error_feedback}, warm_start={self.warm_start})")

    # ---------------------------------------------------------------------------------------------- state
    def build(self, variables: Sequence[Any]) -> None:
        """Makes the count of reductions and, for each variable compressed, its error and Q (idempotent: a
        variable seen before keeps its state)."""
        with tf.init_scope():
            if self.steps is None:
                self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="powersgd_reductions")
            for var in variables:
                key = var_id(var)
                dims = matrix_shape(var.shape)
                if key in self._matrices or dims is None or not tf.as_dtype(var.dtype).is_floating:
                    continue
                n, m = dims
                if compresses(n, m, self.rank, self.min_compression_rate):
                    self._matrices[key] = _Matrix(len(self._matrices), n, m, min(self.rank, n, m),
                                                  tf.as_dtype(var.dtype), self.seed, self.error_feedback)

    def state(self) -> list:
        if self.steps is None:
            return []
        out = [self.steps]
        for matrix in self._matrices.values():
            out.extend([matrix.q] if matrix.error is None else [matrix.error, matrix.q])
        return out

    def worker_state(self) -> list:
        return [m.error for m in self._matrices.values() if m.error is not None]

    def resized(self, old_size: int, new_size: int) -> None:
        errors = self.worker_state()
        if errors and old_size != new_size:
            for error in errors:
                error.assign(tf.zeros_like(error))
            log.warning("hvdkeras: %r: the job went from %d to %d workers; each worker's error feedback (what the "
                        "approximations left out) is reset to zero", self, old_size, new_size)

    def compressed(self, variables: Sequence[Any]) -> list:
        """Those of `variables` whose gradients are sent compressed (after `start_step`)."""
        return [v for v in variables if var_id(v) in self._matrices]

    # --------------------------------------------------------------------------------------------- reduce
    def reduce(self, grads: Sequence[Any], variables: Sequence[Any], name: str = "hvdkeras.gradients") -> Reduced:
        variables = list(variables)
        grads = list(grads)
        self.build(variables)
        local = self._local() or frozenset()
        chosen = [i for i, g in enumerate(grads)
                  if g is not None and not is_reduced(g) and not isinstance(g, tf.IndexedSlices)
                  and var_id(variables[i]) in self._matrices and var_id(variables[i]) not in local]
        # Everything else (vectors, sparse, small matrices, local variables) exactly, as the allreduce does.
        compressed = set(chosen)
        rest = [None if i in compressed else g for i, g in enumerate(grads)]
        out = reduce_gradients(rest, variables, self.options, local, name=name)
        if chosen:
            dense = [tf.convert_to_tensor(grads[i]) for i in chosen]
            sub = [variables[i] for i in chosen]
            if self.start_step:
                exact = lambda: reduce_gradients(dense, sub, self.options, name=f"{name}.exact")  # noqa: E731
                reduced = tf.cond(self.steps < self.start_step, exact, lambda: self._compress(dense, sub, name))
            else:
                reduced = self._compress(dense, sub, name)
            for i, g in zip(chosen, reduced):
                out[i] = g
            mark_reduced(out[i] for i in chosen)
        self.steps.assign_add(1)
        return Reduced(out, variables)

    def _compress(self, grads: list, variables: list, name: str) -> list:
        """The rank-r approximations of the workers' average of `grads` (all compressed matrices), bucket by
        bucket: one grouped allreduce of the Ps, then one of the Qs, per bucket."""
        out: list = [None] * len(grads)
        for k, group in enumerate(dense_groups(list(range(len(grads))), variables, self.options)):
            matrices = [self._matrices[var_id(variables[i])] for i in group]
            ms = []
            for i, mx in zip(group, matrices):
                m = tf.reshape(tf.cast(grads[i], mx.dtype), (mx.n, mx.m))
                ms.append(m if mx.error is None else m + mx.error)
            qs = [tf.convert_to_tensor(mx.q) if self.warm_start else mx.draw(self.seed, self.steps + 1)
                  for mx in matrices]
            ps = self._allreduce([tf.matmul(m, q) for m, q in zip(ms, qs)], f"{name}.powersgd.p.{k}")
            ps = [tf.linalg.qr(p)[0] for p in ps]
            new_qs = self._allreduce([tf.matmul(m, p, transpose_a=True) for m, p in zip(ms, ps)],
                                     f"{name}.powersgd.q.{k}")
            for i, mx, m, p, q in zip(group, matrices, ms, ps, new_qs):
                approx = tf.matmul(p, q, transpose_b=True)
                finite = tf.reduce_all(tf.math.is_finite(q))  # the same on every worker (q is reduced)
                if mx.error is not None:
                    mx.error.assign(tf.where(finite, m - approx, mx.error))
                if self.warm_start:
                    mx.q.assign(tf.where(finite, q, mx.q))
                out[i] = tf.cast(tf.reshape(approx, variables[i].shape), grads[i].dtype)
        return out

    def _allreduce(self, tensors: list, name: str) -> list:
        """The workers' average of `tensors` in one grouped allreduce (allreduce.allreduce_group: compressed by
        the options' compression; `op` is Average, which `bind_defaults` and `bind` check)."""
        out = list(tensors)
        allreduce_group(out, list(range(len(out))), self.options, name)
        return out
