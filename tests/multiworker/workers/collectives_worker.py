"""The textbook allreduce, Sum, broadcasts from rank 0 and rank 1, and Keras 3 variables."""

import numpy as np

from common import write_result

import hvdkeras as hvd  # noqa: E402
import keras  # noqa: E402

hvd.init()
rank, size = hvd.rank(), hvd.size()
result = {"rank": rank, "size": size, "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
          "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size()}

mine = [[0.2, -0.1, 0.5], [0.4, 0.0, 0.3]][rank]
result["average"] = hvd.allreduce(np.array(mine, dtype="float32")).numpy()
result["sum"] = hvd.allreduce(np.array(mine, dtype="float32"), op=hvd.Sum).numpy()
result["fp16_average"] = hvd.allreduce(np.array(mine, dtype="float32"), compression=hvd.Compression.fp16).numpy()
result["fp16_dtype"] = str(hvd.allreduce(np.array(mine, dtype="float32"), compression=hvd.Compression.fp16).dtype)
for root in range(size):
    result[f"broadcast_from_{root}"] = hvd.broadcast(np.array([rank + 1.0, 10.0 * rank]), root_rank=root).numpy()

# Keras 3 variables have no .ref(); Horovod's own Keras code breaks on exactly that.
variables = [keras.Variable(np.full((2, 3), float(rank + 1))), keras.Variable(np.arange(4) * (rank + 1))]
hvd.broadcast_variables(variables, root_rank=1)
result["keras_vars_from_1"] = [v.numpy() for v in variables]
constant = keras.initializers.Constant(rank)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, kernel_initializer=constant)])
hvd.broadcast_variables(model.variables, root_rank=0)
result["model_kernel_from_0"] = model.layers[0].kernel.numpy()
result["allgather"] = hvd.allgather(np.full((rank + 1, 2), rank)).numpy()
write_result(rank, result)
