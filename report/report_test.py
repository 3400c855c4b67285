"""Loads a report page in headless Chromium and checks it: self-contained (no scripts, nothing
fetched), no load errors, the DOM holds the checks and the first divergence, and the screenshot's
pixels show the plots in the report's colours. A copy of the page with its plots removed must
fail the pixel check (the check's negative control).

    report_test.py PAGE.html WORK_DIR
"""

import os
import re
import subprocess
import sys

import matplotlib.image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402  (the colours the page uses)

COLOURS = {"forward": report.FORWARD, "backward": report.BACKWARD,
           "first divergence": report.DIVERGENCE, "histogram": report.HISTOGRAM}
MIN_PIXELS = 200


def chromium(page, work, *flags):
    env = dict(os.environ, HOME=work)
    return subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--hide-scrollbars", "--enable-logging=stderr", "--v=0", "--window-size=1300,3200",
         *flags, "file://" + os.path.abspath(page)],
        capture_output=True, text=True, timeout=120, env=env)


def pixel_counts(png):
    image = matplotlib.image.imread(png)[:, :, :3]
    counts = {}
    for name, colour in COLOURS.items():
        rgb = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        close = (abs(image - rgb) < 0.06).all(axis=2)
        counts[name] = int(close.sum())
    return counts


def screenshot(page, work, name):
    png = os.path.join(work, name + ".png")
    run = chromium(page, work, "--screenshot=" + png)
    errors = [line for line in run.stderr.splitlines()
              if re.search(r"Failed to load resource|net::ERR_|Uncaught|CONSOLE", line)]
    if run.returncode != 0 or not os.path.exists(png):
        sys.exit(f"chromium exited {run.returncode} without a screenshot:\n{run.stderr}")
    return png, errors


def main(page, work):
    text = open(page, encoding="utf-8").read()
    assert "<script" not in text, "the page has a script"
    assert not re.search(r'\b(src|href)="(?!#)', text), "the page loads something"
    assert not re.search(r"url\((?!#)", text), "the page's style loads something"

    png, errors = screenshot(page, work, "page")
    assert not errors, "the page loaded with errors:\n" + "\n".join(errors)
    dom = chromium(page, work, "--dump-dom").stdout
    for needle in ["repeatability", "actors", "packing_invariance", "FAIL",
                   "first divergence: block1.mlp", "Execution contexts of the two actors"]:
        assert needle in dom, f"the rendered DOM lacks {needle!r}"
    counts = pixel_counts(png)
    print("pixels per colour:", counts)
    for name, n in counts.items():
        assert n >= MIN_PIXELS, f"the screenshot shows {n} {name} pixels, fewer than {MIN_PIXELS}"

    # Negative control: the same page without its plots must fail the pixel check.
    bare = os.path.join(work, "bare.html")
    with open(bare, "w", encoding="utf-8") as f:
        f.write(re.sub(r"<svg.*?</svg>", "", text, flags=re.S))
    bare_png, _ = screenshot(bare, work, "bare")
    bare_counts = pixel_counts(bare_png)
    print("pixels per colour without the plots:", bare_counts)
    assert any(n < MIN_PIXELS for n in bare_counts.values()), \
        "the pixel check passes a page without plots"
    print("report page: ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
