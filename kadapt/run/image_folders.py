"""Images kept in class folders, `photos/CLASS/*.png`: the layout of `keras.utils.image_dataset_from_directory`.

`kadapt train --data photos/` lists the files (the folder names are the
classes, sorted), splits the files with a seed into training and test files
(unless `--test DIR` gives the test files), chooses the training size from
the data (the median height and width of a seeded sample of the files, the
longer side capped at `MAX_SIDE`; `--image-size` overrides) and decodes each
file with a tf.data pipeline: file path -> `tf.io.decode_image` ->
`keras.layers.Resizing` -> `keras.layers.Rescaling(1 / 255)`. The saved
`model.keras` starts with the same two Keras layers (`raw_image_model`), so
it takes images of any size with the file's pixel values (0-255); they add
no kadapt object to the file.

The decoded images are held in memory where they fit (`MEMORY_FRACTION` of
the memory available); a larger folder, or any with `--stream on`, is
decoded once into a scratch file (`kadapt.recipes.disk_rows`) that training
reads a window of blocks at a time, so a folder larger than memory trains.
"""

import dataclasses
import shutil
from pathlib import Path

import numpy as np

from kadapt.extras import require
from kadapt.recipes.disk_rows import available_memory
from kadapt.run.errors import UsageError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")  # the files Keras' image_dataset_from_directory reads
# What an operating system leaves among a user's files, not images of theirs: hidden names (.DS_Store,
# .ipynb_checkpoints/), Windows' thumbnail caches and folder settings, the folder a zip made on macOS holds.
SYSTEM_NAMES = frozenset({"thumbs.db", "ehthumbs.db", "desktop.ini", "__macosx"})
SIZE_SAMPLE = 100  # files decoded to choose the training size: a median is stable well before this
MAX_SIDE = 64  # the longer side of a chosen size: a step's cost grows with the pixels, and CPUs train here
# Decoded images may take this share of the memory available: the recipe's shuffle holds a second copy
# of the training images (`kadapt.recipes.training.shuffled_batches` gathers batches from a tensor of them).
MEMORY_FRACTION = 0.5
DECODE_BATCH_SIZE = 64
SIZE_FORM = "HxW or N (pixels), e.g. 32x48 or 32"


@dataclasses.dataclass(frozen=True)
class ImageSize:
    """The size the network trains at, and why: `height` x `width` pixels of `channels` (1 or 3)."""

    height: int
    width: int
    channels: int
    reason: str

    @property
    def shape(self):
        return (self.height, self.width, self.channels)

    def text(self):
        return f"{self.height}x{self.width}x{self.channels} ({self.reason})"

    @classmethod
    def from_record(cls, record):
        """The size of what `config.json` records of image folders (`FolderImages.record`)."""
        return cls(*(record[name] for name in ("height", "width", "channels", "reason")))


@dataclasses.dataclass(frozen=True)
class FolderImages:
    """Decoded training and test images (float32 in [0, 1]), their class names
    as labels, and what `config.json` records of them."""

    train: tuple
    test: tuple
    record: dict


def is_image_folder(spec) -> bool:
    """Whether `--data` names a folder (of class folders of images)."""
    return spec is not None and Path(spec).is_dir()


def read_image_folders(config) -> FolderImages:
    """The decoded images of `config.data` (and of `config.test`, else a seeded
    split of the files), sized by `config.image_size` or by the data."""
    if config.target is not None:
        raise UsageError(f"--target names a CSV's column; the classes of --data {config.data} are its folders. "
                         f"Drop --target. Received: --target={config.target}")
    files, labels = class_folder_files(config.data)
    (train_files, train_labels), test = _split_files(config, files, labels)
    size = choose_image_size(train_files, config.image_size, config.seed)
    streamed = _stream_reason(config, len(train_files) + len(test[0]), size)
    store = None
    if streamed:
        from kadapt.recipes.disk_rows import RowStore

        store = RowStore()
        _check_disk(config.data, len(train_files) + len(test[0]), size, store.path)
    skip = bool(config.skip_bad_images)
    x_train, kept_train = decode_images(train_files, size, skip, store=store and store.writer("train", size.shape))
    x_test, kept_test = decode_images(test[0], size, skip, flag="--test" if config.test else "--data",
                                      store=store and store.writer("test", size.shape))
    skipped = len(train_files) - len(kept_train) + len(test[0]) - len(kept_test)
    record = {**dataclasses.asdict(size), "folder": str(config.data), "files": len(files), "skipped": skipped,
              **({"streamed": streamed} if streamed else {})}
    return FolderImages((x_train, train_labels[kept_train]), (x_test, test[1][kept_test]), record)


def _stream_reason(config, files, size):
    """Why the decoded images go to disk, or `None`: `--stream on`, or more than
    `MEMORY_FRACTION` of the memory available (`--stream off` holds them anyway)."""
    if config.stream != "auto":
        return "--stream on" if config.stream == "on" else None
    needed, available = files * int(np.prod(size.shape)) * 4, available_memory()
    if needed <= MEMORY_FRACTION * available:
        return None
    return (f"its {files} images at {size.height}x{size.width}x{size.channels} would take {_bytes_text(needed)} "
            f"in memory, more than {MEMORY_FRACTION:.0%} of the {_bytes_text(available)} available (--stream off "
            "holds them anyway)")


def _check_disk(folder, files, size, where):
    """A `UsageError` where the decoded images would not fit on the scratch file's disk."""
    needed, free = files * int(np.prod(size.shape)) * 4, shutil.disk_usage(where).free
    if needed > 0.9 * free:
        raise UsageError(f"--data {folder}: its {files} images at {size.height}x{size.width}x{size.channels} take "
                         f"{_bytes_text(needed)} decoded, and {where.parent} has {_bytes_text(free)} free: free space "
                         "there, set TMPDIR to a larger disk, or pass a smaller --image-size.")


def _split_files(config, files, labels):
    """`(train files, labels), (test files, labels)` of a run: the test files
    of `--test`, else a seeded split; the training files in a seeded order
    (the validation rows are the last ones), at most `--train-rows` of them."""
    if config.test is None:
        (train_files, train_labels), test = seeded_file_split(files, labels, config.seed)
    else:
        (train_files, train_labels), _ = seeded_file_split(files, labels, config.seed, test_fraction=0)
        test = _test_files(config)
    rows = slice(config.train_rows)
    return (train_files[rows], train_labels[rows]), test


def images_text(record):
    """The line `kadapt train` prints of image folders: the size and why, the files skipped."""
    size = ImageSize.from_record(record)
    skipped = f"; {record['skipped']} unreadable file(s) skipped (--skip-bad-images)" if record["skipped"] else ""
    streamed = f"; decoded to disk: {record['streamed']}" if record.get("streamed") else ""
    return f"images: {record['files']} files of {record['folder']}, trained at {size.text()}{skipped}{streamed}"


def check_image_flags(config):
    """A `UsageError` for the image-folder flags with `--data` that is not a folder."""
    given = [flag for flag, value in (("--image-size", config.image_size),
                                      ("--skip-bad-images", config.skip_bad_images)) if value]
    if given:
        raise UsageError(f"{', '.join(given)} apply to image folders (--data photos/ with photos/CLASS/*.png); "
                         f"--data {config.data} is not a folder. Drop {', '.join(given)}.")


def _test_files(config):
    """The files of `--test DIR`, whose class folders must be those of `--data`."""
    if not is_image_folder(config.test):
        raise UsageError(f"--test goes with --data {config.data} as a folder of the same class folders. "
                         f"Received: --test={config.test}")
    files, labels = class_folder_files(config.test, flag="--test")
    found = set(np.unique(labels).tolist())
    trained = {p.name for p in Path(config.data).iterdir() if p.is_dir() and not is_system_name(p.name)}
    if found != trained:
        raise UsageError(f"--test {config.test} has the class folders {', '.join(sorted(found))}; --data "
                         f"{config.data} has {', '.join(sorted(trained))}. Give both the same classes.")
    return files, labels


def class_folder_files(folder, flag="--data"):
    """`(files, labels)`: every image file under `folder/CLASS/` (its subfolders
    too, as Keras reads them), its class the folder's name, sorted by class and then by path."""
    root = Path(folder)
    classes = sorted(p for p in root.iterdir() if p.is_dir() and not is_system_name(p.name))
    if len(classes) < 2:
        found = f"only {classes[0].name}/" if classes else "no class folder"
        raise UsageError(f"{flag} {folder} holds {found}: image folders need one folder per class, at least two "
                         f"classes (e.g. {folder}/cat/*.png and {folder}/dog/*.png).")
    files, labels = [], []
    for path in classes:
        images = image_files_in(path, flag)
        if not images:
            raise UsageError(f"{flag} {folder}: the class folder {path} holds no image "
                             f"({', '.join(IMAGE_SUFFIXES)}). Add images of {path.name}, or remove the folder.")
        files += images
        labels += [path.name] * len(images)
    return np.array(files), np.array(labels)


def image_files_in(folder, flag="--data"):
    """The image files of `folder` and its subfolders, sorted; a file of
    another type is a `UsageError` naming it."""
    paths = sorted(Path(folder).rglob("*"))
    files = [p for p in paths if p.is_file() and not any(map(is_system_name, p.relative_to(folder).parts))]
    for path in files:
        check_image_suffix(path, flag)
    return [str(p) for p in files]


def is_system_name(name) -> bool:
    """Whether a file or folder name is the system's (`SYSTEM_NAMES`, or hidden): skipped, as Keras skips them."""
    return name.startswith(".") or name.lower() in SYSTEM_NAMES


def check_image_suffix(path, flag="--data"):
    if Path(path).suffix.lower() not in IMAGE_SUFFIXES:
        raise UsageError(f"{flag}: {path} is not an image file Keras decodes ({', '.join(IMAGE_SUFFIXES)}): convert "
                         "it to PNG or JPEG, or move it out of the folder.")


def seeded_file_split(files, labels, seed, test_fraction=0.2):
    """`(train files, labels), (test files, labels)`: a seeded `test_fraction`
    of the files, drawn at random (a folder lists one class after the other);
    the training files in a seeded order, so the validation rows (the last
    ones) hold every class."""
    order = np.random.default_rng(seed).permutation(len(files))
    cut = len(files) - (max(1, round(len(files) * test_fraction)) if test_fraction else 0)
    train, test = order[:cut], order[cut:]
    return (files[train], labels[train]), (files[test], labels[test])


def parse_image_size(text):
    """`(height, width)` of `--image-size` `HxW` or `N`."""
    parts = str(text).lower().split("x")
    if len(parts) not in (1, 2) or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise UsageError(f"--image-size must be {SIZE_FORM}. Received: --image-size={text}")
    sides = [int(part) for part in parts]
    return sides[0], sides[-1]


def choose_image_size(files, given=None, seed=0) -> ImageSize:
    """The training size: `given` (`--image-size`), else the median height and
    width of a seeded sample of `files`, scaled down so the longer side is at
    most `MAX_SIDE`; 3 channels if a sampled file has colour, else 1."""
    sample = np.random.default_rng(seed).permutation(len(files))[:SIZE_SAMPLE]
    shapes = np.array([shape for shape in (_shape(files[i]) for i in sample) if shape is not None])
    if not len(shapes):  # decoding names the first bad file
        decode_images(files[sample[:1]], ImageSize(1, 1, 1, ""))
    channels = 3 if shapes[:, 2].max() >= 3 else 1
    if given is not None:
        return ImageSize(*parse_image_size(given), channels, f"--image-size {given}")
    height, width = (int(np.median(shapes[:, axis])) for axis in (0, 1))
    reason = f"the median of {len(shapes)} files"
    scale = MAX_SIDE / max(height, width)
    if scale < 1:
        reason += f" ({height}x{width}), scaled to a longer side of {MAX_SIDE}; --image-size sets another"
        height, width = max(1, round(height * scale)), max(1, round(width * scale))
    return ImageSize(height, width, channels, reason)


def _bytes_text(size):
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def preprocessing_layers(size, scale=True):
    """The Keras layers between a file's pixels and the network: `Resizing` to
    `size`, then (with `scale`) `Rescaling` to [0, 1]. Training decodes with
    these and `model.keras` starts with them, so both see the same inputs."""
    import keras  # `kadapt`'s parser lists files of this module without loading a framework

    layers = [keras.layers.Resizing(size.height, size.width, name="resizing")]
    return layers + ([keras.layers.Rescaling(1 / 255, name="rescaling")] if scale else [])


def image_dataset(files, size, scale=True):
    """A tf.data pipeline of `(index, image)`: each file decoded to
    `size.channels`, resized (and scaled), in batches; a file that does not
    decode is left out (its index missing)."""
    tf = require("tensorflow", extra="tensorflow")
    layers = preprocessing_layers(size, scale)

    def decode(index, path):
        image = with_channels(tf.io.decode_image(tf.io.read_file(path), expand_animations=False), size.channels)
        image = tf.cast(image, "float32")[None]
        for layer in layers:
            image = layer(image)
        return index, image[0]

    paths = tf.data.Dataset.from_tensor_slices((np.arange(len(files)), np.asarray(files, str)))
    # Plain TensorFlow ops, no Python control flow: AutoGraph has nothing to convert (and would warn on imports).
    decode = tf.autograph.experimental.do_not_convert(decode)
    decoded = paths.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).ignore_errors()
    return decoded.batch(DECODE_BATCH_SIZE).prefetch(tf.data.AUTOTUNE)


def with_channels(image, channels):
    """A decoded image (H, W, any channels) with `channels` (1 or 3): alpha
    dropped, colour made grey or grey repeated. `decode_image(channels=1)`
    refuses BMP and GIF files, so the conversion is done here, alike for every format."""
    tf = require("tensorflow", extra="tensorflow")
    image = image[..., : tf.where(tf.shape(image)[-1] >= 3, 3, 1)]
    if channels == 1:
        return tf.cond(tf.shape(image)[-1] == 3, lambda: tf.image.rgb_to_grayscale(image), lambda: image)
    return tf.cond(tf.shape(image)[-1] == 1, lambda: tf.image.grayscale_to_rgb(image), lambda: image)


def decode_images(files, size, skip_bad=False, scale=True, flag="--data", store=None):
    """`(images (N, H, W, C) float32, indices of the files decoded)`. A file
    that does not decode is a `UsageError` naming it, or with `skip_bad` is
    left out. With `store` (a `kadapt.recipes.disk_rows.RowWriter`) the images
    are written to its file, and are `DiskRows`."""
    # Filled in place (the pipeline keeps the files' order): no second copy at the memory limit.
    images = np.empty((0 if store else len(files), *size.shape), "float32")
    kept = []
    for index, batch in image_dataset(files, size, scale):
        if store:
            store.write(batch.numpy())
        else:
            images[len(kept):len(kept) + len(batch)] = batch.numpy()
        kept += index.numpy().tolist()
    kept = np.array(kept, int)
    if store:
        images = store.close()
    bad = np.setdiff1d(np.arange(len(files)), kept)
    if len(bad) and not skip_bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise UsageError(f"{flag}: {files[bad[0]]}{more} is not a readable image (truncated or corrupt): replace or "
                         "remove it, or pass --skip-bad-images to leave such files out.")
    return (images if store else images[:len(kept)]), kept


def raw_image_model(network, size):
    """Images of any height and width, the file's pixel values (0-255) ->
    `preprocessing_layers` -> `network`: what `model.keras` holds. Keras'
    own layers only: plain Keras loads it wherever it loads `network`."""
    import keras

    inputs = keras.Input((None, None, size.channels), name="images")
    outputs = inputs
    for layer in preprocessing_layers(size):
        outputs = layer(outputs)
    return keras.Model(inputs, network(outputs), name=network.name)


def _shape(path):
    """`(height, width, channels)` of one file as it is, or `None` where it does not
    decode (`decode_images` names it, or skips it)."""
    tf = require("tensorflow", extra="tensorflow")
    try:
        return tuple(tf.io.decode_image(tf.io.read_file(path), expand_animations=False).shape)
    except tf.errors.OpError:
        return None
