"""hvdkeras: data-parallel training of Keras 3 models on TensorFlow with Horovod.

`import hvdkeras as hvd` is the migration from `horovod.tensorflow.keras`: the same names where the concept
is the same, working on Keras 3.

Example:
    >>> import hvdkeras as hvd
    >>> hvd.init()
    >>> opt = hvd.DistributedOptimizer(keras.optimizers.Adam(hvd.scale_learning_rate(1e-3)))
    >>> model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    >>> model.fit(hvd.data.shard(dataset).batch(32), epochs=5,
    ...           callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    ...                      hvd.callbacks.MetricAverageCallback()],
    ...           verbose=1 if hvd.rank() == 0 else 0)
"""

__version__ = "0.1.0"

from hvdkeras._compat import check_installed as _check_installed

_check_installed()

from hvdkeras import callbacks, data, elastic  # noqa: E402
from hvdkeras._compat import is_version_greater_equal_than  # noqa: E402
from hvdkeras.basics import (  # noqa: E402
    Average,
    ProcessSet,
    Sum,
    add_process_set,
    allgather,
    allgather_object,
    allreduce,
    broadcast,
    broadcast_global_variables,
    broadcast_object,
    broadcast_variables,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    init,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    reducescatter,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from hvdkeras.compression import Compression  # noqa: E402
from hvdkeras.learning_rate import scale_learning_rate  # noqa: E402
from hvdkeras.optimizer import (  # noqa: E402
    DistributedLossScaleOptimizer,
    DistributedOptimizer,
    PartialDistributedOptimizer,
)
from hvdkeras.saving import load_model  # noqa: E402
from hvdkeras.sync_batch_norm import SyncBatchNormalization  # noqa: E402

__all__ = [
    "Average",
    "Compression",
    "DistributedLossScaleOptimizer",
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "ProcessSet",
    "Sum",
    "SyncBatchNormalization",
    "add_process_set",
    "allgather",
    "allgather_object",
    "allreduce",
    "broadcast",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_variables",
    "callbacks",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "data",
    "ddl_built",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_initialized",
    "is_version_greater_equal_than",
    "load_model",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "reducescatter",
    "remove_process_set",
    "rocm_built",
    "scale_learning_rate",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
]
