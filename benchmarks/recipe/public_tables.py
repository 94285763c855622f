"""`kadapt train` with its defaults on public tables kept as they ship, against a careful Keras user and
scikit-learn's HistGradientBoosting defaults (issue 63, item 8).

Every table is written to CSV as its package ships it (pandas `to_csv(index=False)`: empty cells stay
empty, no column dropped or cleaned), then split by the seed into train.csv / test.csv (25% test rows,
stratified for classes) in a temporary folder. Two changes, the same for every arm: a row whose target
cell is empty is dropped (nothing to learn from or score; cars_mpg 8 rows, fertility 17), and a column
that is the target in another form would be dropped (none of these tables has one).

| table | package, name | rows | target | task | empty cells | string columns (distinct values) |
|---|---|---|---|---|---|---|
| seattle_weather | vega_datasets local `seattle-weather` | 1461 | weather (5 names) | classes | 0 | date (1461, a date) |
| cars_origin | vega_datasets local `cars` | 406 | Origin (3 names) | classes | 14 | Name (311), Year (12, a date) |
| penguins | palmerpenguins `load_penguins()` | 344 | species (3 names) | classes | 19 | island (3), sex (2, 11 empty) |
| anes96 | statsmodels `anes96` | 944 | vote (0.0/1.0) | classes | 0 | - |
| modechoice | statsmodels `modechoice` | 840 | choice (0.0/1.0) | classes | 0 | - |
| fair | statsmodels `fair` | 6366 | affairs (77 values) | regression | 0 | - |
| randhie | statsmodels `randhie` | 20190 | mdvis (a count, 0..77, integers) | regression | 0 | - |
| grunfeld | statsmodels `grunfeld` | 220 | invest | regression | 0 | firm (11) |
| fertility | statsmodels `fertility` | 219 (202 with a target) | 2011 (births per woman) | regression | 1542 | Country Name (219), Country Code (219), Indicator Name (1), Indicator Code (1); columns 2012, 2013 all empty |
| stocks | vega_datasets local `stocks` | 560 | price | regression | 0 | symbol (5), date (123, a date) |
| cars_mpg | vega_datasets local `cars` | 406 (398 with a target) | Miles_per_Gallon | regression | 14 | Name (311), Year (12, a date), Origin (3) |
| churn_csv | generated (own_data.py's) | 1500 | churn (yes/no) | classes | 0 | city (5), plan (3) |
| user_ids | generated | 60000 | label (0/1) | classes | 0 | user_id (60000, unique per row) |

(`python benchmarks/recipe/public_tables.py --describe` prints this from the packages.) user_ids: a
user-id string unique per row (kadapt must drop it, not one-hot it), one number `amount` and a 0/1
label drawn from a logistic of it; its training rows are cut to USER_IDS_TRAIN_ROWS (20,000) for every
arm, so that the kadapt arm stays within a few minutes on 2 cores (83 s at 20,000 on today's code).
The packages, benchmark-only: `python -m pip install statsmodels vega_datasets pandas pyarrow
palmerpenguins` (the data ship inside them; nothing is downloaded at run time).

Arms, each given the same train.csv / test.csv:
  kadapt   `python -m kadapt train --data train.csv --target COL --test test.csv --out RUN --seed S`,
           its defaults, in the checkout this script lives in (PYTHONPATH = its root); then
           `python -m kadapt predict RUN --data test.csv --output preds.csv`, scored here against the
           test labels. A run that stops (an empty cell, ...) is recorded with its error line.
  careful  a careful plain-Keras user, pandas `read_csv`: empty numbers filled with the training
           median, empty strings a category "missing", string columns one-hot by the training rows'
           values (a string column with more than 50 distinct training values is dropped: names, ids),
           a column of dates becomes days since 1970; standardized on the training rows,
           Dense(64, relu) -> Dense(outputs), Adam 1e-3, batch 32, 30 epochs, all training rows; a
           regression's target standardized and the predictions scaled back.
  hgb      scikit-learn `HistGradientBoostingClassifier/Regressor()` defaults: numbers as read, NaN
           passed natively, string columns as pandas categories by the training rows' values
           (`categorical_features="from_dtype"`; one with more than 255 training values, which HGB
           refuses, is dropped), dates as days since 1970; a column with no value in the training rows
           (fertility's 2012, 2013), on which HGB's binning fails, is dropped.

The task is the table's (above), the same for every arm: a class table's labels are compared as
values (1.0 == 1); an integer target with more than 20 distinct values (randhie's count) is a
regression, scored by test MSE. Targets (issue 63): kadapt completes every table, >= careful - 1
point (classes) and MSE <= 1.05x careful's (regression) on every table; within 0.5 point / 1.05x of
hgb on at least 80% of the tables, and ahead of hgb on the mean (accuracy points over the class
tables, geometric mean of the MSE ratios over the regressions).

    python benchmarks/recipe/public_tables.py --seeds 0 1 2 --out results.json
    python benchmarks/recipe/public_tables.py --tables penguins cars_origin --arms careful hgb
"""

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]  # the checkout whose kadapt the kadapt arm runs
sys.path.insert(0, str(Path(__file__).resolve().parent))

TEST_FRACTION = 0.25
CAREFUL_EPOCHS, CAREFUL_BATCH, CAREFUL_WIDTH, CAREFUL_LEARNING_RATE = 30, 32, 64, 1e-3
CAREFUL_MAX_CATEGORIES = 50  # the careful user drops a string column with more values (names, ids)
HGB_MAX_CATEGORIES = 255  # HistGradientBoosting refuses a categorical column with more (its max_bins)
POINTS_VS_CAREFUL, POINTS_VS_HGB, MSE_RATIO, SHARE_WITHIN_HGB = 1.0, 0.5, 1.05, 0.8
USER_IDS_ROWS, USER_IDS_TRAIN_ROWS = 60_000, 20_000
KADAPT_TIMEOUT_S = 900
KADAPT_FLAGS = []  # `--kadapt-flags`
ARMS = ("kadapt", "careful", "hgb")


# ---- the tables, as their packages ship them ------------------------------------------------------

def vega(name):
    from vega_datasets import local_data

    return local_data(name)


def statsmodels_table(name):
    import importlib

    return importlib.import_module(f"statsmodels.datasets.{name}").load_pandas().data


def penguins():
    import palmerpenguins

    return palmerpenguins.load_penguins()


def churn():
    import pandas as pd
    from own_data import churn_rows

    return pd.DataFrame(churn_rows())


def user_ids():
    import pandas as pd

    rng = np.random.default_rng(63)
    ids = rng.permutation(10 * USER_IDS_ROWS)[:USER_IDS_ROWS]
    amount = rng.lognormal(3.0, 1.0, USER_IDS_ROWS).round(2)
    chance = 1 / (1 + np.exp(-1.5 * (np.log(amount) - 3.0)))
    return pd.DataFrame({"user_id": [f"user-{i:07d}" for i in ids], "amount": amount,
                         "label": (rng.random(USER_IDS_ROWS) < chance).astype(int)})


# name: (package, loader, target, task, columns that are the target in another form, training rows cap)
TABLES = {
    "seattle_weather": ("vega_datasets", lambda: vega("seattle-weather"), "weather", "classes", (), None),
    "cars_origin": ("vega_datasets", lambda: vega("cars"), "Origin", "classes", (), None),
    "penguins": ("palmerpenguins", penguins, "species", "classes", (), None),
    "anes96": ("statsmodels", lambda: statsmodels_table("anes96"), "vote", "classes", (), None),
    "modechoice": ("statsmodels", lambda: statsmodels_table("modechoice"), "choice", "classes", (), None),
    "fair": ("statsmodels", lambda: statsmodels_table("fair"), "affairs", "regression", (), None),
    "randhie": ("statsmodels", lambda: statsmodels_table("randhie"), "mdvis", "regression", (), None),
    "grunfeld": ("statsmodels", lambda: statsmodels_table("grunfeld"), "invest", "regression", (), None),
    "fertility": ("statsmodels", lambda: statsmodels_table("fertility"), "2011", "regression", (), None),
    "stocks": ("vega_datasets", lambda: vega("stocks"), "price", "regression", (), None),
    "cars_mpg": ("vega_datasets", lambda: vega("cars"), "Miles_per_Gallon", "regression", (), None),
    "churn_csv": ("generated", churn, "churn", "classes", (), None),
    "user_ids": ("generated", user_ids, "label", "classes", (), USER_IDS_TRAIN_ROWS),
}


def write_split(name, seed, folder):
    """train.csv and test.csv of table `name` in `folder`, split by `seed`; `(target, task, rows)`."""
    import pandas as pd
    from sklearn.model_selection import train_test_split

    _, load, target, task, same_as_target, cap = TABLES[name]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "table.csv").write_text(load().to_csv(index=False))  # as shipped
    table = pd.read_csv(folder / "table.csv", keep_default_na=False, dtype=str)  # the cells as written
    table = table.drop(columns=list(same_as_target))
    table = table[table[target] != ""]
    order = np.arange(len(table))
    train, test = train_test_split(order, test_size=TEST_FRACTION, random_state=seed,
                                   stratify=table[target].to_numpy() if task == "classes" else None)
    if cap is not None:
        train = train[:cap]
    table.iloc[train].to_csv(folder / "train.csv", index=False)
    table.iloc[test].to_csv(folder / "test.csv", index=False)
    return target, task, len(table)


def describe(name):
    import pandas as pd

    package, load, target, task, *_ = TABLES[name]
    table = load()
    shipped = pd.read_csv(__import__("io").StringIO(table.to_csv(index=False)))
    strings = [f"{c} ({shipped[c].nunique()})" for c in shipped.columns if shipped[c].dtype.kind not in "fiub"
               and c != target]
    return (f"| {name} | {package} | {len(table)} | {target} ({shipped[target].nunique()} values, "
            f"{shipped[target].dtype}) | {task} | {int(shipped.isna().sum().sum())} | {', '.join(strings) or '-'} |")


# ---- scoring --------------------------------------------------------------------------------------

def label_text(values):
    """Labels as comparable strings: 1, 1.0 and "1" alike; names as they are."""
    out = []
    for value in values:
        try:
            number = float(value)
            out.append(str(int(number)) if number.is_integer() else repr(number))
        except (TypeError, ValueError):
            out.append(str(value))
    return np.asarray(out)


def score(task, predicted, truth):
    if task == "regression":
        return float(np.mean((np.asarray(predicted, "float64") - np.asarray(truth, "float64")) ** 2))
    return float(np.mean(label_text(predicted) == label_text(truth)))


# ---- the careful user and HistGradientBoosting ---------------------------------------------------

def dates(column):
    """Days since 1970 where every filled cell of a string column is a date, else None."""
    import pandas as pd

    filled = column.dropna()
    if filled.empty or column.dtype.kind in "fiub":
        return None
    try:
        parsed = pd.to_datetime(column, format="ISO8601")
    except (ValueError, TypeError):
        return None
    return (parsed - pd.Timestamp("1970-01-01")).dt.days.astype("float64")


def read_pair(folder, target):
    import pandas as pd

    train, test = pd.read_csv(folder / "train.csv"), pd.read_csv(folder / "test.csv")
    return train.drop(columns=[target]), train[target], test.drop(columns=[target]), test[target]


def careful_features(x, xt):
    blocks, blocks_test, dropped = [], [], []
    for name in x.columns:
        column, column_test = x[name], xt[name]
        days = dates(column)
        if days is not None:
            column, column_test = days, dates(column_test)
        if column.dtype.kind in "fiub":
            median = column.median()
            median = 0.0 if math.isnan(median) else median
            blocks.append(column.fillna(median).to_numpy("float64")[:, None])
            blocks_test.append(column_test.astype("float64").fillna(median).to_numpy("float64")[:, None])
            continue
        words, words_test = column.fillna("missing").astype(str), column_test.fillna("missing").astype(str)
        categories = np.asarray(sorted(words.unique()))
        if len(categories) > CAREFUL_MAX_CATEGORIES:
            dropped.append(name)
            continue
        blocks.append((words.to_numpy()[:, None] == categories).astype("float64"))
        blocks_test.append((words_test.to_numpy()[:, None] == categories).astype("float64"))
    train, test = np.hstack(blocks), np.hstack(blocks_test)
    mean, std = train.mean(0), train.std(0)
    std[std == 0] = 1.0
    return (train - mean) / std, (test - mean) / std, dropped


def careful_arm(folder, target, task, seed):
    import keras

    x, y, xt, yt = read_pair(folder, target)
    x, xt, dropped = careful_features(x, xt)
    keras.utils.set_random_seed(seed)
    if task == "regression":
        y = y.to_numpy("float64")
        mean, std = y.mean(), y.std() or 1.0
        targets, outputs = (y - mean) / std, 1
        loss = "mse"
    else:
        names = np.asarray(sorted(set(label_text(y))))
        targets, outputs = np.searchsorted(names, label_text(y)), len(names)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(CAREFUL_WIDTH, activation="relu"),
                              keras.layers.Dense(outputs)])
    model.compile(keras.optimizers.Adam(CAREFUL_LEARNING_RATE), loss)
    model.fit(x.astype("float32"), targets.astype("float32"), batch_size=CAREFUL_BATCH, epochs=CAREFUL_EPOCHS,
              verbose=0)
    out = keras.ops.convert_to_numpy(model(xt.astype("float32")))
    predicted = out[:, 0] * std + mean if task == "regression" else names[out.argmax(1)]
    return {"score": score(task, predicted, yt), "dropped": dropped}


def hgb_arm(folder, target, task, seed):
    import pandas as pd
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.ensemble import HistGradientBoostingRegressor

    x, y, xt, yt = read_pair(folder, target)
    dropped = []
    for name in list(x.columns):
        if x[name].isna().all():  # HGB's binning fails on it ("window shape cannot be larger than input")
            dropped.append(name)
            x, xt = x.drop(columns=[name]), xt.drop(columns=[name])
            continue
        days = dates(x[name])
        if days is not None:
            x[name], xt[name] = days, dates(xt[name])
        elif x[name].dtype.kind not in "fiub":
            categories = sorted(x[name].dropna().unique())
            if len(categories) > HGB_MAX_CATEGORIES:
                dropped.append(name)
                x, xt = x.drop(columns=[name]), xt.drop(columns=[name])
                continue
            x[name] = pd.Categorical(x[name], categories=categories)
            seen = xt[name].where(xt[name].isin(categories))  # a value unseen in training: NaN
            xt[name] = pd.Categorical(seen, categories=categories)
    if task == "regression":
        model = HistGradientBoostingRegressor(random_state=seed)
        model.fit(x, y.to_numpy("float64"))
    else:
        model = HistGradientBoostingClassifier(random_state=seed)
        model.fit(x, label_text(y))
    return {"score": score(task, model.predict(xt), yt), "dropped": dropped}


# ---- kadapt ---------------------------------------------------------------------------------------

def kadapt(arguments, cwd):
    """`(return code, output, seconds)` of `python -m kadapt ARGUMENTS` on this checkout."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "kadapt", *arguments], cwd=cwd, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=KADAPT_TIMEOUT_S)
        code, output = done.returncode, done.stdout
    except subprocess.TimeoutExpired as error:
        code, output = "timeout", (error.stdout or b"").decode() if isinstance(error.stdout, bytes) else str(error)
    return code, output, time.perf_counter() - started


def error_line(output):
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error" in line:
            return line[:400]
    return lines[-1][:400] if lines else "(no output)"


def kadapt_arm(folder, target, task, seed):
    run = folder / "run"
    code, output, seconds = kadapt(["train", "--data", str(folder / "train.csv"), "--target", target, "--test",
                                    str(folder / "test.csv"), "--out", str(run), "--seed", str(seed),
                                    *KADAPT_FLAGS], folder)
    (folder / "kadapt_train.log").write_text(output)
    output = output.replace(f"{folder}{os.sep}", "")  # the error names train.csv, not the temporary folder
    result = {"seconds": round(seconds, 1), "completed": code == 0}
    if code != 0:
        return {**result, "score": None, "outcome": f"train exit {code}: {error_line(output)}"}
    record = json.loads((run / "run.json").read_text()) if (run / "run.json").is_file() else {}
    config = json.loads((run / "config.json").read_text()) if (run / "config.json").is_file() else {}
    result["data_seconds"] = record.get("seconds", {}).get("data")
    result["task_taken"] = config.get("resolved", {}).get("data", {}).get("task", {}).get("kind")
    code, output, _ = kadapt(["predict", str(run), "--data", str(folder / "test.csv"), "--output",
                              str(folder / "preds.csv")], folder)
    if code != 0:
        return {**result, "completed": False, "score": None, "outcome": f"predict exit {code}: {error_line(output)}"}
    import pandas as pd

    predicted = pd.read_csv(folder / "preds.csv").iloc[:, 0]
    truth = pd.read_csv(folder / "test.csv")[target]
    return {**result, "score": score(task, predicted, truth), "outcome": "completed"}


# ---- the report -----------------------------------------------------------------------------------

def cell(task, value):
    if value is None:
        return "-"
    return f"MSE {value:.4g}" if task == "regression" else f"{100 * value:.1f}%"


def versus(task, mine, other):
    """`(text, within)`: kadapt's points (classes) or MSE ratio (regression) against another arm."""
    if mine is None or other is None:
        return "-", None
    if task == "regression":
        return f"{mine / other:.2f}x", mine / other
    return f"{100 * (mine - other):+.1f}", 100 * (mine - other)


def report(rows, arms):
    lines = ["| table | task | rows | kadapt | careful | hgb | kadapt vs careful | kadapt vs hgb | met? |",
             "|---|---|---|---|---|---|---|---|---|"]
    per_table = []
    for name in dict.fromkeys(row["table"] for row in rows):
        mine = [row for row in rows if row["table"] == name]
        task = mine[0]["task"]
        mean = {}
        for arm in ARMS:
            scores = [row.get(arm, {}).get("score") for row in mine]
            mean[arm] = statistics.fmean(scores) if scores and None not in scores else None
        texts = {}
        for arm in ARMS:
            texts[arm] = cell(task, mean[arm])
            if arm in arms and mean[arm] is None:
                outcome = next(row[arm].get("outcome", "?") for row in mine if row[arm]["score"] is None)
                texts[arm] = "stops: " + outcome.split("kadapt: error: ")[-1].split("; ")[0]
        taken = {row["kadapt"].get("task_taken") for row in mine if "kadapt" in row} - {None}
        if taken and taken != {"classification" if task == "classes" else "regression"}:
            texts["kadapt"] += f" (took it as {'/'.join(sorted(taken))})"
        vs_careful, d_careful = versus(task, mean["kadapt"], mean["careful"])
        vs_hgb, d_hgb = versus(task, mean["kadapt"], mean["hgb"])
        ok_careful = None if d_careful is None else (d_careful <= MSE_RATIO if task == "regression"
                                                     else d_careful >= -POINTS_VS_CAREFUL)
        ok_hgb = None if d_hgb is None else (d_hgb <= MSE_RATIO if task == "regression" else d_hgb >= -POINTS_VS_HGB)
        if "kadapt" in arms and mean["kadapt"] is None:
            ok_careful = ok_hgb = False
        met = ", ".join(f"{what} {'-' if ok is None else 'yes' if ok else 'NO'}"
                        for what, ok in (("careful", ok_careful), ("hgb", ok_hgb)))
        lines.append(f"| {name} | {task} | {mine[0]['rows']} | {texts['kadapt']} | {texts['careful']} | "
                     f"{texts['hgb']} | {vs_careful} | {vs_hgb} | {met} |")
        per_table.append({"table": name, "task": task, "mean": mean, "vs_careful": d_careful, "vs_hgb": d_hgb,
                          "met_careful": ok_careful, "met_hgb": ok_hgb})
    lines.append("")
    lines.append(summary_line(per_table, arms))
    return "\n".join(lines), per_table


def summary_line(per_table, arms):
    if "kadapt" not in arms:
        return "targets: no kadapt arm in this run"
    completed = sum(t["mean"]["kadapt"] is not None for t in per_table)
    within = sum(bool(t["met_hgb"]) for t in per_table)
    careful = sum(bool(t["met_careful"]) for t in per_table)
    points = [t["vs_hgb"] for t in per_table if t["task"] == "classes" and t["vs_hgb"] is not None]
    ratios = [t["vs_hgb"] for t in per_table if t["task"] == "regression" and t["vs_hgb"] is not None]
    classes = sum(t["task"] == "classes" for t in per_table)
    mean_points = f"{statistics.fmean(points):+.2f} points over {len(points)} of {classes}" if points else "-"
    geo = (f"{math.exp(statistics.fmean(math.log(r) for r in ratios)):.3f}x over {len(ratios)} of "
           f"{len(per_table) - classes}") if ratios else "-"
    return (f"targets: kadapt completed {completed} of {len(per_table)} tables; >= careful - 1 point / <= 1.05x "
            f"careful on {careful} of {len(per_table)}; within 0.5 point / 1.05x of hgb on {within} of "
            f"{len(per_table)} (target >= {math.ceil(SHARE_WITHIN_HGB * len(per_table))}); mean accuracy vs hgb "
            f"{mean_points} class tables (target > 0); geometric mean of MSE ratios vs hgb {geo} regressions "
            f"(target < 1)")


def main():
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--tables", nargs="+", choices=list(TABLES), default=list(TABLES), metavar="NAME")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--out", help="write the rows, the table and the summary to this JSON file")
    parser.add_argument("--describe", action="store_true", help="print each table's facts and stop")
    parser.add_argument("--kadapt-flags", default="", help="flags added to the kadapt arm's `kadapt train`, to "
                                                          "measure a candidate default, e.g. \"--epochs 30\"")
    parser.add_argument("--keep", help="write the splits, runs and predictions to this folder and keep them "
                                       "(default: a temporary folder)")
    args = parser.parse_args()
    if args.describe:
        print("| table | package | rows | target | task | empty cells | string columns (distinct values) |")
        print("|---|---|---|---|---|---|---|")
        for name in args.tables:
            print(describe(name))
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    KADAPT_FLAGS.extend(shlex.split(args.kadapt_flags))
    rows = []
    with tempfile.TemporaryDirectory() as temporary:
        temporary = args.keep or temporary
        for name in args.tables:
            for seed in args.seeds:
                folder = Path(temporary) / name / str(seed)
                target, task, count = write_split(name, seed, folder)
                row = {"table": name, "seed": seed, "task": task, "rows": count}
                for arm in args.arms:
                    started = time.perf_counter()
                    try:
                        row[arm] = {"careful": careful_arm, "hgb": hgb_arm, "kadapt": kadapt_arm}[arm](
                            folder, target, task, seed)
                    except Exception as error:  # an arm that fails is a figure too, not the end of the run
                        row[arm] = {"score": None, "completed": False,
                                    "outcome": f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"}
                    row[arm].setdefault("seconds", round(time.perf_counter() - started, 1))
                print(json.dumps(row), flush=True)
                rows.append(row)
    text, per_table = report(rows, args.arms)
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(json.dumps({"command": sys.argv, "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                              time.gmtime()), "rows": rows, "tables": per_table,
                                              "report": text}, indent=1))


if __name__ == "__main__":
    main()
