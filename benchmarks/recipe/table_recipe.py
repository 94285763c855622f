"""Which optimizer and rate `kadapt train` should choose for a user's MLP on a table.

Tables: scikit-learn's wine, breast cancer, digits (flattened, raw 0..16 pixels) and iris; each seed
splits 25% off as test rows, stratified. The features are standardized with the training rows'
mean and standard deviation, as the Normalization layer adapted on the training rows that
`kadapt train` puts in front of a table's network does. The network is a user's
(`--model table_recipe:user_mlp`): Dense(64, relu) -> Dense(classes) logits.

Arms (each `kadapt train` in this process, its defaults (10 epochs, its batch, validation split,
restore-best, MetaAdjuster) except the flags shown):
  sgd              --optimizer sgd: the recipe's SGD, Nesterov, peak 0.2, triangular
  adam_tri_1e-3    --optimizer adam --learning-rate 0.001 --schedule triangular
  adam_tri_3e-3    --optimizer adam --learning-rate 0.003 --schedule triangular
  adam_tri_1e-2    --optimizer adam --learning-rate 0.01 --schedule triangular
  adam_tri_3e-2    --optimizer adam --learning-rate 0.03 --schedule triangular
  adam_const_1e-3  --optimizer adam --learning-rate 0.001 --schedule constant
  adam_tri_auto    --optimizer adam --learning-rate auto --schedule triangular (the range test)
  auto             no flag: what `kadapt train` chooses
  auto_batch_32    --batch-size 32 (the default is 16 on these tables: kadapt/recipes/batch_size.py)
  careful          plain Keras: Adam(1e-3), batch 32, 30 epochs on all the training rows

Prints the test accuracy per table and arm, the mean over the seeds (and the worst seed).

    PYTHONPATH=. python benchmarks/recipe/table_recipe.py            # seeds 0 1 2, ~10 minutes on 2 cores
"""

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

TABLES = ("wine", "breast_cancer", "digits", "iris")
TEST_FRACTION = 0.25
ARMS = {
    "sgd": {"optimizer": "sgd"},
    "adam_tri_1e-3": {"optimizer": "adam", "learning_rate": 1e-3, "schedule": "triangular"},
    "adam_tri_3e-3": {"optimizer": "adam", "learning_rate": 3e-3, "schedule": "triangular"},
    "adam_tri_1e-2": {"optimizer": "adam", "learning_rate": 1e-2, "schedule": "triangular"},
    "adam_tri_3e-2": {"optimizer": "adam", "learning_rate": 3e-2, "schedule": "triangular"},
    "adam_const_1e-3": {"optimizer": "adam", "learning_rate": 1e-3, "schedule": "constant"},
    "adam_tri_auto": {"optimizer": "adam", "learning_rate": "auto", "schedule": "triangular"},
    "auto": {},  # kadapt train's own choice
    "auto_batch_32": {"batch_size": 32},
}
CAREFUL_EPOCHS, CAREFUL_BATCH = 30, 32


def user_mlp(input_shape, num_classes):
    import keras

    return keras.Sequential([keras.Input(input_shape), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(num_classes)])


def split(table, seed):
    """`(x_train, y_train, x_test, y_test)`, standardized by the training rows."""
    from sklearn import datasets
    from sklearn.model_selection import train_test_split

    bunch = getattr(datasets, f"load_{table}")()
    x, y = bunch.data.astype("float32"), bunch.target.astype("int64")
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=TEST_FRACTION, stratify=y,
                                                        random_state=seed)
    mean, std = x_train.mean(0), x_train.std(0)
    std[std == 0] = 1.0  # digits' always-blank pixels
    return (x_train - mean) / std, y_train, (x_test - mean) / std, y_test


def kadapt_accuracy(arrays, flags, seed, work):
    from kadapt.run.pipeline import start_run
    from kadapt.run.pipeline import train

    paths = [str(Path(work) / f"{name}.npy") for name in ("x_train", "y_train", "x_test", "y_test")]
    for path, array in zip(paths, arrays):
        np.save(path, array)
    options = {"data": ",".join(paths), "model": "table_recipe:user_mlp", "seed": seed, **flags}
    run = start_run(options, str(Path(work) / "run"), overwrite=True)
    accuracy = train(run, echo=lambda line: None, verbose=0)["test_accuracy"]
    decisions = (Path(work) / "run" / "meta_decisions.jsonl").read_text().splitlines()
    rescues = [json.loads(line)["trigger"] for line in decisions if '"at_chance"' in line or '"diverged"' in line]
    return accuracy, rescues


def careful_accuracy(arrays, seed):
    import keras

    x_train, y_train, x_test, y_test = arrays
    keras.utils.set_random_seed(seed)
    model = user_mlp(x_train.shape[1:], int(y_train.max()) + 1)
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(x_train, y_train, batch_size=CAREFUL_BATCH, epochs=CAREFUL_EPOCHS, verbose=0)
    return float(model.evaluate(x_test, y_test, verbose=0)[1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=[*ARMS, "careful"])
    parser.add_argument("--tables", nargs="+", default=list(TABLES))
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for table in args.tables:
            for seed in args.seeds:
                arrays = split(table, seed)
                for arm in args.arms:
                    accuracy, rescues = ((careful_accuracy(arrays, seed), []) if arm == "careful"
                                         else kadapt_accuracy(arrays, ARMS[arm], seed, work))
                    results.setdefault(table, {}).setdefault(arm, []).append(accuracy)
                    print(json.dumps({"table": table, "seed": seed, "arm": arm, "accuracy": accuracy,
                                      "rescues": rescues}), flush=True)
    print(f"\n| table | {' | '.join(args.arms)} |\n|---|{'---|' * len(args.arms)}")
    for table, arms in results.items():
        cells = [f"{100 * np.mean(arms[arm]):.1f} (min {100 * np.min(arms[arm]):.1f})" for arm in args.arms]
        print(f"| {table} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
