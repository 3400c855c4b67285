#!/usr/bin/python3
"""report: qualify's evidence JSON (or lockstep.verify's, the same format), or a state replay's
report.json, as one self-contained page.

    report EVIDENCE.json OUT_DIR     writes OUT_DIR/index.html (qualify --report=DIR runs it too)
    report REPLAY/report.json OUT_DIR   the state-replay protocol's page (tools/replay.cc)

The page has no scripts and loads nothing: the plots are SVG drawn by matplotlib and inlined.
It holds the check table; the two actors' execution contexts side by side, differing fields
highlighted; relative L2 and max tolerance ratio of every module record in execution order,
forward and backward, for the repeatability and actors checks (the first divergence marked);
a histogram of the per-tensor tolerance ratios; and the packing-invariance placements.
The replay page holds the verdict, the launches, and per comparison (independent, resumed and
each broken resume against the reference) what was expected, what was found and where the
captures first differ: step, rank, state path, byte offset, element index, both values, and
every differing path of that step.

Every evidence value enters the page as text, escaped (esc). Whatever can be read is rendered;
a field of the wrong type, a figure that is not a number, and each plot when matplotlib is not
installed (it is optional: a warning on stderr, the page still written) are named in notes on
the page instead.
Exit 0 written; 2 the evidence is unreadable (no such file, not JSON, nested too deep, neither
qualify's nor a replay's), the page cannot be written, or bad usage: one line on stderr says
which path and why.
"""

import html
import io
import json
import math
import os
import sys
import tempfile
import warnings

# The report's colours; report/report_test.py looks for them in a screenshot.
FORWARD = "#1f77b4"
BACKWARD = "#ff7f0e"
DIVERGENCE = "#d62728"
HISTOGRAM = "#2ca02c"
FLOOR = 1e-12  # where zero figures are drawn on the log axes
CEILING = 1e30  # where infinite ones are

# Far deeper than lockstep's evidence nests: past it the evidence is not lockstep's, and rendering
# it would only near Python's recursion limit.
MAX_DEPTH = 64
MAX_NOTES = 50  # notes shown; the rest are counted
REPLAY_FORMAT = "lockstep.replay_report/1"
# The tests and report_fuzz.py set it: a section that fails raises instead of becoming a note.
STRICT = False
# lockstep's spelling of the non-finite figures (Note [JSON figures] in base/json.h).
NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
# Fonts as paths (nothing to load, and no text element holding evidence), fixed element ids (one
# evidence file gives one page), and labels as plain text: a module name with $ is not TeX.
PLOT_STYLE = {"svg.fonttype": "path", "svg.hashsalt": "lockstep", "font.size": 9,
              "text.parse_math": False}
CLASSES = (None, "pass", "fail", "differs", "verdict", "note")  # the page's only class names


class Refused(Exception):
    """The evidence is unreadable, or the page cannot be written; the message says why."""


class Html(str):
    """Markup this file built. Any other value put in the page is text and passes through esc."""


def esc(value):
    """`value` as HTML text, quotes escaped too: the one way an evidence value enters the page."""
    if isinstance(value, Html):
        return value
    return Html(html.escape(value if isinstance(value, str) else str(value), quote=True))


def el(tag, *children, cls=None):
    """<tag class='cls'>children</tag>. `tag` and `cls` are this file's constants, never evidence;
    each child is escaped unless it is Html."""
    assert cls in CLASSES, cls
    start = f"<{tag} class='{cls}'>" if cls else f"<{tag}>"
    return Html(start + "".join(esc(c) for c in children) + f"</{tag}>")


def cat(parts, sep="\n"):
    """The parts (each escaped unless Html) one after the other."""
    return Html(sep.join(esc(p) for p in parts))


def table(header, rows):
    """A table: a header row of `header`, then `rows` (each from row)."""
    return el("table", el("tr", *(el("th", h) for h in header)), *rows)


def row(cells, cls=None):
    """A table row of `cells`, each a td."""
    return el("tr", *(el("td", c) for c in cells), cls=cls)


def describe(value):
    """What JSON type `value` is, for a note."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


def short(value, n=60):
    """str(value) cut to n characters, for the plots' labels."""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= n else text[:n - 1] + "\u2026"


def figure(value):
    """A figure as a float: a number, or "nan", "inf", "-inf"; an integer too large for a float is
    infinite. None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, float):
        return value
    return NON_FINITE.get(value) if isinstance(value, str) else None


class Reader:
    """Typed access to the evidence: a field of another type reads as empty, and a note naming it
    says so on the page."""

    def __init__(self, notes=()):
        self.notes = list(notes)

    def field(self, obj, key, kind, where):
        """obj[key] if it is a `kind` (dict or list), else an empty one (noted unless absent or
        null)."""
        value = obj.get(key) if isinstance(obj, dict) else None
        if isinstance(value, kind):
            return value
        if value is not None:
            self.notes.append(f"{where}: {describe(value)}, not {describe(kind())}; left out")
        return kind()

    def dicts(self, obj, key, where):
        """The objects in the list obj[key]; other items are left out, noted."""
        items = self.field(obj, key, list, where)
        chosen = [item for item in items if isinstance(item, dict)]
        if len(chosen) < len(items):
            self.notes.append(f"{where}: {len(items) - len(chosen)} of {len(items)} items are "
                              "not objects; left out")
        return chosen

    def figures(self, records, key, where):
        """Each record's `key` as a float (absent: 0). Those that are not figures, and NaNs, are
        NaN (not drawn), counted in a note."""
        values = [figure(r.get(key, 0)) for r in records]
        bad = sum(v is None for v in values)
        nans = sum(v is not None and math.isnan(v) for v in values)
        if bad:
            self.notes.append(f"{where}: {bad} {key} figure(s) are not numbers; not drawn")
        if nans:
            self.notes.append(f"{where}: {nans} {key} figure(s) are NaN; not drawn")
        return [math.nan if v is None else v for v in values]

    def section(self, name, build, *args):
        """build(*args) (a list of parts), or a note naming the section when it fails on evidence
        nothing here foresaw: the rest of the page is still written."""
        try:
            return build(*args)
        except Exception as e:  # noqa: BLE001  (any failure: a note, not a lost page)
            if STRICT:
                raise
            self.notes.append(f"{name}: not rendered ({type(e).__name__}: {short(e, 300)})")
            return []


def rank0(r, check, name):
    """Rank 0's entry of a check (the page shows rank 0's evidence); {} when there is none."""
    ranks = r.field(check, "ranks", list, f"check {name}: ranks")
    if ranks and not isinstance(ranks[0], dict):
        r.notes.append(f"check {name}: ranks[0]: {describe(ranks[0])}, not an object; left out")
    return ranks[0] if ranks and isinstance(ranks[0], dict) else {}


def rank0_evidence(r, by_name, name):
    """Rank 0's evidence of the check `name` (which by_name holds); {} when there is none."""
    return r.field(rank0(r, by_name[name], name), "evidence", dict,
                   f"check {name}: ranks[0].evidence")


def check_table(r, checks):
    """The checks' table: verdict, ranks passed, rank 0's detail."""
    rows = []
    for check in checks:
        name = short(check.get("name"))
        ranks = r.field(check, "ranks", list, f"check {name}: ranks")
        passed = sum(isinstance(x, dict) and x.get("passed") is True for x in ranks)
        verdict = "PASS" if check.get("passed") is True else "FAIL"
        rows.append(row([check.get("name", ""), verdict, f"{passed}/{len(ranks)}",
                         rank0(r, check, name).get("detail", "")], cls=verdict.lower()))
    return [el("h2", "Checks"), table(["check", "result", "ranks", "detail (rank 0)"], rows)]


def flatten(prefix, value, out):
    """out[dotted path] = each leaf of `value` (an object's fields, recursively)."""
    if isinstance(value, dict):
        for key in sorted(value):
            flatten(f"{prefix}.{key}" if prefix else key, value[key], out)
    else:
        out[prefix] = value


def context_table(r, actors):
    """The two actors' stable execution-context fields side by side, differing ones marked."""
    contexts = [r.field(actors, f"context_{x}", dict, f"actors: context_{x}") for x in "ab"]
    flat = [{}, {}]
    for context, out, x in zip(contexts, flat, "ab"):
        flatten("", r.field(context, "stable", dict, f"actors: context_{x}.stable"), out)
    rows, differing = [], 0
    for key in sorted(set(flat[0]) | set(flat[1])):
        # As JSON text: NaN equals NaN here, and a field absent on one side shows as such.
        a, b = (json.dumps(f[key]) if key in f else "(absent)" for f in flat)
        differing += a != b
        rows.append(row([key, a, b], cls="differs" if a != b else None))
    head = el("p", differing, " stable field(s) differ; digests ", contexts[0].get("digest", ""),
              " and ", contexts[1].get("digest", ""), ".")
    return [el("h2", "Execution contexts of the two actors (rank 0)"), head,
            table(["field", "actor A", "actor B"], rows)]


def actors_parts(r, by_name):
    """The actors' contexts and, when they diverged, their operators' summary."""
    if "actors" not in by_name:
        return []
    actors = rank0_evidence(r, by_name, "actors")
    parts = context_table(r, actors) if actors else []
    operators = r.field(actors, "operators", dict, "actors: operators")
    if operators.get("diverged"):
        parts += [el("h2", "Operators of the two actors (rank 0)"),
                  *(el("p", line) for line in str(operators.get("summary", "")).splitlines())]
    return parts


def drawn(value):
    """A figure where the log axes draw it: NaN stays NaN (a gap), the rest is clamped."""
    return value if math.isnan(value) else min(max(value, FLOOR), CEILING)


_figure = None  # matplotlib's Figure once imported; False when it is not installed


def matplotlib_figure():
    """matplotlib's Figure, imported on first use; None when matplotlib is not installed (one
    warning on stderr: the plots become notes)."""
    global _figure
    if _figure is None:
        try:
            from matplotlib.figure import Figure
            _figure = Figure
        except ImportError as e:
            print(f"report: warning: the plots are not drawn: matplotlib is not installed ({e})",
                  file=sys.stderr)
            _figure = False
    return _figure or None


def svg(draw, figsize):
    """The inline SVG of a figure of `figsize` that draw(figure) fills; a note when matplotlib is
    not installed."""
    Figure = matplotlib_figure()
    if Figure is None:
        return el("p", "plot not drawn: matplotlib is not installed", cls="note")
    import matplotlib
    out = io.StringIO()
    # A context, not pyplot's global state: lockstep.verify runs this inside its own process.
    with matplotlib.rc_context(PLOT_STYLE), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # of a glyph the font lacks (drawn as a box): not stderr's
        figure = Figure(figsize=figsize)
        draw(figure)
        figure.savefig(out, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = out.getvalue()
    return Html(text[text.index("<svg"):])  # drop the XML prolog and doctype


HALVES = (("forward", ("forward_output",), FORWARD),
          ("backward", ("gradient_at_output", "gradient_at_input", "incoming_gradient",
                        "accumulated_gradient"), BACKWARD))


def module_plot(title, records, l2, ratio, first_index):
    """Relative L2 and max tolerance ratio per record, forward and backward, in execution order."""
    def draw(figure):
        for axis, (name, kinds, colour) in zip(figure.subplots(1, 2), HALVES):
            chosen = [i for i, rec in enumerate(records) if rec.get("kind") in kinds]
            xs = list(range(len(chosen)))
            ys = [drawn(l2[i]) for i in chosen], [drawn(ratio[i]) for i in chosen]
            axis.plot(xs, ys[0], marker="o", color=colour, label="relative L2", linewidth=2)
            axis.plot(xs, ys[1], marker="s", color=colour, linestyle="--", alpha=0.6,
                      label="max tolerance ratio")
            for x, i in zip(xs, chosen):
                if first_index is not None and records[i].get("index") == first_index:
                    axis.axvline(x, color=DIVERGENCE, linewidth=3,
                                 label="first divergence: " + short(records[i].get("module")))
            axis.set_yscale("log")
            top = max([y for y in ys[0] + ys[1] if not math.isnan(y)] + [1.0])
            axis.set_ylim(FLOOR / 3, top * 3)
            # At most about 30 labels: every record's when they fit, else every k-th.
            step = max(1, math.ceil(len(chosen) / 30))
            axis.set_xticks(xs[::step])
            axis.set_xticklabels([short(records[i].get("module")) + " ["
                                  + records[i]["kind"].split("_")[0] + "]"
                                  for i in chosen[::step]], rotation=75, fontsize=6)
            axis.set_xlabel("record, in execution order")
            axis.set_title(f"{title}: {name} ({len(chosen)} records)")
            axis.legend(fontsize=7)
    return svg(draw, (11, 3.4))


def ratio_histogram(ratios):
    """The histogram of log10 of the per-tensor tolerance ratios."""
    def draw(figure):
        axis = figure.subplots()
        axis.hist([math.log10(drawn(v)) for v in ratios], bins=24, color=HISTOGRAM,
                  edgecolor="black")
        axis.set_xlabel(f"log10 max tolerance ratio per tensor (0 drawn at "
                        f"{math.log10(FLOOR):.0f}; <= 0 passes the default tolerance)")
        axis.set_ylabel("tensors")
        axis.set_title(f"{len(ratios)} tensors")
    return svg(draw, (6, 3))


def divergence_parts(r, by_name):
    """Per module plot of repeatability and actors, then the histogram of their ratios."""
    parts, ratios = [], []
    for name in ("repeatability", "actors"):
        ev = rank0_evidence(r, by_name, name) if name in by_name else {}
        if not ev:
            continue
        first = r.field(ev, "first_divergence", dict, f"{name}: first_divergence")
        records = r.dicts(ev, "records", f"{name}: records")
        l2 = r.figures(records, "relative_l2", f"{name}: records")
        ratio = r.figures(records, "max_tolerance_ratio", f"{name}: records")
        where = (["first divergence: ", first.get("module"), " (", first.get("kind"),
                  ", record ", first.get("index"), ")"] if first.get("module")
                 else ["no record differs"])
        first_index = first.get("index") if first.get("module") else None
        parts += [el("h2", name, " by module (rank 0): ", *where),
                  module_plot(name, records, l2, ratio, first_index)]
        ratios += [v for rec, v in zip(records, ratio)
                   if "max_tolerance_ratio" in rec and not math.isnan(v)]
    if ratios:
        parts += [el("h2", "Per-tensor tolerance ratios (module records of repeatability and "
                           "actors, rank 0)"), ratio_histogram(ratios)]
    return parts


def placements_parts(r, by_name):
    """The packing-invariance placements: reproduced, and where each first differs from alone."""
    if "packing_invariance" not in by_name:
        return []
    rows = []
    for p in r.dicts(rank0_evidence(r, by_name, "packing_invariance"), "placements",
                     "packing_invariance: placements"):
        differences = r.field(p, "differences_from_alone", list,
                              "packing_invariance: differences_from_alone")
        first = differences[0] if differences and isinstance(differences[0], dict) else {}
        where = ""
        if differences:
            raw = r.field(first, "figures", dict, "packing_invariance: figures").get(
                "max_abs_diff", 0)
            diff = figure(raw)
            if diff is None:
                r.notes.append(f"packing_invariance: max_abs_diff: {describe(raw)}, not a "
                               "number; shown as ?")
            where = cat([first.get("first_module"), " (max |diff| ",
                         "?" if diff is None else format(diff, ".3g"), ")"], "")
        rows.append(row([p.get("name", ""), p.get("microbatches"),
                         "yes" if p.get("reproduced") is True else "NO", len(differences),
                         where]))
    return [el("h2", "Packing invariance (rank 0)"),
            table(["placement", "microbatches", "reproduced", "sequences differing from alone",
                   "first module"], rows)]


STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
td, th { border: 1px solid #bbb; padding: 3px 6px; text-align: left; vertical-align: top; }
tr.fail td { background: #fdd; } tr.pass td:nth-child(2) { color: #060; }
tr.differs td { background: #fd8; font-weight: bold; }
.verdict { font-size: 1.4em; font-weight: bold; }
.note { color: #a00; }
"""


def document(title, head, body, r):
    """The page: `title` (text), `head`, what could not be rendered (r's notes), then `body`."""
    notes = list(dict.fromkeys(r.notes))
    if len(notes) > MAX_NOTES:
        notes[MAX_NOTES:] = [f"and {len(notes) - MAX_NOTES} more"]
    shown = ([el("h2", "Not rendered", cls="note"), el("ul", *(el("li", n) for n in notes))]
             if notes else [])
    return cat([Html("<!DOCTYPE html><html><head><meta charset='utf-8'>"), el("title", title),
                Html(f"<style>{STYLE}</style></head><body>"), *head, *shown, *body,
                Html("</body></html>")])


def render(evidence, notes=()):
    """The page of qualify's (or verify's) evidence; `notes`: what reading it could not keep."""
    r = Reader(notes)
    checks = r.dicts(evidence, "checks", "checks")
    by_name = {c.get("name"): c for c in checks if isinstance(c.get("name"), str)}
    topology = r.field(evidence, "topology", dict, "topology")
    verdict = "PASS" if evidence.get("passed") is True else "FAIL"
    title = evidence.get("title")
    head = [el("h1", title) if title else
            el("h1", "qualify: DP", topology.get("dp"), " x TP", topology.get("tp"), " x CP",
               topology.get("cp"), " on ", evidence.get("device", "")),
            el("p", verdict, cls="verdict"),
            el("p", "negative control: ", evidence.get("negative_control") or "none",
               "; transport ", evidence.get("transport", ""))]
    body = r.section("checks", check_table, r, checks)
    body += [el("p", "error: ", e, cls="verdict") for e in r.field(evidence, "errors", list,
                                                                   "errors")]
    body += r.section("actors", actors_parts, r, by_name)
    body += r.section("module plots", divergence_parts, r, by_name)
    body += r.section("packing invariance", placements_parts, r, by_name)
    return document(cat([title or "qualify", verdict], " "), head, body, r)


def launch_parts(r, report):
    """The replay's launches: exit, seconds, log."""
    rows = []
    for launch in r.dicts(report, "launches", "launches"):
        seconds = figure(launch.get("seconds", 0))
        rows.append(row([launch.get("name"), launch.get("exit_code", launch.get("error", "")),
                         launch.get("seconds") if seconds is None else format(seconds, ".1f"),
                         launch.get("log", "")], cls="fail" if "error" in launch else "pass"))
    return [el("h2", "Launches"), table(["launch", "exit", "seconds", "log"], rows)]


def comparison_parts(r, report):
    """Per comparison against the reference: what was expected and where the captures differ."""
    rows = []
    for c in r.dicts(report, "comparisons", "comparisons"):
        d = r.field(c, "first_difference", dict, "comparisons: first_difference")
        steps = c.get("steps", ["?", "?"])
        span = steps
        if isinstance(steps, list) and len(steps) == 2:
            span = cat([steps[0], "..", steps[1]], "")
        else:
            r.notes.append(f"comparisons: steps: {describe(steps)}, not a [first, last] pair; "
                           "shown as it is")
        paths = r.field(d, "differing_paths", list, "comparisons: differing_paths")
        shown = ", ".join(str(p) for p in paths[:12]) + (" ..." if len(paths) > 12 else "")
        cells = [c.get("name"), span, c.get("expected"),
                 c.get("error") if c.get("verdict") == "evidence" else c.get("verdict"),
                 d.get("step", ""), d.get("rank", ""), d.get("path", "match"),
                 d.get("byte_offset", ""), d.get("element_index", ""), d.get("a", ""),
                 d.get("b", ""), shown]
        bad = c.get("verdict") != "as_expected"
        rows.append(row(cells, cls="fail" if bad else ("differs" if d else "pass")))
    return [el("h2", "Comparisons against the reference, byte for byte"),
            table(["run", "steps", "expected", "verdict", "first step", "rank", "state path",
                   "byte", "element", "reference", "this run", "differing paths of that step"],
                  rows)]


def replay_render(report, notes=()):
    """The page of a state replay's report.json; `notes`: what reading it could not keep."""
    r = Reader(notes)
    verdict = report.get("verdict")
    verdict = {"pass": "PASS", "mismatch": "FAIL", "evidence": "NO VERDICT"}.get(
        verdict if isinstance(verdict, str) else None, "?")
    program = report.get("program", [])
    if isinstance(program, list):
        program = " ".join(str(a) for a in program)
    head = [el("h1", "State replay: ", report.get("nproc"), " ranks, ", report.get("steps"),
               " steps, resumed at step ", report.get("resume_step")),
            el("p", verdict, " (exit ", report.get("exit_code"), ")", cls="verdict"),
            el("p", "program: ", el("code", program))]
    body = r.section("launches", launch_parts, r, report)
    body += r.section("comparisons", comparison_parts, r, report)
    return document(cat(["replay", verdict], " "), head, body, r)


def depth(value):
    """How deep `value` nests (a scalar 0), counted without recursion, stopping past MAX_DEPTH."""
    deepest, stack = 0, [(value, 1)]
    while stack and deepest <= MAX_DEPTH:
        value, d = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, d)
            stack += [(v, d + 1) for v in (value.values() if isinstance(value, dict) else value)]
    return deepest


def integer(digits):
    """A JSON integer; past Python's int() digit limit (4300) it reads as infinite, as good a
    figure for one that large."""
    return int(digits) if len(digits) < 4000 else float(digits)


def parse(data):
    """The evidence in `data` (bytes) and notes on how it was read; raises Refused."""
    notes = []
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        text = data.decode("utf-8-sig", errors="replace")
        notes.append(f"the evidence is not UTF-8 (from byte {e.start}): undecodable bytes are "
                     "shown as \ufffd")
    try:
        evidence = json.loads(text, parse_int=integer)
    except RecursionError:
        raise Refused("is not readable JSON: nested too deeply") from None
    except ValueError as e:
        raise Refused(f"is not JSON ({e})") from None
    if depth(evidence) > MAX_DEPTH:
        raise Refused(f"nests deeper than {MAX_DEPTH} levels: not lockstep's evidence")
    return evidence, notes


def page_of(evidence, notes=()):
    """The page of qualify's or verify's evidence or of a replay's report; raises Refused for
    anything else."""
    if isinstance(evidence, dict) and evidence.get("format") == REPLAY_FORMAT:
        return replay_render(evidence, notes)
    if isinstance(evidence, dict) and "checks" in evidence:
        return render(evidence, notes)
    raise Refused("is neither qualify's evidence (an object with 'checks') nor a replay's "
                  f"report (format {REPLAY_FORMAT})")


def umask():
    """The process's umask, read without changing it where Linux says it (another thread may be
    creating files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restored at once
    os.umask(mask)
    return mask


def write_page(path, text):
    """Writes `text` to `path` through a new temporary beside it (random name, O_EXCL: nothing
    planted there is written through), made durable, then renamed onto `path`. A `path` that is a
    symbolic link is refused: lockstep writes through no link it did not make."""
    if os.path.islink(path):
        raise Refused("is a symbolic link; not written through")
    fd, tmp = tempfile.mkstemp(prefix=".index.html.", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~umask())  # mkstemp's 0600, as open() would make it
            f.write(text.encode("utf-8", errors="replace"))  # a lone surrogate becomes "?"
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


USAGE = ("usage: report EVIDENCE.json OUT_DIR: the HTML page (OUT_DIR/index.html) of qualify's "
         "or verify's evidence, or of a replay's report")


def main(argv):
    """The command (argv as sys.argv): its exit status."""
    if argv[1:] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if len(argv) != 3:
        print(USAGE, file=sys.stderr)
        return 2
    source, directory = argv[1], argv[2]
    try:
        with open(source, "rb") as f:
            evidence, notes = parse(f.read())
        page = page_of(evidence, notes)
    except OSError as e:
        print(f"report: cannot read {source}: {e.strerror or e}", file=sys.stderr)
        return 2
    except Refused as e:
        print(f"report: {source} {e}", file=sys.stderr)
        return 2
    path = os.path.join(directory, "index.html")
    try:
        os.makedirs(directory, exist_ok=True)
        write_page(path, page)
    except (OSError, Refused) as e:
        print(f"report: cannot write {path}: {e}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
