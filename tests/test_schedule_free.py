"""Schedule-Free SGD and AdamW against a NumPy transcription of PyPI `schedulefree` 1.4.1
(`SGDScheduleFree.step`, `AdamWScheduleFree.step`, their `eval`), and where the model is
left: x (the average) after `fit` and for validation, y (the gradient point) for training.
The transcription agreed with `optax.contrib.schedule_free_{adamw,sgd}` (optax 0.2.8, float64,
24 steps, x and y, with and without weight decay) to 1e-15, checked once outside the suite."""

import keras
import numpy as np
import pytest

import kadapt
from kadapt.optimizers import ScheduleFreeAdamW
from kadapt.optimizers import ScheduleFreeSGD
from test_live_sgd import SetEachStep

pytestmark = pytest.mark.backends("tensorflow", "jax")

ROWS, FEATURES, STEPS = 16, 3, 24


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(ROWS, FEATURES)).astype("float32"), rng.normal(size=(ROWS, 1)).astype("float32")


def _model(optimizer, jit_compile="auto"):
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1, kernel_initializer="ones")])
    model.compile(optimizer=optimizer, loss="mse", jit_compile=jit_compile)
    return model


def _fit(model, steps, callbacks=(), **kwargs):
    """`steps` full-batch steps in one epoch."""
    x, y = _data()
    x, y = np.concatenate([x] * steps), np.concatenate([y] * steps)
    return model.fit(x, y, batch_size=ROWS, epochs=1, verbose=0, shuffle=False,
                     callbacks=list(callbacks), **kwargs)


def _gradients(params):
    """Mean squared error of a dense layer on the full batch, in float64."""
    x, y = (a.astype(np.float64) for a in _data())
    residual = x @ params[0] + params[1] - y
    return [2.0 / ROWS * x.T @ residual, 2.0 / ROWS * residual.sum(axis=0)]


def _loss(params):
    x, y = (a.astype(np.float64) for a in _data())
    return float(np.mean((x @ params[0] + params[1] - y) ** 2))


def _reference(steps, lr, beta1, adam=True, beta2=0.999, eps=1e-8, weight_decay=0.0,
               warmup_steps=0, r=0.0, weight_lr_power=2.0, multipliers=None, gradient_at_x=()):
    """`step()` of schedulefree 1.4.1 (non-foreach branch), then `eval()`; returns (y, x).
    `multipliers[k]`: the group's lr set to lr * multipliers[k] before step k; steps in
    `gradient_at_x` take the gradient at x (`eval()` before the forward pass, `train()` after)."""
    y = [np.ones((FEATURES, 1)), np.zeros(1)]
    z = [p.copy() for p in y]
    exp_avg_sq = [np.zeros_like(p) for p in y]
    lr_max, weight_sum = -1.0, 0.0
    for k in range(steps):
        point = [p + (1 - 1 / beta1) * (zp - p) for p, zp in zip(y, z)] if k in gradient_at_x else y
        grads = _gradients(point)
        sched = (k + 1) / warmup_steps if k < warmup_steps else 1.0
        lr_k = lr * (1.0 if multipliers is None else multipliers[k]) * sched
        lr_max = max(lr_k, lr_max)
        weight = ((k + 1) ** r) * (lr_max ** weight_lr_power)
        weight_sum += weight
        ckp1 = weight / weight_sum
        for i, grad in enumerate(grads):
            if adam:
                exp_avg_sq[i] = exp_avg_sq[i] * beta2 + (1 - beta2) * grad * grad
                grad = grad / (np.sqrt(exp_avg_sq[i] / (1 - beta2 ** (k + 1))) + eps)
            if weight_decay != 0:
                grad = grad + weight_decay * y[i]
            y[i] = y[i] + ckp1 * (z[i] - y[i])
            y[i] = y[i] + lr_k * (beta1 * (1 - ckp1) - 1) * grad
            z[i] = z[i] - lr_k * grad
    x = [p + (1 - 1 / beta1) * (zp - p) for p, zp in zip(y, z)]
    return y, x


def _assert_params(model, expected):
    for ours, theirs in zip(model.get_weights(), expected):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


ADAMW_CASES = {
    "defaults": dict(learning_rate=0.0025),
    "warmup_decay_r": dict(learning_rate=0.05, beta_1=0.8, beta_2=0.99, weight_decay=0.1,
                           warmup_steps=5, r=1.0, weight_lr_power=1.0),
}
SGD_CASES = {
    "defaults": dict(learning_rate=0.2),
    "warmup_decay_r": dict(learning_rate=0.1, momentum=0.7, weight_decay=0.05, warmup_steps=5,
                           r=0.5, weight_lr_power=3.0),
}


def _reference_args(config, adam):
    args = dict(config)
    lr = args.pop("learning_rate")
    beta1 = args.pop("beta_1" if adam else "momentum", 0.9)
    if "beta_2" in args:
        args["beta2"] = args.pop("beta_2")
    return lr, beta1, args


@pytest.mark.parametrize("case", sorted(ADAMW_CASES))
def test_adamw_matches_reference_at_x_and_y(case):
    config = ADAMW_CASES[case]
    model = _model(kadapt.optimizers.ScheduleFreeAdamW(**config))
    _fit(model, STEPS)
    lr, beta1, args = _reference_args(config, adam=True)
    y, x = _reference(STEPS, lr, beta1, adam=True, **args)
    _assert_params(model, x)
    model.optimizer.move_to_gradient_point(model.trainable_variables)
    _assert_params(model, y)


@pytest.mark.parametrize("adam", [True, False])
def test_xla_compiled_step_matches_reference(adam):
    # The step compiled whole by XLA (TensorFlow's default leaves it to Keras' choice).
    make = kadapt.optimizers.ScheduleFreeAdamW if adam else kadapt.optimizers.ScheduleFreeSGD
    config = (ADAMW_CASES if adam else SGD_CASES)["warmup_decay_r"]
    model = _model(make(**config), jit_compile=True)
    _fit(model, STEPS)
    lr, beta1, args = _reference_args(config, adam=adam)
    _assert_params(model, _reference(STEPS, lr, beta1, adam=adam, **args)[1])


@pytest.mark.parametrize("case", sorted(SGD_CASES))
def test_sgd_matches_reference_at_x_and_y(case):
    config = SGD_CASES[case]
    model = _model(kadapt.optimizers.ScheduleFreeSGD(**config))
    _fit(model, STEPS)
    lr, beta1, args = _reference_args(config, adam=False)
    y, x = _reference(STEPS, lr, beta1, adam=False, **args)
    _assert_params(model, x)
    model.optimizer.move_to_gradient_point(model.trainable_variables)
    _assert_params(model, y)


def test_multiplier_changed_mid_fit_takes_effect():
    multipliers = [1.0] * 8 + [3.0] * 8 + [0.5] * 8
    model = _model(kadapt.optimizers.ScheduleFreeSGD(0.1, warmup_steps=4))
    _fit(model, STEPS, [SetEachStep("learning_rate_multiplier", multipliers)])
    _, x = _reference(STEPS, 0.1, 0.9, adam=False, warmup_steps=4, multipliers=multipliers)
    _assert_params(model, x)
    _, unchanged = _reference(STEPS, 0.1, 0.9, adam=False, warmup_steps=4)
    assert not np.allclose(model.get_weights()[0], unchanged[0], atol=1e-3)


def test_validation_sees_x_with_the_callback_and_y_without():
    y, x = _reference(STEPS, 0.05, 0.9)
    assert abs(_loss(x) - _loss(y)) > 1e-3
    for callbacks, point in (([kadapt.callbacks.ScheduleFreeEvaluation()], x), ([], y)):
        model = _model(kadapt.optimizers.ScheduleFreeAdamW(0.05))
        history = _fit(model, STEPS, callbacks, validation_data=_data())
        assert history.history["val_loss"][-1] == pytest.approx(_loss(point), rel=1e-5)


def test_next_fit_resumes_at_y_exactly():
    whole = _model(kadapt.optimizers.ScheduleFreeAdamW(0.05, warmup_steps=3))
    _fit(whole, STEPS)
    split = _model(kadapt.optimizers.ScheduleFreeAdamW(0.05, warmup_steps=3))
    callback = kadapt.callbacks.ScheduleFreeEvaluation()
    _fit(split, 10, [callback], validation_data=_data())
    assert split.optimizer.at_evaluation_point
    _fit(split, STEPS - 10, [callback], validation_data=_data())
    for ours, theirs in zip(split.get_weights(), whole.get_weights()):
        np.testing.assert_array_equal(ours, theirs)


def test_without_the_callback_one_gradient_of_the_next_fit_is_taken_at_x():
    model = _model(kadapt.optimizers.ScheduleFreeAdamW(0.05))
    _fit(model, 10)
    _fit(model, STEPS - 10)
    y, x = _reference(STEPS, 0.05, 0.9, gradient_at_x={10})
    assert not np.allclose(x[0], _reference(STEPS, 0.05, 0.9)[1][0], atol=1e-5)
    _assert_params(model, x)
    model.optimizer.move_to_gradient_point(model.trainable_variables)
    _assert_params(model, y)


def test_keras_file_round_trip_continues_uninterrupted(tmp_path):
    optimizer = kadapt.optimizers.ScheduleFreeSGD(0.1, momentum=0.8, weight_decay=0.01, warmup_steps=4)
    whole = _model(optimizer)
    _fit(whole, STEPS)
    model = _model(kadapt.optimizers.ScheduleFreeSGD.from_config(optimizer.get_config()))
    _fit(model, 10)
    model.save(tmp_path / "model.keras")
    restored = kadapt.load_model(tmp_path / "model.keras")
    assert restored.optimizer.get_config() == optimizer.get_config()
    np.testing.assert_array_equal(restored.get_weights()[0], model.get_weights()[0])
    _fit(restored, STEPS - 10, [kadapt.callbacks.ScheduleFreeEvaluation()])
    for ours, theirs in zip(restored.get_weights(), whole.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-7)


def test_accumulated_steps_equal_full_batch_and_validate_at_x():
    full = _model(kadapt.optimizers.ScheduleFreeAdamW(0.05))
    _fit(full, STEPS)
    accumulated = kadapt.accumulate(_model(kadapt.optimizers.ScheduleFreeAdamW(0.05)), micro_batch_size=4)
    history = _fit(accumulated, STEPS, validation_data=_data())
    assert int(accumulated.optimizer.iterations.numpy()) == STEPS
    for ours, theirs in zip(accumulated.get_weights(), full.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    _, x = _reference(STEPS, 0.05, 0.9)
    assert history.history["val_loss"][-1] == pytest.approx(_loss(x), rel=1e-5)


@pytest.mark.parametrize("make, message", [
    (lambda: ScheduleFreeAdamW(keras.optimizers.schedules.CosineDecay(0.1, 10)),
     r"need no learning-rate schedule.*`warmup_steps`.*Pass a float. Received: learning_rate=<"),
    (lambda: ScheduleFreeSGD(0.0), r"`learning_rate` must be in \(0.0, None\]. Received: learning_rate=0.0"),
    (lambda: ScheduleFreeAdamW(beta_1=1.0), r"`beta_1` must be in \(0.0, 1.0\). Received: beta_1=1.0"),
    (lambda: ScheduleFreeAdamW(beta_2=-0.1), r"`beta_2` must be in \[0.0, 1.0\). Received: beta_2=-0.1"),
    (lambda: ScheduleFreeSGD(momentum=0.0), r"`momentum` must be in \(0.0, 1.0\). Received: momentum=0.0"),
    (lambda: ScheduleFreeSGD(weight_decay=-1e-4), r"Received: weight_decay=-0.0001"),
    (lambda: ScheduleFreeAdamW(warmup_steps=-1), r"`warmup_steps` must be an int >= 0. Received: warmup_steps=-1"),
    (lambda: ScheduleFreeAdamW(gradient_accumulation_steps=4),
     r"`gradient_accumulation_steps` is not supported.*kadapt.accumulate"),
])
def test_bad_arguments_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_batch_statistics_become_the_mean_over_passes_at_the_weights():
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.BatchNormalization(momentum=0.99)])
    x, _ = _data()
    inputs = [x[:4] * 2.0, x[4:8] + 1.0, x[8:12], x[12:]]
    batches = [inputs[0], (inputs[1], None), inputs[2], inputs[3]]
    assert kadapt.optimizers.recompute_batch_statistics(model, batches, steps=3) == 3
    layer = model.layers[0]
    for statistic, moving in ((np.mean, layer.moving_mean), (np.var, layer.moving_variance)):
        expected = np.mean([statistic(b, axis=0) for b in inputs[:3]], axis=0)
        np.testing.assert_allclose(moving.numpy(), expected, rtol=1e-5, atol=1e-6)
    assert layer.momentum == 0.99


@pytest.mark.backends("tensorflow")
def test_two_replicas_step_and_validate_as_one_device(mirrored_strategy):
    single = _model(kadapt.optimizers.ScheduleFreeAdamW(0.05))
    _fit(single, STEPS)
    with mirrored_strategy.scope():
        mirrored = _model(kadapt.optimizers.ScheduleFreeAdamW(0.05))
    history = _fit(mirrored, STEPS, [kadapt.callbacks.ScheduleFreeEvaluation()], validation_data=_data())
    for ours, theirs in zip(mirrored.get_weights(), single.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    _, x = _reference(STEPS, 0.05, 0.9)
    assert history.history["val_loss"][-1] == pytest.approx(_loss(x), rel=1e-5)


def test_callback_leaves_x_under_a_loss_scale_optimizer():
    optimizer = keras.optimizers.LossScaleOptimizer(kadapt.optimizers.ScheduleFreeAdamW(0.05))
    model = _model(optimizer)
    _fit(model, STEPS, [kadapt.callbacks.ScheduleFreeEvaluation()])
    y, x = _reference(STEPS, 0.05, 0.9)
    _assert_params(model, x)


def test_a_rollback_restart_keeps_the_iterates_and_zeroes_only_the_moments():
    """`kadapt.meta.observe.rollback.restore(..., restart_momentum=True)` (the dead-run rescue's and the
    MetaAdjuster's restart) puts z and y back as they were at the point; AdamW's second moment is zeroed."""
    from kadapt.meta.observe import rollback

    x, y = _data()
    model = _model(ScheduleFreeAdamW(0.1))
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    point = rollback.take(model)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    rollback.restore(model, point, restart_momentum=True)
    for variable, value in zip(model.optimizer.variables, point.optimizer, strict=True):
        if value is None or not value.ndim:
            continue
        expected = np.zeros_like(value) if variable.name.endswith("_velocity") else value
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), expected, err_msg=variable.name)
    assert any(v.name.endswith("_z") for v in model.optimizer.variables)


def test_after_a_restart_to_the_initial_state_adamw_steps_as_a_fresh_one():
    """The second moment restarts at zero while `iterations` counts on; its bias correction
    counts from the restart (`RestartableMoments`), so the steps after it are a fresh run's."""
    from test_live_adam import RestartAt

    model = _model(ScheduleFreeAdamW(0.05))
    model.optimizer.build(model.trainable_variables)
    _fit(model, 8, [RestartAt(4)])
    y, x = _reference(4, 0.05, 0.9, adam=True)
    _assert_params(model, x)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 8
