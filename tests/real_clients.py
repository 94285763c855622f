"""Models as Keras' own examples and guides write them, for kadapt's tests.

Each is adapted (small) from a Keras example or guide, not written for kadapt:
a sequence-to-sequence model with a masked token loss, a functional model
with named inputs and outputs, an embedding recommender subclassed and built
by `fit`, a model whose loss is an `add_loss` endpoint, a Transformer block,
and a timeseries regression fed by `timeseries_dataset_from_array` with
sample weights. `test_real_clients.py` checks every one against plain Keras on
the full batch (same weights, same batches; the logical batch of 12 rows is
split 5 + 5 + 2) and through a `.keras` file; `test_real_clients_auto.py` with
`"auto"` and the MetaAdjuster.

The Transformer runs without dropout: dropout draws one mask per micro-batch,
so with it kadapt is not exact (nor is plain Keras against itself).
"""

import keras
import numpy as np
import tensorflow as tf

import kadapt

BATCH, MICRO = 12, 5
ROWS = 24  # two logical steps


def _tokens(rng, rows, length, vocabulary, short_after):
    """Token rows padded with 0: the first `short_after` rows full, the rest
    1-2 tokens long, so micro-batches hold very different numbers of tokens."""
    tokens = rng.integers(1, vocabulary, size=(rows, length))
    for row in range(short_after, rows):
        tokens[row, 1 + row % 2:] = 0
    return tokens


# -- sequence to sequence (keras.io/examples/nlp/lstm_seq2seq), masked token loss --

def _seq2seq():
    encoder_in = keras.Input((6,), dtype="int32", name="encoder")
    decoder_in = keras.Input((5,), dtype="int32", name="decoder")
    encoded = keras.layers.Embedding(20, 8, mask_zero=True)(encoder_in)
    _, state = keras.layers.GRU(12, return_state=True)(encoded)
    decoded = keras.layers.Embedding(20, 8, mask_zero=True)(decoder_in)
    decoded = keras.layers.GRU(12, return_sequences=True)(decoded, initial_state=state)
    outputs = keras.layers.Dense(20)(decoded)
    model = keras.Model({"encoder": encoder_in, "decoder": decoder_in}, outputs)
    return model, dict(optimizer=keras.optimizers.Adam(0.01),
                       loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def _seq2seq_data(rng):
    x = {"encoder": _tokens(rng, ROWS, 6, 20, 5), "decoder": _tokens(rng, ROWS, 5, 20, 5)}
    return x, rng.integers(1, 20, size=(ROWS, 5)), None


# -- the functional API guide: several named inputs and outputs --

def _multi_io():
    title = keras.Input((6,), dtype="int32", name="title")
    tags = keras.Input((4,), name="tags")
    words = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(30, 8)(title))
    features = keras.layers.concatenate([words, tags])
    priority = keras.layers.Dense(1, name="priority")(features)
    department = keras.layers.Dense(3, name="department")(features)
    # As the guide writes it: outputs a list, losses and targets keyed by the output layers' names.
    model = keras.Model({"title": title, "tags": tags}, [priority, department])
    return model, dict(
        optimizer=keras.optimizers.RMSprop(0.01),
        loss={"priority": keras.losses.BinaryCrossentropy(from_logits=True),
              "department": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
        loss_weights={"priority": 1.0, "department": 0.2},
        metrics={"department": ["accuracy"]})


def _multi_io_data(rng):
    x = {"title": rng.integers(0, 30, size=(ROWS, 6)), "tags": rng.random((ROWS, 4), dtype=np.float32)}
    y = {"priority": rng.random((ROWS, 1), dtype=np.float32), "department": rng.integers(0, 3, ROWS)}
    return x, y, None


# -- keras.io/examples/structured_data/collaborative_filtering_movielens: subclassed, built by fit --

@keras.saving.register_keras_serializable(package="kadapt_tests")
class Recommender(keras.Model):
    def __init__(self, users=15, movies=25, size=6, **kwargs):
        super().__init__(**kwargs)
        self.users, self.movies, self.size = users, movies, size
        self.user = keras.layers.Embedding(users, size, embeddings_regularizer=keras.regularizers.L2(1e-3))
        self.user_bias = keras.layers.Embedding(users, 1)
        self.movie = keras.layers.Embedding(movies, size, embeddings_regularizer=keras.regularizers.L2(1e-3))
        self.movie_bias = keras.layers.Embedding(movies, 1)

    def call(self, inputs):
        user, movie = self.user(inputs[:, 0]), self.movie(inputs[:, 1])
        dot = keras.ops.sum(user * movie, axis=1, keepdims=True)
        return keras.ops.sigmoid(dot + self.user_bias(inputs[:, 0]) + self.movie_bias(inputs[:, 1]))

    def get_config(self):
        return {**super().get_config(), "users": self.users, "movies": self.movies, "size": self.size}


def _recommender():
    return Recommender(), dict(optimizer=keras.optimizers.Adam(0.05), loss=keras.losses.BinaryCrossentropy())


def _recommender_data(rng):
    # Few users and movies: most rows look up a row another row looks up too.
    pairs = np.stack([rng.integers(0, 4, ROWS), rng.integers(0, 6, ROWS)], axis=1)
    return pairs, rng.random((ROWS, 1), dtype=np.float32), None


# -- the "training and evaluation" guide: a loss added by an endpoint layer --

@keras.saving.register_keras_serializable(package="kadapt_tests")
class LogisticEndpoint(keras.layers.Layer):
    def call(self, targets, logits):
        self.add_loss(keras.ops.mean(keras.losses.binary_crossentropy(targets, logits, from_logits=True)))
        return keras.ops.sigmoid(logits)


def _add_loss():
    inputs = keras.Input((5,), name="inputs")
    targets = keras.Input((1,), name="targets")
    logits = keras.layers.Dense(1)(keras.layers.Dense(8, activation="tanh")(inputs))
    outputs = LogisticEndpoint()(targets, logits)
    return keras.Model({"inputs": inputs, "targets": targets}, outputs), dict(optimizer=keras.optimizers.Adam(0.05))


def _add_loss_data(rng):
    x = {"inputs": rng.normal(size=(ROWS, 5)).astype("float32"),
         "targets": rng.integers(0, 2, (ROWS, 1)).astype("float32")}
    return x, None, None


# -- keras.io/examples/nlp/text_classification_with_transformer (dropout 0) --

@keras.saving.register_keras_serializable(package="kadapt_tests")
class TokenAndPosition(keras.layers.Layer):
    def __init__(self, length, vocabulary, size, **kwargs):
        super().__init__(**kwargs)
        self.length, self.vocabulary, self.size = length, vocabulary, size
        self.tokens = keras.layers.Embedding(vocabulary, size)
        self.positions = keras.layers.Embedding(length, size)

    def call(self, x):
        return self.tokens(x) + self.positions(keras.ops.arange(self.length))

    def get_config(self):
        return {**super().get_config(), "length": self.length, "vocabulary": self.vocabulary, "size": self.size}


def _transformer():
    inputs = keras.Input((7,), dtype="int32")
    x = TokenAndPosition(7, 40, 8)(inputs)
    attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(x, x)
    x = keras.layers.LayerNormalization(epsilon=1e-6)(x + attention)
    feed_forward = keras.layers.Dense(8)(keras.layers.Dense(16, activation="relu")(x))
    x = keras.layers.LayerNormalization(epsilon=1e-6)(x + feed_forward)
    outputs = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(x))
    return keras.Model(inputs, outputs), dict(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])


def _transformer_data(rng):
    return rng.integers(0, 40, size=(ROWS, 7)), rng.integers(0, 2, ROWS), None


# -- keras.io/examples/timeseries/timeseries_weather_forecasting, with sample weights --

def _timeseries():
    inputs = keras.Input((8, 3))
    outputs = keras.layers.Dense(1)(keras.layers.LSTM(8)(inputs))
    return keras.Model(inputs, outputs), dict(optimizer=keras.optimizers.Adam(0.01), loss="mse")


def _timeseries_data(rng):
    series = rng.normal(size=(ROWS + 7, 3)).astype("float32")
    windows = keras.utils.timeseries_dataset_from_array(
        series, series[7:, :1], sequence_length=8, batch_size=BATCH, shuffle=False)
    weights = tf.data.Dataset.from_tensor_slices(rng.uniform(0.1, 2.0, ROWS).astype("float32")).batch(BATCH)
    return tf.data.Dataset.zip(windows, weights).map(lambda window, w: (*window, w)), None, None


CLIENTS = {
    "seq2seq": (_seq2seq, _seq2seq_data),
    "multi_io": (_multi_io, _multi_io_data),
    "recommender": (_recommender, _recommender_data),
    "add_loss": (_add_loss, _add_loss_data),
    "transformer": (_transformer, _transformer_data),
    "timeseries": (_timeseries, _timeseries_data),
}


def client(name):
    """A fresh model (the same weights every call), its compile arguments and data."""
    build, data = CLIENTS[name]
    keras.utils.set_random_seed(0)
    model, compile_arguments = build()
    return model, compile_arguments, data(np.random.default_rng(0))


def fit_client(model, data, **kwargs):
    x, y, sample_weight = data
    if isinstance(x, tf.data.Dataset):
        return model.fit(x, verbose=0, **kwargs)
    return model.fit(x, y, sample_weight=sample_weight, batch_size=BATCH, shuffle=False, verbose=0, **kwargs)


def plain_weights(name):
    """Plain Keras' weights after one epoch, and a function that trains the
    same model again from the same start on the reordered batches (its traced
    step is reused: no second compile) and returns those weights."""
    model, compile_arguments, data = client(name)
    model.compile(**compile_arguments)
    start = _initial_state(model, data[0])
    fit_client(model, data)
    reference = model.get_weights()

    def reordered():
        _restore(model, start)
        fit_client(model, reversed_batches(data))
        return model.get_weights()

    return reference, reordered


def _initial_state(model, x):
    """The weights and optimizer variables before training; a subclassed
    model is built first by a call, as `fit` would build it."""
    if not model.built:
        model(tf.nest.map_structure(lambda array: array[:1], x))
    model.optimizer.build(model.trainable_variables)
    return model.get_weights(), [variable.numpy() for variable in model.optimizer.variables]


def _restore(model, state):
    weights, optimizer_values = state
    model.set_weights(weights)
    for variable, value in zip(model.optimizer.variables, optimizer_values, strict=True):
        variable.assign(value)


def reversed_batches(data):
    """The same logical batches with their rows in reverse order."""
    x, y, sample_weight = data
    if isinstance(x, tf.data.Dataset):
        return x.map(lambda *parts: tf.nest.map_structure(lambda t: tf.reverse(t, [0]), parts)), y, sample_weight

    def reverse(array):
        return np.concatenate([array[start:start + BATCH][::-1] for start in range(0, len(array), BATCH)])

    return tuple(None if part is None else tf.nest.map_structure(reverse, part) for part in data)


def assert_equals_plain_keras(name, weights):
    """Each tensor within 1e-5 of plain Keras' (relative to the tensor's
    scale), or as close as plain Keras is to itself with each batch's rows
    reordered (10x that float noise): a tensor whose true gradient is zero,
    such as an attention key bias, is all noise, which Adam scales up to its
    step size."""
    reference, train_reordered = plain_weights(name)
    reordered = None
    for index, (ours, theirs) in enumerate(zip(weights, reference, strict=True)):
        difference = float(np.max(np.abs(ours - theirs)))
        if difference <= 1e-5 * max(float(np.max(np.abs(theirs))), 1e-12):
            continue
        reordered = reordered or train_reordered()
        assert difference <= 10 * float(np.max(np.abs(reordered[index] - theirs)))


def accumulated(name, micro_batch_size=MICRO, **kwargs):
    model, compile_arguments, data = client(name)
    trainer = kadapt.accumulate(model, micro_batch_size, **kwargs)
    trainer.compile(**compile_arguments)
    return model, trainer, data
