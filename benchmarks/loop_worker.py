"""One worker of the custom-loop benchmark (loop_benchmark.py): the step of a tf.function GradientTape loop
against the same model's `fit` step, on one model, side by side in one process.

    loop_worker.py keras3|keras2 OUT_JSON --model conv|mlp --steps S --rounds R [--warmup W]

keras3: fit (hvdkeras.DistributedOptimizer in Keras's fit), tape (hvdkeras.DistributedGradientTape in a
        tf.function loop, a plain optimizer), unmodified (the same loop with a plain tape and a plain optimizer,
        made data-parallel by the patch `hvdkeras run` installs: hvdkeras.training.loops), horovod_tape (Horovod's own
        DistributedGradientTape on Keras 3, given the tf.Variables inside the Keras ones, which it needs).
keras2: horovod_tape_keras2 (Horovod's DistributedGradientTape with tf-keras, TF_USE_LEGACY_KERAS=1, as Horovod
        documents its TF2 loop) and horovod_fit_keras2 (Horovod's Keras DistributedOptimizer in tf-keras's fit).

Every worker trains on its own batches of net_worker.BATCH rows in every variant (the loops are given each
worker's batch, as fit is), so the variants differ in how the gradients are reduced and applied only. Each
rank writes OUT_JSON.rankN: per variant, the median step interval of each round.
"""

import argparse
import json
import os

import tensorflow as tf
from net_worker import MODELS, dataset, fit_runner, horovod_tape_runner, loop_runner, measure, set_threads


def tape_step(model, optimizer, loss_fn, wrap_tape):
    @tf.function
    def step(batch):
        xb, yb = batch
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = wrap_tape(tape).gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step


def keras3_runners(model_name, rank, barrier):
    import keras

    import hvdkeras as hvd
    from hvdkeras.training import loops

    make, shape = MODELS[model_name]
    data = dataset(shape, rank)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    runners = {}
    m = make(keras)
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.001)), loss=loss, jit_compile=False)
    runners["fit"] = fit_runner(keras, m, data, barrier)

    def loop(wrap_tape, first=None):
        model, opt = make(keras), keras.optimizers.SGD(0.001)
        opt.build(model.trainable_variables)
        it = iter(data)
        step = tape_step(model, opt, loss, wrap_tape)
        if first is not None:
            first(lambda: step(next(it)))
        return loop_runner(lambda: float(step(next(it))), barrier)

    runners["tape"] = loop(hvd.DistributedGradientTape)

    def traced_with_the_patch(call):
        # What `hvdkeras run` installs for the whole script; here only while this step is traced, so that the
        # other variants' plain optimizers stay plain.
        loops.install()
        try:
            call()
        finally:
            loops.uninstall()

    runners["unmodified"] = loop(lambda tape: tape, first=traced_with_the_patch)
    runners["horovod_tape"] = horovod_tape_runner(keras, make, data, loss, barrier)
    return runners


def keras2_runners(model_name, rank, barrier):
    import horovod.tensorflow as htf
    import horovod.tensorflow.keras as hvdk

    keras = tf.keras  # tf-keras 2.x: TF_USE_LEGACY_KERAS=1
    make, shape = MODELS[model_name]
    data = dataset(shape, rank)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    runners = {}
    m = make(keras)
    m.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.001)), loss=loss)
    runners["horovod_fit_keras2"] = fit_runner(keras, m, data, barrier)
    model, opt = make(keras), keras.optimizers.SGD(0.001)
    it = iter(data)
    step = tape_step(model, opt, loss, htf.DistributedGradientTape)
    runners["horovod_tape_keras2"] = loop_runner(lambda: float(step(next(it))), barrier)
    return runners


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["keras3", "keras2"])
    parser.add_argument("out")
    parser.add_argument("--model", choices=sorted(MODELS), default="conv")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    set_threads(1)
    import horovod.tensorflow as htf

    from hvdkeras.job import launchers as launching
    from hvdkeras.job import rendezvous

    if args.kind == "keras2":
        import horovod.tensorflow.keras as hvdk

        with rendezvous.init_watchdog(rendezvous.form(launching.detect(os.environ))):
            hvdk.init()
    else:
        import hvdkeras as hvd

        hvd.init()
    rank, size = htf.rank(), htf.size()
    one = tf.constant(1.0)

    def barrier():
        htf.allreduce(one, name="bench.barrier", op=htf.Sum)

    runners = (keras2_runners if args.kind == "keras2" else keras3_runners)(args.model, rank, barrier)
    wall, _, _ = measure(runners, args.steps, args.rounds, args.warmup)
    path = f"{args.out}.rank{rank}"
    with open(path + ".tmp", "w") as f:
        json.dump({"rank": rank, "size": size, "model": args.model, "rounds_s": wall}, f, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
