"""Scripts written for tf.distribute, across workers.

hvdkeras runs one process per device and reduces across processes. A script's single-host strategy
(`MirroredStrategy`, `OneDeviceStrategy`, `tf.distribute.get_strategy()`) then spans the devices this
process was given (one CPU, or the one GPU `init()` pinned), and works as it is. Two cases need more:
- `MultiWorkerMirroredStrategy` spans processes itself, which hvdkeras already does (and it fails in Keras
  3's `fit`). In a wrapped script hvdkeras stands in for it with a `MirroredStrategy` over this process's
  devices, and warns once (`install`, part of the "wrap" patch).
- A strategy with several replicas in one process would run hvdkeras's collectives once per replica.
  `check_strategy` refuses it with an error that names the strategy and what to do.
"""

from __future__ import annotations

import logging
from typing import Any

import tensorflow as tf

from hvdkeras import patches
from hvdkeras.training import rank_zero

log = logging.getLogger("hvdkeras")
PATCH = "tf_distribute"
_warned: list[bool] = []


def check_strategy(strategy: Any = None) -> None:
    """Raises when `strategy` (default: the current one) has several replicas in this process.

    Raises:
        ValueError: naming the strategy and its replicas.
    """
    strategy = tf.distribute.get_strategy() if strategy is None else strategy
    replicas = strategy.num_replicas_in_sync
    if replicas > 1:
        raise ValueError(
            f"hvdkeras runs one process per device and reduces across processes, so a {type(strategy).__name__} "
            f"with {replicas} replicas in one process would reduce each gradient {replicas} times. Start one "
            "process per device (hvdkeras.init() pins each to the GPU of its local rank) and create the "
            "strategy inside it, where it spans that one device, or drop the strategy. Received: "
            f"{type(strategy).__name__} over {list(strategy.extended.worker_devices)}"
        )


class MultiWorkerStandIn(tf.distribute.MirroredStrategy):
    """What `tf.distribute.MultiWorkerMirroredStrategy(...)` makes in a wrapped script: a MirroredStrategy over
    this process's devices, while hvdkeras reduces across the workers. Its `num_replicas_in_sync` counts this
    process's replicas only. The arguments are accepted and not used."""

    def __init__(self, cluster_resolver: Any = None, communication_options: Any = None):
        if rank_zero.is_rank_zero() and not _warned:
            _warned.append(True)
            log.warning("hvdkeras: the script creates a MultiWorkerMirroredStrategy; hvdkeras stands in for it: "
                        "each worker keeps a MirroredStrategy over its own devices and hvdkeras averages the "
                        "gradients across the workers")
        super().__init__()


def install() -> bool:
    """Makes `tf.distribute.MultiWorkerMirroredStrategy` (and its `experimental` name) the stand-in."""
    owners = [tf.distribute, tf.distribute.experimental]
    return patches.install(PATCH, [(owner, "MultiWorkerMirroredStrategy", MultiWorkerStandIn) for owner in owners])


def uninstall() -> bool:
    return patches.uninstall(PATCH)
