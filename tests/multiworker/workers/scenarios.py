"""Runs several worker scripts one after the other in the same 2 processes: one launch, several scenarios.

    scenarios.py NAME [NAME ...]      (NAME: a <NAME>_worker.py script beside this file)

Each scenario writes its rank*.json into $HVDKERAS_TEST_OUT/<NAME>. Horovod starts once, with the process
sets {0} and {1} that the "partial" scenario uses (the others never touch them). Each scenario gets its
own hang bound: where one hangs, its stacks are printed and the process exits.
"""

import faulthandler
import os
import runpy
import sys

import common
import hvdkeras as hvd

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = os.environ["HVDKERAS_TEST_OUT"]
BOUND = float(os.environ.get("HVDKERAS_TEST_DUMP_AFTER", "200"))

common.PROCESS_SETS = [hvd.ProcessSet([0]), hvd.ProcessSet([1])]
hvd.init(process_sets=common.PROCESS_SETS)
for name in sys.argv[1:]:
    import keras

    keras.mixed_precision.set_global_policy("float32")
    out = os.path.join(BASE, name)
    os.makedirs(out, exist_ok=True)
    os.environ["HVDKERAS_TEST_OUT"] = out
    faulthandler.dump_traceback_later(BOUND, exit=True, file=sys.stderr)
    print(f"scenario {name}: start", flush=True)
    runpy.run_path(os.path.join(HERE, f"{name}_worker.py"), run_name="__main__")
    print(f"scenario {name}: done", flush=True)
faulthandler.cancel_dump_traceback_later()
