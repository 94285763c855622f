"""`kadapt predict RUN --data DIR_OR_FILES` for a run trained on image folders: one `file,class` row per image.

`--data` is a folder (every image in it and its subfolders; where each file
lies in a class folder of the run, the classes are its labels and the
accuracy is printed) or image files separated by commas. Each file is decoded
to the run's channels and resized to its training size
(`kadapt.run.image_folders.preprocessing_layers`, without the scaling that
`model.keras` does itself), then classified under the run's test-time
augmentation, a chunk of files at a time.
"""

import csv
import sys
from pathlib import Path

import numpy as np

from kadapt.recipes.inference import predict_with_tta
from kadapt.run.errors import UsageError
from kadapt.run.image_folders import IMAGE_SUFFIXES
from kadapt.run.image_folders import ImageSize
from kadapt.run.image_folders import check_image_suffix
from kadapt.run.image_folders import decode_images
from kadapt.run.image_folders import image_files_in
from kadapt.run.image_folders import is_image_folder

CHUNK_FILES = 1024  # files decoded at a time: a folder of any size predicts in bounded memory


def image_inputs(spec, class_names):
    """`(files, labels or None)` of `--data`: a folder's image files, recursively
    (labelled where every file lies in a class folder of the run), or
    comma-separated image files."""
    if is_image_folder(spec):
        files = image_files_in(spec)
        if not files:
            raise UsageError(f"--data {spec} holds no image file ({', '.join(IMAGE_SUFFIXES)}).")
        parts = [Path(file).relative_to(spec).parts for file in files]
        labelled = all(len(part) > 1 and part[0] in class_names for part in parts)
        return files, (np.array([part[0] for part in parts]) if labelled else None)
    files = spec.split(",")
    for file in files:
        if not Path(file).is_file():
            raise UsageError(f"--data {file} does not exist: pass image files separated by commas, or a folder.")
        check_image_suffix(file)
    return files, None


def image_logits(model, files, record, test_time_augmentation, skip_bad=False, batch_size=256):
    """`(indices of the files decoded, their logits)`: `files` through `model` (`model.keras`)
    at the run's size (`record`: `config.json`'s images), a chunk at a time."""
    size = ImageSize.from_record(record)
    kept, logits = [], []
    for start in range(0, len(files), CHUNK_FILES):
        chunk = files[start:start + CHUNK_FILES]
        x, decoded = decode_images(chunk, size, skip_bad=skip_bad, scale=False)
        kept += [start + int(i) for i in decoded]
        if len(x):
            logits.append(predict_with_tta(model, x, batch_size=batch_size, **test_time_augmentation))
    return np.array(kept, int), (np.concatenate(logits) if logits else np.zeros((0, 0), "float32"))


def write_image_rows(output, files, columns, rows):
    """`file,<columns>` rows to the `.csv` `output`, or to standard output when it is `None`."""
    if output is not None and not output.endswith(".csv"):
        raise UsageError(f"--output of image predictions is a .csv of file,class rows. Received: --output={output}")
    try:
        stream = sys.stdout if output is None else open(output, "w", newline="")
    except OSError as error:
        raise UsageError(f"--output {output} cannot be written: {error.strerror or error}.") from None
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(["file", *columns])
    writer.writerows([file, *row] for file, row in zip(files, rows))
    if output is not None:
        stream.close()
