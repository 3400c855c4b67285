#!/usr/bin/env python3
"""Draws the loss curve of examples/lm/train's --log_csv as a PNG a person can open.

    python3 examples/lm/plot_loss.py loss.csv loss.png [--title TEXT]

Several CSV files may be given (comma-separated before the output), each drawn as its own line,
labelled by its file name: e.g. an unsplit run and a DP2 x CP2 run on one plot.
"""
import argparse
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display: write files only
import matplotlib.pyplot as plt  # noqa: E402

WIDTH_PX, HEIGHT_PX, DPI = 800, 450, 100


def read(path):
    steps, losses = [], []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            steps.append(int(row["step"]))
            losses.append(float(row["loss"]))
    if not steps:
        raise ValueError(f"{path}: no rows")
    return steps, losses


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="one or more --log_csv files, comma-separated")
    parser.add_argument("png", help="the image to write")
    parser.add_argument("--title", default="examples/lm/train: loss per step")
    args = parser.parse_args(argv)
    figure, axes = plt.subplots(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI)
    try:
        for path in args.csv.split(","):
            steps, losses = read(path)
            axes.plot(steps, losses, label=os.path.basename(path), linewidth=1.2)
    except (OSError, ValueError, KeyError) as e:
        print(f"plot_loss: {e}", file=sys.stderr)
        return 2
    axes.set_xlabel("step")
    axes.set_ylabel("loss (next-byte cross-entropy, nats)")
    axes.set_title(args.title)
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(args.png, dpi=DPI)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
