"""Images in class folders (`photos/CLASS/*.png`) in `kadapt train`, `report` and `predict`:
the listing, the seeded split of the files, the size chosen from the data, the
decoding, `model.keras` taking the files' pixels, and every bad input as one pinned line.
One short run in-process, a module fixture; tiny PNGs of mixed sizes and channels."""

import csv
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from helpers import NO_KADAPT
from kadapt import cli
from kadapt.run import RunConfig
from kadapt.run import UsageError
from kadapt.run.data import load_data
from kadapt.run.image_folders import ImageSize
from kadapt.run.image_folders import choose_image_size
from kadapt.run.image_folders import class_folder_files
from kadapt.run.image_folders import decode_images
from kadapt.run.image_folders import images_text
from kadapt.run.image_folders import parse_image_size
from kadapt.run.image_folders import seeded_file_split

SHORT = ["--model", "small_cnn", "--batch-size", "8", "--memory-budget", "256MiB", "--meta", "off", "--epochs", "1",
         "--fit-verbose", "2"]
CLASSES = ("circle", "square", "stripe")
FILES_PER_CLASS = 12


def write_png(path, pixels):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(tf.io.encode_png(np.asarray(pixels, "uint8")).numpy())
    return path


def write_photos(folder, classes=CLASSES, files=FILES_PER_CLASS):
    """Class c's images are bright at level 80c; sizes 12-20 x 16-20, one grayscale file per class."""
    rng = np.random.default_rng(0)
    for c, name in enumerate(classes):
        for i in range(files):
            shape = (12 + i % 3 * 4, 16 + i % 2 * 4, 1 if i == 0 else 3)
            write_png(folder / name / f"{i}.png", rng.random(shape) * 60 + c * 80)
    return folder


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return write_photos(tmp_path_factory.mktemp("image_folders") / "photos")


@pytest.fixture(scope="module")
def run(photos):
    out = photos.parent / "run"
    assert cli.main(["train", "--data", str(photos), "--out", str(out), *SHORT]) == 0
    return out


def usage_error(*args):
    with pytest.raises(SystemExit) as raised:
        cli.main(list(args))
    return str(raised.value)


def test_the_class_folders_are_the_labels_sorted(photos):
    files, labels = class_folder_files(photos)
    assert list(np.unique(labels)) == list(CLASSES)
    assert len(files) == 36 and files[0].endswith("circle/0.png") and labels[0] == "circle"


def test_class_folders_are_read_with_their_subfolders_and_without_hidden_or_system_files(tmp_path):
    write_photos(tmp_path / "p", classes=("cat", "dog"), files=1)
    write_png(tmp_path / "p" / "cat" / "2024" / "a.png", np.zeros((4, 4, 1)))
    write_png(tmp_path / "p" / "dog" / ".ipynb_checkpoints" / "b.png", np.zeros((4, 4, 1)))
    (tmp_path / "p" / "dog" / ".DS_Store").write_bytes(b"\0")
    (tmp_path / "p" / "dog" / "Thumbs.db").write_bytes(b"\0")  # what Windows and macOS leave: skipped as Keras skips them
    (tmp_path / "p" / "cat" / "desktop.ini").write_bytes(b"\0")
    write_png(tmp_path / "p" / "__MACOSX" / "cat" / "0.png", np.zeros((4, 4, 1)))  # not a class
    files, labels = class_folder_files(tmp_path / "p")
    assert [f[len(str(tmp_path)) + 3:] for f in files] == ["cat/0.png", "cat/2024/a.png", "dog/0.png"]
    assert list(labels) == ["cat", "cat", "dog"]


def test_the_split_of_the_files_is_seeded_and_holds_every_file_once(photos):
    files, labels = class_folder_files(photos)
    (train, _), (test, _) = seeded_file_split(files, labels, seed=0)
    (again, _), _ = seeded_file_split(files, labels, seed=0)
    (other, _), _ = seeded_file_split(files, labels, seed=1)
    assert len(test) == 7 and sorted([*train, *test]) == sorted(files)
    assert list(train) == list(again) and list(train) != list(other)


def test_the_size_is_the_median_of_the_files_and_colour_wins(photos):
    files, _ = class_folder_files(photos)
    size = choose_image_size(files, seed=0)
    assert size.shape == (16, 18, 3) and size.reason == "the median of 36 files"
    assert choose_image_size(files, "8x10").shape == (8, 10, 3)


def test_a_large_median_is_scaled_to_the_longest_side(tmp_path):
    files = [str(write_png(tmp_path / f"{i}.png", np.zeros((100, 200, 1)))) for i in range(3)]
    size = choose_image_size(np.array(files))
    assert size.shape == (32, 64, 1)
    assert "the median of 3 files (100x200), scaled to a longer side of 64" in size.reason


def test_decoding_resizes_and_scales_like_the_saved_model(tmp_path):
    pixels = np.arange(4 * 6 * 3).reshape(4, 6, 3) % 256
    path = write_png(tmp_path / "a.png", pixels)
    images, kept = decode_images(np.array([str(path)]), ImageSize(4, 6, 3, ""))
    np.testing.assert_allclose(images[0], pixels / 255, rtol=1e-6)
    assert list(kept) == [0]


@pytest.mark.parametrize("text, sides", [("32", (32, 32)), ("24x40", (24, 40)), ("8X9", (8, 9))])
def test_image_size_flag(text, sides):
    assert parse_image_size(text) == sides


def test_a_bad_image_size():
    with pytest.raises(UsageError, match=r"^--image-size must be HxW or N \(pixels\), e.g. 32x48 or 32. "
                                         r"Received: --image-size=0x8$"):
        parse_image_size("0x8")


def test_a_folder_that_would_not_fit_in_memory_trains_from_its_images_decoded_to_disk(photos, monkeypatch,
                                                                                     capsys, tmp_path):
    held = load_data(RunConfig(str(photos), seed=3))
    monkeypatch.setattr("kadapt.run.image_folders.available_memory", lambda: 2**17)
    streamed = load_data(RunConfig(str(photos), seed=3))
    assert streamed.streamed and not held.streamed
    assert streamed.images["streamed"] == ("its 36 images at 16x16x3 would take 0.1 MiB in memory, more than "
                                           "50% of the 0.1 MiB available (--stream off holds them anyway)")
    for name in ("x_train", "x_val", "x_test"):  # the same pixels, read back from the scratch file
        rows = getattr(held, name)
        np.testing.assert_array_equal(getattr(streamed, name)[0:len(rows)], rows)
        assert len(getattr(streamed, name)) == len(rows)
    np.testing.assert_array_equal(streamed.y_train, held.y_train)
    out = tmp_path / "run"
    assert cli.main(["train", "--data", str(photos), "--out", str(out), *SHORT]) == 0
    assert "trained at 16x16x3 (the median of 29 files); decoded to disk: its 36 images" in capsys.readouterr().out
    assert __import__("json").loads((out / "run.json").read_text())["status"] == "completed"


def test_a_run_trains_reports_and_records_the_size(run, capsys):
    config = __import__("json").loads((run / "config.json").read_text())
    images = config["resolved"]["data"]["images"]
    # the median of the 29 training files
    assert (images["height"], images["width"], images["channels"], images["skipped"]) == (16, 16, 3, 0)
    assert config["resolved"]["data"]["classes"] == list(CLASSES)
    assert cli.main(["report", str(run)]) == 0
    assert "27 train / 2 validation / 7 test rows of (16, 16, 3), 3 classes" in capsys.readouterr().out


def test_predict_a_folder_writes_file_class_rows_and_the_accuracy(run, photos, capsys, tmp_path):
    out = tmp_path / "classes.csv"
    assert cli.main(["predict", str(run), "--data", str(photos), "--output", str(out)]) == 0
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["file", "class"] and len(rows) == 37
    assert rows[1][0] == str(photos / "circle" / "0.png") and rows[1][1] in CLASSES
    assert "accuracy " in capsys.readouterr().err


def test_predict_single_files_to_standard_output(run, photos, capsys):
    files = f"{photos / 'circle' / '0.png'},{photos / 'stripe' / '5.png'}"
    assert cli.main(["predict", str(run), "--data", files]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "file,class" and [line.split(",")[0] for line in lines[1:]] == files.split(",")


PLAIN_KERAS = NO_KADAPT + """
import json
import keras, numpy as np, tensorflow as tf

run, files = sys.argv[1], sys.argv[2:]
model = keras.saving.load_model(run + "/model.keras", safe_mode=True)
resolved = json.load(open(run + "/config.json"))["resolved"]
images, shift = resolved["data"]["images"], resolved["test_time_augmentation"]["shift"]


def shifted(x, pixels):
    out = np.zeros_like(x)
    if pixels > 0:
        out[:, pixels:, pixels:] = x[:, :-pixels, :-pixels]
    else:
        out[:, :pixels, :pixels] = x[:, -pixels:, -pixels:]
    return out


for path in files:
    image = tf.io.decode_image(tf.io.read_file(path), channels=images["channels"], expand_animations=False)
    # The run's test-time shifts are of the resized image: resized here as the model's first layer does.
    x = keras.layers.Resizing(images["height"], images["width"])(tf.cast(image, "float32")[None]).numpy()
    logits = 0.5 * model.predict(x, verbose=0) + 0.25 * (model.predict(shifted(x, shift), verbose=0)
                                                         + model.predict(shifted(x, -shift), verbose=0))
    print(*keras.ops.softmax(logits)[0].numpy().tolist())
"""


def test_plain_keras_loads_the_model_and_predicts_as_kadapt_predict(run, photos, tmp_path):
    out = tmp_path / "probabilities.csv"
    files = [str(photos / "circle" / "0.png"), str(photos / "square" / "4.png")]  # grayscale, colour
    assert cli.main(["predict", str(run), "--data", ",".join(files), "--probabilities", "--output", str(out)]) == 0
    expected = np.array([row[1:] for row in list(csv.reader(out.open()))[1:]], float)
    # Safe mode, no kadapt importable.
    done = subprocess.run([sys.executable, "-I", "-c", PLAIN_KERAS, str(run), *files], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    plain = np.array([line.split() for line in done.stdout.strip().splitlines()[-2:]], float)
    np.testing.assert_allclose(plain, expected, atol=2e-6)


def test_one_class_folder(tmp_path):
    write_photos(tmp_path / "one", classes=("cat",), files=2)
    assert usage_error("train", "--data", str(tmp_path / "one"), *SHORT) == (
        f"kadapt: error: --data {tmp_path / 'one'} holds only cat/: image folders need one folder per class, at "
        f"least two classes (e.g. {tmp_path / 'one'}/cat/*.png and {tmp_path / 'one'}/dog/*.png).")


def test_an_empty_class_folder(tmp_path):
    write_photos(tmp_path / "p", classes=("cat", "dog"), files=2)
    (tmp_path / "p" / "emu").mkdir()
    assert usage_error("train", "--data", str(tmp_path / "p"), *SHORT) == (
        f"kadapt: error: --data {tmp_path / 'p'}: the class folder {tmp_path / 'p' / 'emu'} holds no image (.png, "
        ".jpg, .jpeg, .bmp, .gif). Add images of emu, or remove the folder.")


def test_a_file_type_keras_does_not_decode(tmp_path):
    write_photos(tmp_path / "p", classes=("cat", "dog"), files=2)
    (tmp_path / "p" / "dog" / "scan.tiff").write_bytes(b"II*\x00")
    assert usage_error("train", "--data", str(tmp_path / "p"), *SHORT) == (
        f"kadapt: error: --data: {tmp_path / 'p' / 'dog' / 'scan.tiff'} is not an image file Keras decodes (.png, "
        ".jpg, .jpeg, .bmp, .gif): convert it to PNG or JPEG, or move it out of the folder.")


def truncated_photos(folder):
    write_photos(folder, classes=("cat", "dog"), files=6)
    whole = (folder / "dog" / "3.png").read_bytes()
    (folder / "dog" / "3.png").write_bytes(whole[: len(whole) // 2])
    return folder


def test_a_truncated_image_is_named(tmp_path):
    photos = truncated_photos(tmp_path / "p")
    message = usage_error("train", "--data", str(photos), "--seed", "0", *SHORT)
    assert message == (f"kadapt: error: --data: {photos / 'dog' / '3.png'} is not a readable image (truncated or "
                       "corrupt): replace or remove it, or pass --skip-bad-images to leave such files out.")


def test_skip_bad_images_leaves_it_out_and_counts_it(tmp_path):
    photos = truncated_photos(tmp_path / "p")
    data = load_data(RunConfig(data=str(photos), skip_bad_images=True))
    assert data.images["skipped"] == 1 and data.images["files"] == 12
    assert len(data.x_train) + len(data.x_val) + len(data.x_test) == 11
    assert images_text(data.images) == (f"images: 12 files of {photos}, trained at 16x16x3 (the median of 9 files); "
                                        "1 unreadable file(s) skipped (--skip-bad-images)")


def test_predict_names_a_truncated_file_or_skips_and_counts_it(run, tmp_path, capsys):
    photos = truncated_photos(tmp_path / "p")
    assert usage_error("predict", str(run), "--data", str(photos)) == (
        f"kadapt: error: --data: {photos / 'dog' / '3.png'} is not a readable image (truncated or corrupt): replace "
        "or remove it, or pass --skip-bad-images to leave such files out.")
    capsys.readouterr()
    assert cli.main(["predict", str(run), "--data", str(photos), "--skip-bad-images"]) == 0
    captured = capsys.readouterr()
    assert "skipped 1 unreadable image file(s) (--skip-bad-images)" in captured.err
    assert len(captured.out.splitlines()) == 1 + 11 and "dog/3.png" not in captured.out


def test_predict_writes_image_rows_to_a_csv_only(run, photos):
    assert usage_error("predict", str(run), "--data", str(photos), "--output", "classes.npy") == (
        "kadapt: error: --output of image predictions is a .csv of file,class rows. Received: --output=classes.npy")


def test_a_test_folder_with_other_classes(photos, tmp_path):
    write_photos(tmp_path / "t", classes=("circle", "square"), files=1)
    with pytest.raises(UsageError, match=r"--test .*/t has the class folders circle, square; --data .*/photos has "
                                         r"circle, square, stripe. Give both the same classes.$"):
        load_data(RunConfig(data=str(photos), test=str(tmp_path / "t")))


def test_a_test_folder_replaces_the_split_and_the_training_files_are_in_a_seeded_order(photos):
    data = load_data(RunConfig(data=str(photos), test=str(photos), validation_split=0.25))
    assert (len(data.x_train), len(data.x_val), len(data.x_test)) == (27, 9, 36)
    assert sorted(set(data.y_val.tolist())) == [1, 2]  # in the folders' order, the last 9 would be stripes only


def test_image_flags_without_a_folder():
    with pytest.raises(UsageError, match=r"^--image-size apply to image folders \(--data photos/ with "
                                         r"photos/CLASS/\*.png\); --data digits is not a folder. Drop --image-size.$"):
        load_data(RunConfig(data="digits", image_size="8"))


# Every file a user may have: each format in each pixel mode it holds (JPEG holds no alpha).
FORMATS = [(suffix, mode) for suffix in (".bmp", ".gif", ".png", ".jpg") for mode in ("L", "RGB", "RGBA")
           if (suffix, mode) != (".jpg", "RGBA")]


@pytest.mark.parametrize("suffix, mode", FORMATS)
@pytest.mark.parametrize("channels", [1, 3])
def test_every_format_decodes_to_the_runs_channels(tmp_path, mode, suffix, channels):
    from PIL import Image as pil  # Pillow comes with matplotlib; TensorFlow encodes no BMP or GIF
    pixels = np.full((3, 5, len(mode)), 200, "uint8")
    pil.fromarray(pixels[..., 0] if mode == "L" else pixels, mode).save(tmp_path / f"a{suffix}")
    images, kept = decode_images(np.array([str(tmp_path / f"a{suffix}")]), ImageSize(3, 5, channels, ""))
    assert images.shape == (1, 3, 5, channels) and list(kept) == [0]
    np.testing.assert_allclose(images, 200 / 255, atol=2 / 255)  # JPEG and GIF's palette round
