"""The training side: what runs in a worker's `fit`, custom loop or strategy, over the reducers (hvdkeras.reduce).

- optimizer: DistributedOptimizer (accumulation, loss scaling by its inner LossScaleOptimizer, the reducer,
  the inner update); tape: DistributedGradientTape; loops and strategy_loops: unmodified custom loops and
  `strategy.run` loops; strategy: tf.distribute's strategies in a job.
- models, xla: the model's optimizers and XLA; data: sharding input; learning_rate; saving, rank_zero,
  script_writes: who writes files; keras_output: Keras's output on rank 0 only; metric_states; sync_batch_norm;
  elastic; session: init and shutdown.

Nothing here is imported by `import hvdkeras.training`: each module is imported where it is used.
"""
