"""`hvdkeras check`: versions, Horovod's build, the GPUs, and a real 2-process Gloo allreduce."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

from hvdkeras.cli.command import find_horovodrun

CHECK_WORKER = textwrap.dedent(
    """
    import hvdkeras as hvd
    hvd.init()
    value = [0.2, -0.1, 0.5] if hvd.rank() == 0 else [0.4, 0.0, 0.3]
    got = [round(float(v), 6) for v in hvd.allreduce(value).numpy()]
    assert hvd.size() == 2, hvd.size()
    assert got == [0.3, -0.05, 0.4], got
    print("allreduce ok", got, flush=True)
    """
)


def check(timeout: float = 180.0, out=print) -> int:
    """Prints versions, Horovod's build and the GPUs, then runs a real 2-process allreduce. 0 on PASS."""
    try:
        import keras
        import tensorflow as tf

        from hvdkeras import _collectives

        out(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, Horovod {_collectives.version()}")
        info = _collectives.build_info()
        out("Horovod controllers: Gloo [%s], MPI [%s]" % ("X" if info["gloo"] else " ", "X" if info["mpi"] else " "))
        out("Horovod tensor operations: Gloo [%s], MPI [%s], NCCL [%s]"
            % ("X" if info["gloo"] else " ", "X" if info["mpi"] else " ", "X" if info["nccl"] else " "))
        gpus = tf.config.list_physical_devices("GPU")
        out(f"GPUs visible: {len(gpus)}" + (" (" + ", ".join(g.name for g in gpus) + ")" if gpus else ""))
        horovodrun = find_horovodrun(shutil.which, sys.executable)
        if horovodrun is None:
            out("FAIL: horovodrun not found")
            return 1
        cmd = [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-c", CHECK_WORKER]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        out(f"FAIL: the 2-process allreduce did not finish within {timeout:g} s")
        return 1
    except Exception as err:  # report, do not crash: this is a diagnostic
        out(f"FAIL: {type(err).__name__}: {err}")
        return 1
    if proc.returncode != 0 or "allreduce ok" not in proc.stdout:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        out("FAIL: 2-process allreduce exited with %d: %s" % (proc.returncode, " | ".join(tail)))
        return 1
    out("PASS: 2-process Gloo allreduce of [0.2, -0.1, 0.5] and [0.4, 0.0, 0.3] gave [0.3, -0.05, 0.4]")
    return 0
