"""`table_mlp`: the network `kadapt train` gives a table, an MLP whose numbers also enter piecewise linear.

A plain MLP on standardized numbers weighs each input linearly at its
first layer, where a tree splits it: on public tables kept as published it
trails scikit-learn's HistGradientBoosting most where one number acts by
ranges (a travel mode coded 1-4, a price against a date). The piecewise
linear encoding of Gorishniy et al. (2022, "On Embeddings for Numerical
Features in Tabular Deep Learning") gives the first layer those ranges: a
numeric input x with quantile edges e_0 < e_1 < ... < e_T of the training
rows also enters as T pieces

    piece_t = clip((x - e_{t-1}) / (e_t - e_{t-1}), 0, 1),    t = 1 ... T,

so that e_0 + sum_t (e_t - e_{t-1}) * piece_t = clip(x, e_0, e_T): a
thermometer of the bins, linear inside each. The input itself stays beside
its pieces (a value beyond the training range still moves the output).
Inputs of at most two values (flags, one-hot categories) have nothing to
cut. Measured: benchmarks/README.md#public_tables.

A string column of many values (`kadapt.run.encoding.EMBED_ABOVE`) comes as
an index, one of the matrix's last columns (`embedding_sizes`): it enters
through an `Embedding` of its own, `embedding_width` wide (fastai's rule,
1.6 * values^0.56, at most `EMBED_WIDTH`, 8).

Built from Keras' own layers and ops with constant edges: the saved model
loads in plain Keras, in safe mode.
"""

import dataclasses

import keras
import numpy as np

BINS = 16  # quantile bins a numeric input is cut into, at most
# Each piece needs training rows to learn its weight: with fewer than 2 rows a piece, the bins shrink
# (fertility, 150 training rows and 52 numeric columns, gets none: it was 1.8x worse with 16 each).
ROWS_PER_PIECE = 2
MAX_PIECES = 4096  # a first layer of MAX_PIECES x width at most, whatever the columns
SAMPLE_ROWS = 65536  # the rows the quantiles are read from
WIDTH = 128
# The widest embedding of a many-valued string column: on many_values' tables (benchmarks/README.md#many_values)
# each narrower cap did better at 3,000 and 10,000 values (32, 16, 8; 4 better still on that one-dimensional
# effect): 8 leaves room for values that differ in more than one way.
EMBED_WIDTH = 8


@dataclasses.dataclass(frozen=True)
class Pieces:
    """The piecewise linear encoding of a matrix's columns: piece i is
    `clip((x[:, columns[i]] - left[i]) / span[i], 0, 1)`; `bins`, the most
    pieces a column has."""

    columns: np.ndarray
    left: np.ndarray
    span: np.ndarray
    bins: int

    def __call__(self, inputs):
        """The pieces of `inputs` (N, features): (N, len(columns))."""
        cut = keras.ops.take(inputs, self.columns, axis=1)
        return keras.ops.clip((cut - self.left) / self.span, 0.0, 1.0)


def quantile_pieces(x: np.ndarray, rows: int | None = None, bins: int = BINS) -> Pieces:
    """The `Pieces` of the columns of `x` (training rows, or a sample of
    `rows` of them) that hold more than two values: `bins` quantile bins
    each, fewer where the rows give less than `ROWS_PER_PIECE` a piece or
    the pieces would pass `MAX_PIECES`; equal quantiles merged."""
    x = np.asarray(x, "float32")
    cut = np.flatnonzero(~np.all((x == x.min(axis=0)) | (x == x.max(axis=0)), axis=0)) if len(x) else []
    bins = min(bins, (len(x) if rows is None else rows) // (ROWS_PER_PIECE * max(len(cut), 1)),
               MAX_PIECES // max(len(cut), 1))
    columns, left, span = [], [], []
    if bins >= 2:
        levels = np.quantile(x[:, cut].astype("float64"), np.linspace(0.0, 1.0, bins + 1), axis=0)
        for column, edges in zip(cut, levels.T):
            edges = np.unique(edges)
            columns += [column] * (len(edges) - 1)
            left += list(edges[:-1])
            span += list(np.diff(edges))
    return Pieces(np.array(columns, "int32"), np.array(left, "float32"), np.array(span, "float32"), max(bins, 0))


def table_mlp(x_train: np.ndarray, num_classes: int, rows: int | None = None, name: str = "mlp",
              embedding_sizes: tuple = ()) -> keras.Model:
    """Rows (N, features) -> [the rows, their `quantile_pieces`, the
    embeddings of the index columns] -> Dense(128, relu) -> Dense(num_classes), logits out.

    Args:
        x_train: Array (N, features). The encoded training rows, or a sample of them.
        num_classes: Int. Output logits.
        rows: Int. The training rows `x_train` is a sample of. Defaults to `len(x_train)`.
        name: String. The model's name. Defaults to `"mlp"`.
        embedding_sizes: Tuple of ints. The index counts of the last `len(embedding_sizes)`
            columns of `x_train`, each an index (0 ... size - 1, as floats) to embed.
            Defaults to none.
    """
    if len(x_train) > SAMPLE_ROWS:
        x_train = x_train[np.random.default_rng(0).choice(len(x_train), SAMPLE_ROWS, replace=False)]
    width = x_train.shape[1] - len(embedding_sizes)
    inputs = keras.Input((x_train.shape[1],), name="features")
    numbers = keras.ops.take(inputs, np.arange(width, dtype="int32"), axis=1) if embedding_sizes else inputs
    pieces = quantile_pieces(x_train[:, :width], rows)
    parts = [numbers, pieces(inputs)] if len(pieces.columns) else [numbers]
    for i, size in enumerate(embedding_sizes):
        index = keras.ops.cast(keras.ops.take(inputs, np.array([width + i], "int32"), axis=1), "int32")
        vectors = keras.layers.Embedding(size, embedding_width(size), name=f"embedding_{i}")(index)
        parts.append(keras.layers.Flatten(name=f"embedded_{i}")(vectors))
    features = keras.layers.Concatenate(name="inputs_and_pieces")(parts) if len(parts) > 1 else inputs
    hidden = keras.layers.Dense(WIDTH, activation="relu")(features)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(hidden), name=name)


def embedding_width(size: int) -> int:
    """The width of the embedding of an index of `size` values: fastai's 1.6 * size^0.56, at most `EMBED_WIDTH`."""
    return int(min(EMBED_WIDTH, round(1.6 * size**0.56)))


def network_text(model: keras.Model) -> str | None:
    """What `table_mlp` made of a table's inputs, or `None` for another network."""
    try:
        joined = model.get_layer("inputs_and_pieces")
    except ValueError:
        return None
    embeddings = [layer for layer in model.layers if isinstance(layer, keras.layers.Embedding)]
    widths = [tensor.shape[-1] for tensor in joined.input]
    inputs, pieces = widths[0], sum(widths[1:len(widths) - len(embeddings)])
    text = f"{model.name}: its {inputs} inputs and {pieces} quantile pieces of the numeric ones (piecewise linear)"
    for layer in embeddings:
        text += f", an embedding of {layer.input_dim} values x {layer.output_dim}"
    return text
