"""Rows kept on disk: a table or an image folder larger than memory, prepared once, read a block at a time.

A streamed table (`kadapt.run.table_stream`) is encoded, and a large image
folder (`kadapt.run.image_folders`) decoded, into float32 rows in a scratch
directory (`RowStore`), one file per part. `DiskRows` stands where an array
of rows (N, ...) stands in a run: its length, shape and slices (`rows[a:b]`
reads those rows) serve the probe, the network's build and the samples the
callbacks draw; the training stream (`shuffled_batches`) reads blocks in a
seeded order, shuffled within a window of blocks, so memory holds a window,
not the data. `LabelTargets` are the labels' training targets,
made a batch at a time (one-hot rows of every row would be as large as the rows).
"""

import dataclasses
import os
import shutil
import tempfile
import weakref
from pathlib import Path

import numpy as np

BLOCK_BYTES = 1 << 22  # read at once by the shuffled stream (16,384 rows of 64 features; 1,337 28x28 images)
WINDOW_BLOCKS = 8  # blocks shuffled together: a window of 32 MiB in memory
SAMPLE_RUN = 256  # a sample of the rows is read in runs of this many consecutive rows


def available_memory():
    """Bytes this process may still take: the system's available memory, or less under a cgroup limit."""
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        available = int(info["MemAvailable"].split()[0]) * 1024
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            available = min(available, int(limit) - used)
    except (OSError, KeyError, ValueError):
        pass
    return available


class RowStore:
    """A scratch directory of row files, removed when the store is collected or the process ends."""

    def __init__(self, parent=None):
        self.path = Path(tempfile.mkdtemp(prefix="kadapt-rows-", dir=parent))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.path, True)

    def writer(self, name, row_shape):
        return RowWriter(self, self.path / f"{name}.f32", row_shape)


class RowWriter:
    """Appends float32 rows of `row_shape` (features, or height x width x channels) to a file;
    `close()` gives its `DiskRows`."""

    def __init__(self, store, path, row_shape):
        self.store, self.path, self.row_shape, self.rows = store, path, tuple(int(d) for d in row_shape), 0
        self._file = open(path, "wb")

    def write(self, rows):
        rows = np.ascontiguousarray(rows, "float32")
        if rows.shape[1:] != self.row_shape:
            raise ValueError(f"Argument `rows` must be (N, {', '.join(map(str, self.row_shape))}) rows. Received "
                             f"shape {rows.shape}")
        self._file.write(rows.tobytes())
        self.rows += len(rows)

    def close(self):
        self._file.close()
        return DiskRows(self.path, self.rows, self.row_shape, store=self.store)


class DiskRows:
    """Float32 rows (N, *row_shape) in a file, from its row `first` on, read on demand; slices are arrays."""

    dtype = np.dtype("float32")

    def __init__(self, path, rows, row_shape, first=0, store=None):
        self.path, self.rows, self.row_shape, self.first = Path(path), int(rows), tuple(row_shape), int(first)
        self._store = store  # keeps the scratch directory while the rows are in use
        self.block_rows = max(1, BLOCK_BYTES // (4 * int(np.prod(self.row_shape))))

    @property
    def shape(self):
        return (self.rows, *self.row_shape)

    @property
    def ndim(self):
        return 1 + len(self.row_shape)

    def __len__(self):
        return self.rows

    def __getitem__(self, index):
        if not isinstance(index, slice):
            raise TypeError("DiskRows take slices (rows[a:b]); a sample of rows comes from `sample`. "
                            f"Received: {type(index).__name__}")
        start, stop, step = index.indices(self.rows)
        return self.read(start, max(start, stop))[::step]

    def __array__(self, dtype=None, copy=None):
        raise TypeError(f"{self.rows} rows on disk are not read into memory whole: read slices, a `sample`, or "
                        "stream them with `dataset` or `shuffled_batches`.")

    def part(self, start, stop=None):
        """The rows `start` to `stop` as `DiskRows` of the same file (nothing read)."""
        start, stop, _ = slice(start, stop).indices(self.rows)
        return DiskRows(self.path, max(0, stop - start), self.row_shape, self.first + start, self._store)

    def read(self, start, stop):
        """Rows `start` to `stop` as an array."""
        size = int(np.prod(self.row_shape))
        values = np.fromfile(self.path, "float32", count=(stop - start) * size,
                             offset=(self.first + start) * size * 4)
        return values.reshape(-1, *self.row_shape)

    def sample(self, rows):
        """`(index, rows)`: about `rows` rows spread evenly over the file, in runs
        of `SAMPLE_RUN` consecutive rows (a few reads, not one per row)."""
        if rows >= self.rows:
            return np.arange(self.rows), self.read(0, self.rows)
        run = min(SAMPLE_RUN, rows)
        starts = np.linspace(0, self.rows - run, max(1, rows // run)).astype(int)
        index = np.concatenate([np.arange(s, s + run) for s in starts])
        return index, np.concatenate([self.read(s, s + run) for s in starts])

    def dataset(self, batch_size, targets=None):
        """A `tf.data.Dataset` of the rows in order, `batch_size` at a time, with `targets[a:b]` given them."""
        import tensorflow as tf

        def batches():
            for start in range(0, self.rows, batch_size):
                stop = min(start + batch_size, self.rows)
                yield self.read(start, stop) if targets is None else (self.read(start, stop), targets[start:stop])

        rows = tf.TensorSpec((None, *self.row_shape), "float32")
        signature = rows if targets is None else (rows, _target_spec(targets))
        count = -(-self.rows // batch_size)
        return tf.data.Dataset.from_generator(batches, output_signature=signature).apply(
            tf.data.experimental.assert_cardinality(count))

    def shuffled_batches(self, targets, batch_size, seed=None, epochs=1, first_epoch=0):
        """`kadapt.recipes.training.shuffled_batches` of rows on disk: each
        epoch reads the blocks in an order of its own and shuffles the rows
        within windows of `WINDOW_BLOCKS` blocks; epoch e's batches are a
        function of `(seed, e)` alone, so a resumed run sees the uninterrupted run's."""
        import tensorflow as tf

        block = self.block_rows

        def epoch_batches(epoch):
            rng = np.random.default_rng(None if seed is None else [seed, epoch])
            order = rng.permutation(-(-self.rows // block))
            rows, index = np.empty((0, *self.row_shape), "float32"), np.empty(0, int)
            for start in range(0, len(order), WINDOW_BLOCKS):
                blocks = [(b * block, min((b + 1) * block, self.rows)) for b in order[start:start + WINDOW_BLOCKS]]
                window = np.concatenate([self.read(a, b) for a, b in blocks])
                positions = np.concatenate([np.arange(a, b) for a, b in blocks])
                mixed = rng.permutation(len(positions))
                rows = np.concatenate([rows, window[mixed]])
                index = np.concatenate([index, positions[mixed]])
                while len(index) >= batch_size:
                    yield rows[:batch_size], targets[index[:batch_size]]
                    rows, index = rows[batch_size:], index[batch_size:]
            if len(index):
                yield rows, targets[index]

        def every_epoch():
            for epoch in range(first_epoch, epochs):
                yield from epoch_batches(epoch)

        signature = (tf.TensorSpec((None, *self.row_shape), "float32"), _target_spec(targets))
        steps = -(-self.rows // batch_size)
        return tf.data.Dataset.from_generator(every_epoch, output_signature=signature).apply(
            tf.data.experimental.assert_cardinality((epochs - first_epoch) * steps))


@dataclasses.dataclass(frozen=True)
class LabelTargets:
    """The training targets of `labels` (`Task.targets`), made for the rows asked for."""

    labels: np.ndarray
    task: object
    ndim = 2

    @property
    def shape(self):
        return len(self.labels), self.task.outputs

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.task.targets(self.labels[index])


def _target_spec(targets):
    import tensorflow as tf

    return tf.TensorSpec((None, *targets.shape[1:]), "float32")


def is_on_disk(rows):
    """Whether `rows` are `DiskRows` (streamed), not an array."""
    return isinstance(rows, DiskRows)
