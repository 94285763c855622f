"""Prodigy against a NumPy transcription of PyPI `prodigyopt` 1.1.2 (`Prodigy.step`): d is one
scalar over all the variables (here a kernel and a bias). With `use_bias_correction=True` (which
optax always applies) the transcription agreed with `optax.contrib.prodigy` (optax 0.2.8, float64,
25 steps: defaults, safeguard with beta3, decoupled decay) to 1e-15, checked once outside the suite."""

import math

import keras
import numpy as np
import pytest

import kadapt
from kadapt.optimizers import Prodigy
from test_live_sgd import SetEachStep
from test_schedule_free import FEATURES, ROWS, _data, _fit, _gradients

pytestmark = pytest.mark.backends("tensorflow", "jax")

STEPS = 25


def _model(optimizer, jit_compile="auto"):
    # Zero weights at the start: w0 - w is then exactly -w. From other weights,
    # the first steps at d0 = 1e-6 move them by ~1e-6, where w0 - w keeps two
    # digits in float32 and any two float32 implementations differ by ~1%.
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1, kernel_initializer="zeros")])
    model.compile(optimizer=optimizer, loss="mse", jit_compile=jit_compile)
    return model


def _reference(steps, lr=1.0, beta_1=0.9, beta_2=0.999, beta_3=None, epsilon=1e-8, weight_decay=0.0,
               decouple=True, use_bias_correction=False, safeguard_warmup=False, d0=1e-6,
               d_coef=1.0, growth_rate=float("inf"), multipliers=None):
    """`Prodigy.step()` of prodigyopt 1.1.2 (one group, slice_p=1); returns (params, d).
    `multipliers[k]`: the group's lr set to lr * multipliers[k] before step k. With beta_1 = 0 it
    keeps no `exp_avg` and steps with `p.grad` (coupled decay added in place) times the new d."""
    params = [np.zeros((FEATURES, 1)), np.zeros(1)]
    p0 = [p.copy() for p in params]
    exp_avg, exp_avg_sq, s = ([np.zeros_like(p) for p in params] for _ in range(3))
    beta3 = math.sqrt(beta_2) if beta_3 is None else beta_3
    d, d_max, d_numerator, k = d0, d0, 0.0, 0
    for step in range(steps):
        grads = _gradients(params)
        lr_k = lr * (1.0 if multipliers is None else multipliers[step])
        bias_correction = 1
        if use_bias_correction:
            bias_correction = (1 - beta_2 ** (k + 1)) ** 0.5 / (1 - beta_1 ** (k + 1))
        dlr = d * lr_k * bias_correction
        d_numerator *= beta3
        delta_numerator, d_denom = 0.0, 0.0
        for i in range(len(grads)):
            if weight_decay != 0 and not decouple:
                grads[i] = grads[i] + weight_decay * params[i]
            grad = grads[i]
            delta_numerator += (d / d0) * dlr * np.dot(grad.ravel(), (p0[i] - params[i]).ravel())
            exp_avg[i] = exp_avg[i] * beta_1 + d * (1 - beta_1) * grad
            exp_avg_sq[i] = exp_avg_sq[i] * beta_2 + d * d * (1 - beta_2) * grad * grad
            s[i] = s[i] * beta3 + (d / d0) * (d if safeguard_warmup else dlr) * grad
            d_denom += np.abs(s[i]).sum()
        d_numerator = d_numerator + delta_numerator
        d_hat = d_coef * d_numerator / d_denom
        if d == d0:
            d = max(d, d_hat)
        d_max = max(d_max, d_hat)
        d = min(d_max, d * growth_rate)
        for i in range(len(params)):
            denom = np.sqrt(exp_avg_sq[i]) + d * epsilon
            if weight_decay != 0 and decouple:
                params[i] = params[i] - weight_decay * dlr * params[i]
            if beta_1 > 0:
                params[i] = params[i] - dlr * exp_avg[i] / denom
            else:
                params[i] = params[i] - dlr * d * grads[i] / denom
        k += 1
    return params, d


CASES = {
    "defaults": {},
    "coupled_decay_bias_correction_safeguard": dict(
        weight_decay=0.1, decouple=False, use_bias_correction=True, safeguard_warmup=True,
        d0=1e-3, d_coef=2.0, beta_3=0.95),
    "decoupled_decay_growth_rate": dict(weight_decay=0.05, d0=1e-3, growth_rate=1.1, beta_1=0.0),
    "no_momentum": dict(beta_1=0.0),
    "no_momentum_coupled_decay": dict(beta_1=0.0, weight_decay=0.1, decouple=False, d0=1e-3),
}


# float32 against float64. d_coef=2 overshoots and swings the weights, and the
# float32 rounding of sum(|s|) grows to 3e-5 of d over 25 steps there; a change
# of the rule (beta_3, the safeguard) moves the weights by > 1e-3.
TOLERANCE = {"coupled_decay_bias_correction_safeguard": 1e-5}


def _assert_matches(model, expected_params, expected_d, atol=1e-6):
    for ours, theirs in zip(model.get_weights(), expected_params):
        np.testing.assert_allclose(ours, theirs, rtol=10 * atol, atol=atol)
    assert model.optimizer.d == pytest.approx(expected_d, rel=10 * atol)


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_reference(case):
    config = dict(CASES[case])
    model = _model(kadapt.optimizers.Prodigy(**config))
    _fit(model, STEPS)
    params, d = _reference(STEPS, **config)
    assert d > 10 * config.get("d0", 1e-6)
    _assert_matches(model, params, d, TOLERANCE.get(case, 1e-6))


def test_xla_compiled_step_matches_reference():
    # The step compiled whole by XLA (TensorFlow's default leaves it to Keras' choice).
    config = dict(CASES["defaults"])
    model = _model(kadapt.optimizers.Prodigy(**config), jit_compile=True)
    _fit(model, STEPS)
    params, d = _reference(STEPS, **config)
    _assert_matches(model, params, d, TOLERANCE.get("defaults", 1e-6))


def test_accumulated_steps_equal_full_batch():
    config = CASES["coupled_decay_bias_correction_safeguard"]
    full = _model(kadapt.optimizers.Prodigy(**config))
    _fit(full, STEPS)
    accumulated = kadapt.accumulate(_model(kadapt.optimizers.Prodigy(**config)), micro_batch_size=4)
    _fit(accumulated, STEPS)
    assert int(accumulated.optimizer.iterations.numpy()) == STEPS
    for ours, theirs in zip(accumulated.get_weights(), full.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert accumulated.optimizer.d == pytest.approx(full.optimizer.d, rel=1e-5)


def test_keras_file_round_trip_continues_uninterrupted(tmp_path):
    optimizer = kadapt.optimizers.Prodigy(d0=1e-3, growth_rate=1.2, use_bias_correction=True)
    whole = _model(optimizer)
    _fit(whole, STEPS)
    model = _model(kadapt.optimizers.Prodigy.from_config(optimizer.get_config()))
    _fit(model, 10)
    model.save(tmp_path / "model.keras")
    restored = kadapt.load_model(tmp_path / "model.keras")
    assert restored.optimizer.get_config() == optimizer.get_config()
    assert restored.optimizer.d == model.optimizer.d
    _fit(restored, STEPS - 10)
    for ours, theirs in zip(restored.get_weights(), whole.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-7)
    assert restored.optimizer.d == pytest.approx(whole.optimizer.d, rel=1e-6)


def test_multiplier_changed_mid_fit_takes_effect():
    multipliers = [1.0] * 10 + [0.5] * 15
    model = _model(kadapt.optimizers.Prodigy(d0=1e-3))
    _fit(model, STEPS, [SetEachStep("learning_rate_multiplier", multipliers)])
    params, d = _reference(STEPS, d0=1e-3, multipliers=multipliers)
    _assert_matches(model, params, d)
    unchanged, _ = _reference(STEPS, d0=1e-3)
    assert not np.allclose(model.get_weights()[0], unchanged[0], atol=1e-3)


@pytest.mark.parametrize("make, message", [
    (lambda: Prodigy(beta_1=1.0), r"`beta_1` must be in \[0.0, 1.0\). Received: beta_1=1.0"),
    (lambda: Prodigy(beta_3=-0.5), r"`beta_3` must be in \[0.0, 1.0\). Received: beta_3=-0.5"),
    (lambda: Prodigy(d0=0.0), r"`d0` must be in \(0.0, None\]. Received: d0=0.0"),
    (lambda: Prodigy(d_coef=-1.0), r"`d_coef` must be in \(0.0, None\]. Received: d_coef=-1.0"),
    (lambda: Prodigy(weight_decay=-0.1), r"`weight_decay` must be in \[0.0, None\]. Received: weight_decay=-0.1"),
    (lambda: Prodigy(growth_rate=0.5), r"`growth_rate` must be in \[1.0, None\]. Received: growth_rate=0.5"),
    (lambda: Prodigy(epsilon=0.0), r"`epsilon` must be in \(0.0, None\]. Received: epsilon=0.0"),
    (lambda: Prodigy(gradient_accumulation_steps=2),
     r"`gradient_accumulation_steps` is not supported.*kadapt.accumulate"),
])
def test_bad_arguments_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.backends("tensorflow")
def test_two_replicas_step_as_one_device(mirrored_strategy):
    """d is global: under tf.distribute each replica sums over all its components."""
    config = CASES["decoupled_decay_growth_rate"]
    single = _model(kadapt.optimizers.Prodigy(**config))
    _fit(single, STEPS)
    with mirrored_strategy.scope():
        mirrored = _model(kadapt.optimizers.Prodigy(**config))
    _fit(mirrored, STEPS)
    for ours, theirs in zip(mirrored.get_weights(), single.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert mirrored.optimizer.d == pytest.approx(single.optimizer.d, rel=1e-5)


def test_optimizers_by_name():
    optimizer = kadapt.optimizers.get("prodigy", safeguard_warmup=True)
    assert isinstance(optimizer, kadapt.optimizers.Prodigy) and optimizer.safeguard_warmup
    assert isinstance(kadapt.optimizers.get("schedule_free_adamw"), kadapt.optimizers.ScheduleFreeAdamW)
    with pytest.raises(ValueError, match=r"`name` must be one of \['adam', .*\]. Received: name='adamw'"):
        kadapt.optimizers.get("adamw")


def test_after_a_restart_to_the_initial_state_the_steps_are_a_fresh_prodigys():
    """The moments restart at zero while `iterations` counts on; with bias correction it counts
    from the restart (`RestartableMoments`), and w0, s and d come back from the point."""
    from test_live_adam import RestartAt

    config = dict(CASES["coupled_decay_bias_correction_safeguard"])
    model = _model(kadapt.optimizers.Prodigy(**config))
    model.optimizer.build(model.trainable_variables)
    _fit(model, 2 * STEPS, [RestartAt(STEPS)])
    params, d = _reference(STEPS, **config)
    _assert_matches(model, params, d, TOLERANCE["coupled_decay_bias_correction_safeguard"])
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 2 * STEPS


def test_after_a_restart_to_the_initial_state_w0_is_the_initial_weights():
    """The point taken before the first step holds w0's slot unset (zeros); the step after the
    restart takes w0 again, where s is zero, though `iterations` is not."""
    from test_live_adam import RestartAt

    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1, kernel_initializer="ones")])
    model.compile(optimizer=kadapt.optimizers.Prodigy(), loss="mse")
    model.optimizer.build(model.trainable_variables)
    initial_weights = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
    _fit(model, 5, [RestartAt(3)])
    slots = [v for v in model.optimizer.variables if v.name.endswith("_initial")]
    assert len(slots) == len(initial_weights) == 2
    for slot, weights in zip(slots, initial_weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(slot), weights)
