"""Asks TensorFlow for one inter-op thread, then forms the job: rank 0 alone says what that costs.

    <launcher> python inter_op_script.py

Each worker prints the inter-op threads TensorFlow has after hvdkeras.init() and the job's size.
"""

import tensorflow as tf

tf.config.threading.set_inter_op_parallelism_threads(1)

import hvdkeras as hvd  # noqa: E402

hvd.init()
print(f"rank {hvd.rank()} of {hvd.size()}: inter-op threads {tf.config.threading.get_inter_op_parallelism_threads()}",
      flush=True)
