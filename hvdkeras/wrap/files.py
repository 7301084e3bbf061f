"""`save`, `save_weights` and `export` under the wrap: rank 0 writes, the others wait for it."""

from __future__ import annotations

import functools

from hvdkeras.training import rank_zero, saving
from hvdkeras.training.models import consolidate_optimizer_state


def write_on_rank_zero(original, model, filepath, *args, **kwargs):
    """`save` / `save_weights`: rank 0 writes atomically, the others wait for it (having first gathered a sharded
    optimizer's state with it, when every worker is here)."""
    if not rank_zero.in_solo():
        consolidate_optimizer_state(model)
    return rank_zero.on_rank_zero(saving.write_atomically, functools.partial(original, model), filepath,
                                  *args, **kwargs)


def export(original, model, filepath, *args, **kwargs):
    return rank_zero.on_rank_zero(original, model, filepath, *args, **kwargs)
