"""Knowledge distillation: a Distiller whose own compile calls super().compile() and which overrides
compute_loss, over a teacher and a student (keras.io "Knowledge Distillation")."""

import keras
import numpy as np
from keras import layers, ops


class Distiller(keras.Model):
    def __init__(self, student, teacher):
        super().__init__()
        self.teacher = teacher
        self.student = student

    def compile(self, optimizer, metrics, student_loss_fn, distillation_loss_fn, alpha=0.1, temperature=3):
        super().compile(optimizer=optimizer, metrics=metrics)
        self.student_loss_fn = student_loss_fn
        self.distillation_loss_fn = distillation_loss_fn
        self.alpha = alpha
        self.temperature = temperature

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, allow_empty=False):
        teacher_pred = self.teacher(x, training=False)
        student_loss = self.student_loss_fn(y, y_pred)
        distillation_loss = self.distillation_loss_fn(
            ops.softmax(teacher_pred / self.temperature, axis=1),
            ops.softmax(y_pred / self.temperature, axis=1),
        ) * (self.temperature ** 2)
        return self.alpha * student_loss + (1 - self.alpha) * distillation_loss

    def call(self, x):
        return self.student(x)


keras.utils.set_random_seed(5)
rng = np.random.default_rng(4)
x = rng.random((1024, 16)).astype("float32")
y = (x[:, :4].argmax(axis=1)).astype("int64")

teacher = keras.Sequential([keras.Input(shape=(16,)), layers.Dense(32, activation="relu"), layers.Dense(4)],
                           name="teacher")
student = keras.Sequential([keras.Input(shape=(16,)), layers.Dense(8, activation="relu"), layers.Dense(4)],
                           name="student")
teacher.compile(optimizer=keras.optimizers.Adam(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=[keras.metrics.SparseCategoricalAccuracy()])
teacher.fit(x, y, epochs=2, verbose=2)

model = Distiller(student=student, teacher=teacher)
model.compile(
    optimizer=keras.optimizers.Adam(),
    metrics=[keras.metrics.SparseCategoricalAccuracy()],
    student_loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    distillation_loss_fn=keras.losses.KLDivergence(),
    alpha=0.1,
    temperature=10,
)
history = model.fit(x, y, epochs=8, verbose=2)
print(model.evaluate(x, y, verbose=0))
