"""The wrap's options, `Options`: one field per training setting of hvdkeras.settings."""

from __future__ import annotations

import dataclasses
from typing import Mapping

from hvdkeras import settings


class _OptionsChecks:
    def __post_init__(self):
        for field in dataclasses.fields(self):
            settings.check_value(field.name, getattr(self, field.name))
        settings.check_reducer_with_sharding(self.reducer, self.shard_optimizer_state)

    @property
    def scaling_rule(self) -> str:
        """The learning-rate rule in force: `lr_scaling` where given, else the batch convention's."""
        if self.lr_scaling is not None:
            return self.lr_scaling
        return "linear" if self.batch == "per-worker" else "none"


Options = dataclasses.make_dataclass(
    "Options", [(f.name, f.type, dataclasses.field(default=f.default)) for f in settings.training_settings()],
    bases=(_OptionsChecks,), frozen=True)
Options.__module__ = "hvdkeras.wrap"  # its public name
Options.__doc__ = """What `python -m hvdkeras` / `hvdkeras run` change in the script's training: one field per training
setting of `hvdkeras.settings` (its table says what each does), with its default, checked when made.

    batch: what a batch in the script is. "global" (Keras's convention, as in tf.distribute): each batch is
        split over the workers and the learning rate is left as the script set it; "per-worker": each worker
        trains on whole batches, so the global batch is N times the script's, and the rate is scaled.
    lr_scaling: "linear", "sqrt" or "none"; None (the default) follows `batch`: "linear" for "per-worker",
        "none" for "global".

Raises:
    ValueError: a field's value is not what its setting takes, naming it and what was received.
"""


def options_from_env(environ: Mapping[str, str]) -> dict:
    """The training options given as HVDKERAS_* variables of `environ` (python -m hvdkeras passes its process's
    environment), for launchers that cannot pass flags."""
    given = settings.given(environ)
    return {field.name: given[field.name] for field in settings.training_settings() if field.name in given}
