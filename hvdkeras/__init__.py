"""hvdkeras: data-parallel training of Keras 3 models on TensorFlow with Horovod.

`import hvdkeras as hvd` is the migration from `horovod.tensorflow.keras` and from `horovod.tensorflow`: the
same names where the concept is the same, working on Keras 3.

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

# Where each public name lives. The package imports its modules (and so TensorFlow, Keras and Horovod) on the
# first use of a name, not at `import hvdkeras`: `hvdkeras run` and `hvdkeras.cli` start without
# TensorFlow, while `hvd.init()` and every other name work as if imported eagerly.
_API = {
    "hvdkeras.basics": (
        "ProcessSet", "add_process_set", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built",
        "global_process_set", "gloo_built", "gloo_enabled", "is_initialized", "local_rank", "local_size",
        "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "rank", "remove_process_set",
        "rocm_built", "size", "start_timeline", "stop_timeline",
    ),
    "hvdkeras.training.session": ("init", "shutdown"),
    "hvdkeras.collectives": (
        "Average", "Sum", "allgather", "allgather_object", "allreduce", "broadcast", "broadcast_",
        "broadcast_global_variables", "broadcast_object", "broadcast_variables", "reducescatter",
    ),
    "hvdkeras.training.tape": ("DistributedGradientTape", "PartialDistributedGradientTape"),
    "hvdkeras.tf2": (
        "Adasum", "Max", "Min", "Product", "alltoall", "broadcast_object_fn", "gpu_available", "grouped_allgather",
        "grouped_allreduce", "grouped_reducescatter", "is_homogeneous", "join", "local_rank_op", "local_size_op",
        "process_set_included_op", "rank_op", "size_op",
    ),
    "hvdkeras.compression": ("Compression",),
    "hvdkeras.training.learning_rate": ("scale_learning_rate",),
    "hvdkeras.training.optimizer": (
        "DistributedLossScaleOptimizer", "DistributedOptimizer", "PartialDistributedOptimizer",
    ),
    "hvdkeras.training.saving": ("load_model",),
    "hvdkeras.training.sync_batch_norm": ("SyncBatchNormalization",),
    "hvdkeras._compat": ("is_version_greater_equal_than",),
}
# Submodules that import no TensorFlow (the `hvdkeras` command's): `from hvdkeras import settings` in them must
# not run the version check, which imports TensorFlow.
_PLAIN = frozenset({"cli", "failures", "settings"})
_WHERE = {name: module for module, names in _API.items() for name in names}
# horovod.tensorflow's names that hvdkeras does not provide, and what to use instead (docs/migrating.md).
_INSTEAD = {
    "LocalGradientAggregationHelper": "Horovod's internal gradient accumulation: pass backward_passes_per_step "
                                      "to hvdkeras.DistributedOptimizer",
    "check_extension": "Horovod's check of its own build: use hvdkeras.gloo_built(), hvdkeras.nccl_built() and "
                       "the other *_built() functions, or `hvdkeras check`",
    "check_num_rank_power_of_2": "a check for Horovod's Adasum, which hvdkeras does not run (it needs an MPI "
                                 "build): use op=hvdkeras.Average",
    "handle_average_backwards_compatibility": "Horovod's internal handling of the deprecated `average`: "
                                              "hvdkeras.allreduce takes `average` and `op` as Horovod does",
    "split_list": "a Horovod internal helper with no distributed meaning: split the list in the script",
    "vars_to_refs": "Keras 3 variables have no .ref(); hvdkeras identifies variables itself, so pass the "
                    "variables as they are",
    "refs_to_vars": "Keras 3 variables have no .ref(); hvdkeras identifies variables itself, so pass the "
                    "variables as they are",
}
__all__ = sorted([*_WHERE, "callbacks", "data", "elastic"])
_checked = False


def _check_installed_once() -> None:
    # The versions are checked when the API is first used (ImportError on TensorFlow < 2.16 or Keras < 3).
    global _checked
    if not _checked:
        from hvdkeras._compat import check_installed

        check_installed()
        _checked = True


def __getattr__(name: str):
    import importlib
    import importlib.util

    if name.startswith("__"):
        raise AttributeError(f"module 'hvdkeras' has no attribute {name!r}")
    if name in _WHERE:
        _check_installed_once()
        value = getattr(importlib.import_module(_WHERE[name]), name)
    elif importlib.util.find_spec(f"hvdkeras.{name}") is not None:  # a submodule: callbacks, data, elastic, ...
        if name not in _PLAIN:
            _check_installed_once()
        value = importlib.import_module(f"hvdkeras.{name}")
    elif name in _INSTEAD:
        raise AttributeError(f"hvdkeras has no {name!r} (horovod.tensorflow.{name}): {_INSTEAD[name]}.")
    else:
        raise AttributeError(f"module 'hvdkeras' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
