"""A table's string column held whole as codes into its distinct values (pyarrow's dictionary encoding).

A column of millions of rows and a few distinct words, as a NumPy object array, is one Python
string per row: every copy, comparison, count and hand-over to TensorFlow touches each of them
(measured on table_scale's 2,000,000-row file: most of the data phase). As codes it is an int32
array: counted by `np.bincount`, gathered as integers, and turned into the one-hot inputs' indices
by one lookup in a table the size of its distinct values. `kadapt train` holds a training file's
string columns this way (`kadapt.run.tables.read_table` with a `target`); `strings()` gives the
object array where one is needed (the labels).
"""

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True, eq=False)
class CodedStrings:
    """A string column: `codes` (N,) int32 positions in `values`, its distinct
    strings (an object array, `""` for a missing cell), as pyarrow encodes them."""

    codes: np.ndarray
    values: np.ndarray

    @classmethod
    def from_arrow(cls, pa, column) -> "CodedStrings":
        """The column of a pyarrow string array (chunked or not), nulls as `""`."""
        encoded = column.cast(pa.string()).fill_null("").dictionary_encode()
        if isinstance(encoded, pa.ChunkedArray):  # the chunks share one dictionary
            encoded = encoded.combine_chunks() if encoded.num_chunks else pa.array([], pa.string()).dictionary_encode()
        return cls(encoded.indices.to_numpy(zero_copy_only=False).astype("int32", copy=False),
                   encoded.dictionary.to_numpy(zero_copy_only=False).astype(object))

    def stripped(self) -> tuple:
        """`(the column with the spaces around each value removed, the first value that had any or
        None)`; values that then read alike are one (first-seen order kept)."""
        values = self.values.tolist()
        changed = next((value for value in values if value != value.strip()), None)
        if changed is None:
            return self, None
        positions = {}
        remap = np.array([positions.setdefault(value.strip(), len(positions)) for value in values], "int32")
        return CodedStrings(remap[self.codes], np.array(list(positions), dtype=object)), changed

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, index) -> "CodedStrings":
        """The rows `index` selects (a slice, a mask or positions), as NumPy indexes an array."""
        return CodedStrings(self.codes[index], self.values)

    def strings(self) -> np.ndarray:
        """The column as an object array of strings."""
        return self.values[self.codes]

    def missing(self) -> np.ndarray:
        """Which rows are missing (`""`)."""
        return (self.values == "")[self.codes]

    def counts(self) -> dict:
        """`{value: rows}` of each value the rows hold."""
        rows = np.bincount(self.codes, minlength=len(self.values))
        return {value: int(count) for value, count in zip(self.values.tolist(), rows.tolist()) if count}

    def mapped(self, table: np.ndarray) -> np.ndarray:
        """`table[value position]` of each row: a per-value result (a number, an index) for every row."""
        return np.asarray(table)[self.codes]

    def indices(self, vocabulary) -> np.ndarray:
        """int32 `StringLookup` indices of the rows: i + 1 for `vocabulary[i]`,
        0 (its out-of-vocabulary slot) for a value not in it."""
        position = {value: i + 1 for i, value in enumerate(vocabulary)}
        return self.mapped(np.array([position.get(value, 0) for value in self.values.tolist()], "int32"))
