"""Unit tests of the benchmark scripts, loaded from benchmarks/ by path (`load`), with no sys.path change."""

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def load(name: str):
    """benchmarks/<name>.py as module `name`; the benchmark modules it imports by name are loaded first."""
    if name in sys.modules:
        return sys.modules[name]
    needs = {"step_timeline": ["network_benchmark"], "slowlink_benchmark": ["network_benchmark"],
             "stall_benchmark": ["network_benchmark"],
             "net_worker": ["peer_loops"], "balance_benchmark": ["sharding_benchmark"]}.get(name, [])
    for other in needs:
        load(other)
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
