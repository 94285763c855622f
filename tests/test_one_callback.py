"""`kadapt.MetaAdjuster()` alone tunes a `model.fit` as `kadapt train` does: a run that diverges or
sits at chance is rescued on the chance level of its compiled loss, derived from the rows fit trains
on, and a part that cannot act says so in one line while fit runs on."""

import math
import warnings

import keras
import numpy as np
import pytest

import kadapt
from kadapt.meta.live.chance_loss import chance_loss

TRAIN_ROWS = 240  # of 320: validation_split=0.25 holds the last 80 out


def imbalanced_rows():
    """320 rows of 4 features, classes 0/1/2 at 50/30/20%, each a shift of 3 along its own axis."""
    rng = np.random.default_rng(0)
    y = rng.permutation(np.repeat([0, 1, 2], [160, 96, 64]))
    x = (rng.normal(size=(320, 4)) + 3 * np.eye(3, 4)[y]).astype("float32")
    return x, y


def classifier(learning_rate, loss=None):
    keras.utils.set_random_seed(0)
    network = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
    network.compile(kadapt.optimizers.SGD(learning_rate),
                    loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return network


def fit(network, adjuster, x, y, epochs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = network.fit(x, y, validation_split=0.25, batch_size=32, epochs=epochs, verbose=0,
                              callbacks=[adjuster])
    return history.history, [str(w.message) for w in caught if str(w.message).startswith("MetaAdjuster:")]


def rescues(adjuster, trigger):
    return [d for d in adjuster.decisions if d["trigger"] == trigger]


def test_a_run_at_a_diverging_rate_is_rescued_on_its_compiled_loss_s_chance_level():
    x, y = imbalanced_rows()
    adjuster = kadapt.MetaAdjuster(verbose=0)
    history, lines = fit(classifier(30.0), adjuster, x, y, epochs=5)
    chance = chance_loss(y[:TRAIN_ROWS], 3)  # 1.03: below ln 3, as the classes are not balanced
    [rescue] = rescues(adjuster, "diverged")
    assert rescue["epoch"] == 0 and rescue["rollback"] and lines == []
    assert rescue["features"]["chance_loss"] == pytest.approx(chance)
    assert history["val_loss"][0] > 100 * chance and history["val_loss"][-1] < 0.5 * chance


def test_a_run_left_at_chance_is_rescued():
    x, y = imbalanced_rows()
    adjuster = kadapt.MetaAdjuster(verbose=0)
    history, _ = fit(classifier(1e-6), adjuster, x, y, epochs=5)
    [rescue] = rescues(adjuster, "at_chance")
    assert rescue["epoch"] == 1 and "range test" in rescue["action"]
    assert history["val_loss"][1] > chance_loss(y[:TRAIN_ROWS], 3) > 1.5 * history["val_loss"][-1]


def my_loss(y_true, y_pred):
    return 2.0 * keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)


def test_a_custom_loss_turns_the_chance_rule_off_in_one_line_and_fit_runs_on():
    x, y = imbalanced_rows()
    adjuster = kadapt.MetaAdjuster(verbose=0)
    history, lines = fit(classifier(0.1, my_loss), adjuster, x, y, epochs=2)
    assert lines == [
        "MetaAdjuster: the dead-run rescue's at-chance rule is off: the chance level of the loss 'my_loss' is "
        "unknown (known: Keras' sparse, categorical and binary cross-entropies, mean squared and mean absolute "
        "errors, one output). Pass chance_loss=<the loss of the best constant prediction> to turn it on (a "
        "divergence is still rescued)."]
    assert adjuster.rescue.rule.chance_loss == math.inf and len(history["loss"]) == 2
    given = kadapt.MetaAdjuster(verbose=0, chance_loss=0.5)
    _, lines = fit(classifier(0.1, my_loss), given, x, y, epochs=2)
    assert lines == [] and given.rescue.rule.chance_loss == 0.5


def test_rows_of_strings_turn_the_derived_parts_off_in_one_line_each():
    """A network that looks its string inputs up: the rows are not arrays of numbers, so neither
    the chance level nor a restart's rows can be derived; fit runs on."""
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    words = tf.data.Dataset.from_tensor_slices((np.array([["a"], ["b"], ["c"], ["d"]] * 20),
                                                np.array([0, 1, 2, 0] * 20))).batch(16)
    network = keras.Sequential([keras.Input((1,), dtype="string"),
                                keras.layers.StringLookup(vocabulary=["a", "b", "c", "d"], output_mode="one_hot"),
                                keras.layers.Flatten(), keras.layers.Dense(3)])
    network.compile(kadapt.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    adjuster = kadapt.MetaAdjuster(monitor="loss", verbose=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = network.fit(words, epochs=2, verbose=0, callbacks=[adjuster]).history
    lines = [str(w.message) for w in caught if str(w.message).startswith("MetaAdjuster:")]
    why = "fit's batches hold values other than numbers in rows"
    assert [line.split(": ", 2)[1] for line in lines] == [
        "the dead-run rescue's at-chance rule is off", "the judged restart is off"]
    assert all(why in line for line in lines) and len(history["loss"]) == 2


def test_a_generator_s_rows_are_sampled_for_the_chance_level():
    x, y = imbalanced_rows()

    def batches():
        while True:
            for start in range(0, TRAIN_ROWS, 40):
                yield x[start:start + 40], y[start:start + 40]

    adjuster = kadapt.MetaAdjuster(monitor="loss", verbose=0)
    network = classifier(0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        network.fit(batches(), steps_per_epoch=6, epochs=2, verbose=0, callbacks=[adjuster])
    assert not [w for w in caught if str(w.message).startswith("MetaAdjuster:")]
    assert adjuster.rescue.rule.chance_loss == pytest.approx(chance_loss(y[:TRAIN_ROWS], 3))


def test_the_rescue_s_state_rides_in_the_adjuster_s_and_a_resumed_fit_restores_it(tmp_path):
    from kadapt.meta.live.adjuster_state import load_state

    x, y = imbalanced_rows()
    network = classifier(30.0)
    first = kadapt.MetaAdjuster(verbose=0, log_dir=tmp_path, backup_dir=tmp_path / "backup")
    fit(network, first, x, y, epochs=2)
    [rescue] = rescues(first, "diverged")
    saved = load_state(tmp_path / "backup" / "meta-adjuster-epoch-2.npz")
    assert saved["rescue"]["decisions"] == [rescue] and not list((tmp_path / "backup").glob("dead-run-rescue*"))
    resumed = kadapt.MetaAdjuster(verbose=0, log_dir=tmp_path, backup_dir=tmp_path / "backup")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        network.fit(x, y, validation_split=0.25, batch_size=32, epochs=3, initial_epoch=2, verbose=0,
                    callbacks=[resumed])
    assert resumed.rescue.decisions == [rescue] and resumed.rescue.state.actions == 1  # restored, not afresh
    assert rescue in resumed.decisions


def test_an_accumulating_model_s_chance_level_is_that_of_the_loss_it_wraps():
    x, y = imbalanced_rows()
    adjuster = kadapt.MetaAdjuster(verbose=0)
    network = kadapt.accumulate(classifier(0.1), micro_batch_size=16)
    network.compile(kadapt.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    _, lines = fit(network, adjuster, x, y, epochs=2)
    assert lines == [] and adjuster.rescue.rule.chance_loss == pytest.approx(chance_loss(y[:TRAIN_ROWS], 3))
