"""The preprocessing `kadapt train` learns from the training rows and saves with the model.

As in Keras' FeatureSpace guide: the adapted layers encode the rows to a
float matrix once, the network trains on that matrix (probe, micro-batches
and schedule as on any array), and `model.keras` is the end-to-end model
raw rows -> the same layers -> the trained network, so `kadapt predict` and
`kadapt.load_model(...).predict` take rows as the user keeps them.

- Array rows (N, features): `keras.layers.Normalization` adapted on the
  training rows, (x - mean) / std per column.
- CSV columns: the numeric ones concatenated and normalized as above, each
  string column one-hot by a `keras.layers.StringLookup` adapted on its
  training values, with one out-of-vocabulary slot that a category unseen in
  training maps to. The model's inputs are a dict of named (N, 1) columns,
  strings as `dtype="string"`, each under its `input_name` (the column's
  name with what Keras refuses in a name, such as spaces and `/`, as `_`).
- Regression: the network learns the standardized target; the saved model
  ends with `Normalization(invert=True)`, output * std + mean.

Only built-in Keras layers: the saved model loads in safe mode.
"""

import keras
import numpy as np

from kadapt.extras import require
from kadapt.run.tables import NUMERIC
from kadapt.run.tables import input_name

tf = require("tensorflow", extra="tensorflow")
ENCODE_BATCH_SIZE = 4096


def row_encoder(x_train: np.ndarray) -> keras.Model:
    """Raw rows (N, features) -> rows standardized with the training rows' mean and std."""
    normalization = keras.layers.Normalization(axis=-1, dtype="float32", name="normalization")
    normalization.adapt(x_train)
    inputs = keras.Input(x_train.shape[1:], name="rows")
    return keras.Model(inputs, normalization(inputs), name="encoder")


def column_encoder(columns_train: dict, kinds: dict) -> keras.Model:
    """A dict of raw (N, 1) columns -> [standardized numeric columns, one-hot categories]."""
    inputs = {input_name(name): keras.Input((1,), dtype="float32" if kind == NUMERIC else "string",
                                            name=input_name(name)) for name, kind in kinds.items()}
    numeric = [name for name, kind in kinds.items() if kind == NUMERIC]
    parts = []
    if numeric:
        normalization = keras.layers.Normalization(axis=-1, dtype="float32", name="normalization")
        normalization.adapt(np.stack([columns_train[name] for name in numeric], axis=1))
        columns = [inputs[input_name(name)] for name in numeric]
        joined = columns[0] if len(columns) == 1 else keras.layers.Concatenate()(columns)
        parts.append(normalization(joined))
    for name in (name for name, kind in kinds.items() if kind != NUMERIC):
        lookup = keras.layers.StringLookup(num_oov_indices=1, output_mode="one_hot", name=f"lookup_{input_name(name)}")
        lookup.adapt(columns_train[name])
        parts.append(lookup(inputs[input_name(name)]))
    features = parts[0] if len(parts) == 1 else keras.layers.Concatenate(name="features")(parts)
    return keras.Model(inputs, features, name="encoder")


def encode(encoder: keras.Model, x) -> np.ndarray:
    """The float32 matrix of raw rows `x` (an array, or a dict of (N,) columns)."""
    # Called eagerly, a chunk at a time: `predict` would trace a function for each of the
    # train, validation and test sets, and TensorFlow warns of retracing.
    chunks = [keras.ops.convert_to_numpy(encoder(batch)) for batch in _dataset(x)]
    return np.concatenate(chunks).astype("float32") if chunks else np.zeros((0, *encoder.output.shape[1:]), "float32")


def inference_model(encoder: keras.Model | None, network: keras.Model, task) -> keras.Model:
    """Raw rows -> `encoder` -> `network` (-> the target in its units, for
    regression): what `model.keras` holds. The network itself where there is
    nothing around it (images classified by a functional or Sequential network)."""
    if encoder is None and not task.is_regression and isinstance(network, (keras.Sequential, keras.Function)):
        return network
    inputs = encoder.input if encoder is not None else keras.Input(network.inputs[0].shape[1:], name="rows")
    outputs = network(encoder.output if encoder is not None else inputs)
    if task.is_regression:
        outputs = keras.layers.Normalization(mean=task.target_mean, variance=task.target_std**2, invert=True,
                                             dtype="float32", name="target_units")(outputs)
    return keras.Model(inputs, outputs, name=network.name)


def columns_dataset(columns: dict, batch_size: int = ENCODE_BATCH_SIZE):
    """A `tf.data.Dataset` of batches of a dict of (N,) columns, each (batch, 1)
    under its `input_name` (Keras' array adapter takes no strings)."""
    return tf.data.Dataset.from_tensor_slices({input_name(name): values.reshape(-1, 1)
                                               for name, values in columns.items()}).batch(batch_size)


def _dataset(x):
    if isinstance(x, dict):
        return columns_dataset(x)
    return tf.data.Dataset.from_tensor_slices(np.asarray(x, "float32")).batch(ENCODE_BATCH_SIZE)
