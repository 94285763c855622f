"""kadapt.recipes: fast_fit end to end (a few steps), flip TTA, save/load."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import kadapt
from kadapt.recipes import FastFitConfig
from kadapt.recipes import fast_fit
from kadapt.recipes import predict_with_tta

TINY = FastFitConfig(widths=(4, 8), residual_stages=(0,), bias_lr_multiplier=4.0, warmup_fraction=0.25,
                     schedule="cosine")
ROWS, EPOCHS, BATCH = 32, 2, 16
STEPS = EPOCHS * ROWS // BATCH


def _data(rows=ROWS, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(rows, 8, 8)).astype("uint8"), rng.integers(0, 3, size=rows)


@pytest.fixture(scope="module")
def trained():
    x, y = _data()  # no batch_size: the recipe's for 32 rows is BATCH (16), which STEPS counts
    return fast_fit(x, y, validation_data=_data(8, seed=1), epochs=EPOCHS, config=TINY, seed=0)


def test_fast_fit_trains_every_step_with_the_cosine_schedules(trained):
    assert int(trained.optimizer.iterations.numpy()) == STEPS
    assert len(trained.history.history["val_loss"]) == EPOCHS
    last_momentum = kadapt.CosineMomentum(0.95, 0.85, STEPS, warmup_steps=1)(STEPS - 1)
    assert float(trained.optimizer.momentum.numpy()) == pytest.approx(float(last_momentum))


def test_flip_tta_is_the_mean_of_the_model_on_x_and_mirrored_x(trained):
    x = _data(6, seed=2)[0].astype("float32")[..., None]
    expected = (trained.predict(x, verbose=0) + trained.predict(x[:, :, ::-1], verbose=0)) / 2
    np.testing.assert_allclose(predict_with_tta(trained, x[..., 0]), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(predict_with_tta(trained, x, flip=False), trained.predict(x, verbose=0))


def _linear_model(shape, classes=3):
    model = keras.Sequential([keras.Input(shape), keras.layers.Flatten(), keras.layers.Dense(classes)])
    kernel = np.random.default_rng(0).normal(size=(int(np.prod(shape)), classes)).astype("float32")
    model.layers[-1].set_weights([kernel, np.zeros(classes, "float32")])
    return model, kernel


def _moved(image, dy, dx):
    """NumPy oracle: pad with zeros, then crop the window `(dy, dx)` pixels up-left of the original."""
    h, w = image.shape[:2]
    padded = np.pad(image, ((abs(dy), abs(dy)), (abs(dx), abs(dx)), (0, 0)))
    return padded[abs(dy) - dy:abs(dy) - dy + h, abs(dx) - dx:abs(dx) - dx + w]


def test_shift_tta_is_airbenchs_weighted_mean_of_mirrored_and_shifted_views():
    shape = (5, 6, 2)
    model, kernel = _linear_model(shape)
    x = np.random.default_rng(1).normal(size=(4, *shape)).astype("float32")
    logits = lambda images: np.stack([image.reshape(-1) @ kernel for image in images])
    view = lambda images: (logits(images) + logits(images[:, :, ::-1])) / 2
    moved = lambda d: np.stack([_moved(image, d, d) for image in x])
    expected = 0.5 * view(x) + 0.25 * view(moved(2)) + 0.25 * view(moved(-2))
    np.testing.assert_allclose(predict_with_tta(model, x, shift=2), expected, rtol=1e-5, atol=1e-5)
    without_flip = 0.5 * logits(x) + 0.25 * logits(moved(2)) + 0.25 * logits(moved(-2))
    np.testing.assert_allclose(predict_with_tta(model, x, flip=False, shift=2), without_flip, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shift, error, message", [
    (5, ValueError, r"Argument `shift` must be in \[0, 5\). Received: shift=5"),
    (-1, ValueError, r"Received: shift=-1"),
    (1.5, TypeError, r"Argument `shift` must be an int. Received: shift=1.5"),
])
def test_tta_rejects_a_shift_that_leaves_no_image(shift, error, message):
    model, _ = _linear_model((5, 6, 1))
    with pytest.raises(error, match=message):
        predict_with_tta(model, np.zeros((2, 5, 6, 1)), shift=shift)


def test_a_bfloat16_networks_outputs_are_averaged_and_scored_in_float32():
    """Under mixed_bfloat16 the logits come out in bfloat16, which NumPy sums in bfloat16: a mean
    loss over 8,000 rows came out 0.09 for 0.55 (a run's test loss)."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(8000, 3)).astype(keras.ops.convert_to_numpy(keras.ops.zeros(1, "bfloat16")).dtype)
    labels = rng.integers(0, 3, 8000)
    shifted = logits.astype("float64") - logits.astype("float64").max(-1, keepdims=True)
    expected = np.mean(np.log(np.exp(shifted).sum(-1)) - shifted[np.arange(8000), labels])  # closed form
    scores = kadapt.recipes.task.Task().scores(logits, labels)
    assert scores["loss"] == pytest.approx(expected, rel=1e-5)

    inputs = keras.Input((2, 2, 1))
    model = keras.Model(inputs, keras.ops.cast(keras.layers.Flatten()(inputs), "bfloat16"))
    images = rng.uniform(size=(8, 2, 2, 1)).astype("float32")
    averaged = predict_with_tta(model, images)
    assert averaged.dtype == np.float32
    flat = images.astype("bfloat16").astype("float32")
    np.testing.assert_array_equal(averaged, (flat.reshape(8, 4) + flat[:, :, ::-1].reshape(8, 4)) / 2)


def test_config_shifts_at_test_time_only_where_the_training_shifted():
    assert FastFitConfig().test_time_augmentation == {"flip": True, "shift": 1}
    assert FastFitConfig(translate=0.0).test_time_augmentation == {"flip": True, "shift": 0}
    assert FastFitConfig(flip=False, test_shift=0).test_time_augmentation == {"flip": False, "shift": 0}


def test_trained_model_round_trips_through_a_keras_file_in_safe_mode(trained, tmp_path):
    x = _data(6, seed=2)[0]
    trained.save(tmp_path / "fast.keras")
    restored = keras.saving.load_model(tmp_path / "fast.keras", safe_mode=True)
    np.testing.assert_allclose(predict_with_tta(restored, x, shift=1), predict_with_tta(trained, x, shift=1),
                               rtol=1e-6, atol=1e-6)
    assert isinstance(restored.optimizer, kadapt.optimizers.SGD)


def test_fast_fit_from_a_dataset_with_the_triangular_schedule():
    x, y = _data()
    dataset = tf.data.Dataset.from_tensor_slices((x[..., None], y)).batch(BATCH)
    config = FastFitConfig(**{**TINY.__dict__, "schedule": "triangular", "whitening": False, "ema_momentum": 0.5,
                              "restore_best_weights": False})
    model = fast_fit(dataset, epochs=EPOCHS, config=config, num_classes=3, seed=0)
    assert int(model.optimizer.iterations.numpy()) == STEPS
    assert float(model.optimizer.momentum.numpy()) == pytest.approx(0.9)
    assert model.optimizer.use_ema and model.output_shape == (None, 3)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(num_classes=None), r"`num_classes` is required with a dataset of int labels"),
        (dict(num_classes=3, repeat=True), r"`x` must be a finite dataset of known length"),
    ],
)
def test_fast_fit_rejects_unusable_datasets(arguments, message):
    x, y = _data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    if arguments.pop("repeat", False):
        dataset = dataset.repeat()
    with pytest.raises(ValueError, match=message):
        fast_fit(dataset, config=TINY, **arguments)


def test_config_rejects_an_unknown_schedule():
    with pytest.raises(ValueError, match=r"`schedule` must be one of triangular, cosine, constant. Received: schedule='linear'"):
        FastFitConfig(schedule="linear")


@pytest.fixture(scope="module")
def expanded():
    """32 rows and round(0.5 x 32) mixed up, in batches of 16: 3 steps, too few for a warmup step
    (int(0.25 x 3) = 0) under the triangular schedule."""
    x, y = _data()
    config = FastFitConfig(**{**TINY.__dict__, "schedule": "triangular", "expand": 0.5, "expand_method": "mixup"})
    return fast_fit(x, y, epochs=1, batch_size=BATCH, config=config, seed=0)


def test_fast_fit_expands_the_training_rows_before_the_schedule_counts_them(expanded):
    assert int(expanded.optimizer.iterations.numpy()) == 3  # ceil((32 + 16) / 16)
    schedule = expanded.optimizer._learning_rate  # a 2-step triangle would be 0 at step 2
    assert float(schedule(2)) == pytest.approx(TINY.learning_rate / 3) and float(schedule(3)) == 0.0


def test_fast_fit_with_fewer_steps_than_a_warmup_step_starts_the_triangle_at_the_peak(expanded):
    # The rate starts at the peak (as the cosine schedule does) instead of
    # building an invalid [0, 1, 1] schedule.
    assert float(expanded.optimizer._learning_rate(0)) == pytest.approx(TINY.learning_rate)


def test_fast_fit_refuses_expand_with_a_dataset():
    x, y = _data()
    dataset = tf.data.Dataset.from_tensor_slices((x[..., None].astype("float32"), y)).batch(BATCH)
    config = FastFitConfig(**{**TINY.__dict__, "expand": 0.5})
    with pytest.raises(ValueError, match="`config.expand` appends samples to arrays"):
        fast_fit(dataset, config=config, num_classes=3)


def test_each_epoch_is_a_permutation_keyed_by_its_index_and_a_resumed_stream_continues_the_whole():
    from kadapt.recipes.training import shuffled_batches

    rows = np.arange(10, dtype="float32").reshape(10, 1)
    labels = np.arange(10) % 2

    def epochs_of(stream):
        seen = np.concatenate([x.numpy()[:, 0] for x, _ in stream]).astype(int)
        return seen.reshape(-1, 10)

    whole = epochs_of(shuffled_batches(rows, labels, 4, 2, seed=7, epochs=4))
    assert whole.shape == (4, 10)  # 3 batches per epoch, the last of 2 rows
    for order in whole:
        assert sorted(order) == list(range(10))
    assert len({tuple(order) for order in whole}) == 4  # a new order every epoch
    np.testing.assert_array_equal(epochs_of(shuffled_batches(rows, labels, 4, 2, seed=7, epochs=4, first_epoch=2)),
                                  whole[2:])
    stream = shuffled_batches(rows, labels, 4, 2, seed=7, epochs=4)
    assert int(stream.cardinality()) == 12
    x, y = next(iter(stream))
    np.testing.assert_array_equal(y.numpy(), np.eye(2, dtype="float32")[x.numpy()[:, 0].astype(int) % 2])
