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
Exit 0 written, 1 the evidence is neither qualify's nor a replay's, 2 bad usage.
"""

import html
import io
import json
import math
import os
import sys

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

# The report's colours; report/report_test.py looks for them in a screenshot.
FORWARD = "#1f77b4"
BACKWARD = "#ff7f0e"
DIVERGENCE = "#d62728"
HISTOGRAM = "#2ca02c"
FLOOR = 1e-12  # where zero figures are drawn on the log axes

# Fonts as paths (nothing to load) and fixed element ids, so one evidence file gives one page.
plt.rcParams.update({"svg.fonttype": "path", "svg.hashsalt": "lockstep", "font.size": 9})


def svg(figure):
    out = io.StringIO()
    figure.savefig(out, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(figure)
    text = out.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and doctype


def number(value):
    if value == "inf":
        return math.inf
    return float(value) if isinstance(value, (int, float)) else 0.0


def rank0(check):
    ranks = check.get("ranks") or [{}]
    return ranks[0]


def check_table(evidence):
    rows = []
    for check in evidence.get("checks", []):
        ranks = check.get("ranks", [])
        passed = sum(1 for r in ranks if r.get("passed"))
        verdict = "PASS" if check.get("passed") else "FAIL"
        rows.append(
            f'<tr class="{verdict.lower()}"><td>{html.escape(check.get("name", ""))}</td>'
            f"<td>{verdict}</td><td>{passed}/{len(ranks)}</td>"
            f'<td>{html.escape(str(rank0(check).get("detail", "")))}</td></tr>')
    return ("<table><tr><th>check</th><th>result</th><th>ranks</th><th>detail (rank 0)</th></tr>"
            + "".join(rows) + "</table>")


def flatten(prefix, value, out):
    if isinstance(value, dict):
        for key in sorted(value):
            flatten(f"{prefix}.{key}" if prefix else key, value[key], out)
    else:
        out[prefix] = value


def context_table(a, b):
    fa, fb = {}, {}
    flatten("", (a or {}).get("stable", {}), fa)
    flatten("", (b or {}).get("stable", {}), fb)
    rows = []
    differing = 0
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key, "(absent)"), fb.get(key, "(absent)")
        cls = "differs" if va != vb else ""
        differing += va != vb
        rows.append(f'<tr class="{cls}"><td>{html.escape(key)}</td>'
                    f"<td>{html.escape(json.dumps(va))}</td><td>{html.escape(json.dumps(vb))}</td></tr>")
    head = (f"<p>{differing} stable field(s) differ; digests "
            f"{html.escape(str((a or {}).get('digest', '')))} and "
            f"{html.escape(str((b or {}).get('digest', '')))}.</p>")
    return head + ("<table><tr><th>field</th><th>actor A</th><th>actor B</th></tr>"
                   + "".join(rows) + "</table>")


def module_plot(title, evidence):
    """Relative L2 and max tolerance ratio per record, forward and backward, in execution order."""
    records = evidence.get("records", [])
    first = evidence.get("first_divergence") or {}
    first_index = first.get("index") if isinstance(first, dict) and first.get("module") else None
    figure, axes = plt.subplots(1, 2, figsize=(11, 3.4))
    for axis, (name, kinds, colour) in zip(axes, [
            ("forward", {"forward_output"}, FORWARD),
            ("backward", {"gradient_at_output", "gradient_at_input", "incoming_gradient",
                          "accumulated_gradient"}, BACKWARD)]):
        chosen = [r for r in records if r.get("kind") in kinds]
        xs = list(range(len(chosen)))
        l2 = [max(number(r.get("relative_l2", 0)), FLOOR) for r in chosen]
        ratio = [max(min(number(r.get("max_tolerance_ratio", 0)), 1e30), FLOOR) for r in chosen]
        axis.plot(xs, l2, marker="o", color=colour, label="relative L2", linewidth=2)
        axis.plot(xs, ratio, marker="s", color=colour, linestyle="--", alpha=0.6,
                  label="max tolerance ratio")
        for x, r in zip(xs, chosen):
            if r.get("index") == first_index:
                axis.axvline(x, color=DIVERGENCE, linewidth=3,
                             label=f"first divergence: {r.get('module')}")
        axis.set_yscale("log")
        axis.set_ylim(FLOOR / 3, max(l2 + ratio + [1.0]) * 3)
        # At most about 30 labels: every record's when they fit, else every k-th.
        step = max(1, math.ceil(len(chosen) / 30))
        axis.set_xticks(xs[::step])
        axis.set_xticklabels([f"{r.get('module')} [{r.get('kind', '').split('_')[0]}]"
                              for r in chosen[::step]], rotation=75, fontsize=6)
        axis.set_xlabel("record, in execution order")
        axis.set_title(f"{title}: {name} ({len(chosen)} records)")
        axis.legend(fontsize=7)
    return svg(figure)


def ratio_histogram(ratios):
    figure, axis = plt.subplots(figsize=(6, 3))
    values = [math.log10(max(min(r, 1e30), FLOOR)) for r in ratios]
    axis.hist(values, bins=24, color=HISTOGRAM, edgecolor="black")
    axis.set_xlabel(f"log10 max tolerance ratio per tensor (0 drawn at {math.log10(FLOOR):.0f}; "
                    "<= 0 passes the default tolerance)")
    axis.set_ylabel("tensors")
    axis.set_title(f"{len(ratios)} tensors")
    return svg(figure)


def placements_table(evidence):
    rows = []
    for p in evidence.get("placements", []):
        differences = p.get("differences_from_alone", [])
        first = differences[0] if differences else {}
        where = (f"{first.get('first_module')} (max |diff| "
                 f"{number((first.get('figures') or {}).get('max_abs_diff', 0)):.3g})"
                 if differences else "")
        rows.append(f"<tr><td>{html.escape(p.get('name', ''))}</td><td>{p.get('microbatches')}</td>"
                    f"<td>{'yes' if p.get('reproduced') else 'NO'}</td><td>{len(differences)}</td>"
                    f"<td>{html.escape(where)}</td></tr>")
    return ("<table><tr><th>placement</th><th>microbatches</th><th>reproduced</th>"
            "<th>sequences differing from alone</th><th>first module</th></tr>"
            + "".join(rows) + "</table>")


STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
td, th { border: 1px solid #bbb; padding: 3px 6px; text-align: left; vertical-align: top; }
tr.fail td { background: #fdd; } tr.pass td:nth-child(2) { color: #060; }
tr.differs td { background: #fd8; font-weight: bold; }
.verdict { font-size: 1.4em; font-weight: bold; }
"""


def render(evidence):
    checks = {c.get("name"): c for c in evidence.get("checks", [])}
    topology = evidence.get("topology", {})
    verdict = "PASS" if evidence.get("passed") else "FAIL"
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(str(evidence.get('title') or 'qualify'))} {verdict}</title>"
        f"<style>{STYLE}</style></head><body>",
        (f"<h1>{html.escape(str(evidence['title']))}</h1>" if evidence.get("title") else
         f"<h1>qualify: DP{topology.get('dp')} x TP{topology.get('tp')} x CP{topology.get('cp')}"
         f" on {html.escape(str(evidence.get('device', '')))}</h1>"),
        f"<p class='verdict'>{verdict}</p><p>negative control: "
        f"{html.escape(str(evidence.get('negative_control') or 'none'))}; transport "
        f"{html.escape(str(evidence.get('transport', '')))}</p>",
        "<h2>Checks</h2>", check_table(evidence)]
    for error in evidence.get("errors", []):
        parts.append(f"<p class='verdict'>error: {html.escape(error)}</p>")
    actors = rank0(checks["actors"]).get("evidence") if "actors" in checks else None
    if actors:
        parts += ["<h2>Execution contexts of the two actors (rank 0)</h2>",
                  context_table(actors.get("context_a"), actors.get("context_b"))]
    operators = (actors or {}).get("operators") or {}
    if operators.get("diverged"):
        parts += ["<h2>Operators of the two actors (rank 0)</h2>",
                  "".join(f"<p>{html.escape(line)}</p>"
                          for line in str(operators.get("summary", "")).splitlines())]
    ratios = []
    for name in ("repeatability", "actors"):
        ev = rank0(checks[name]).get("evidence") if name in checks else None
        if not ev:
            continue
        first = ev.get("first_divergence") or {}
        where = (f"first divergence: {html.escape(str(first.get('module')))} "
                 f"({html.escape(str(first.get('kind')))}, record {first.get('index')})"
                 if isinstance(first, dict) and first.get("module") else "no record differs")
        parts += [f"<h2>{name} by module (rank 0): {where}</h2>", module_plot(name, ev)]
        ratios += [number(r.get("max_tolerance_ratio", 0)) for r in ev.get("records", [])
                   if "max_tolerance_ratio" in r]
    if ratios:
        parts += ["<h2>Per-tensor tolerance ratios (module records of repeatability and actors, "
                  "rank 0)</h2>", ratio_histogram(ratios)]
    if "packing_invariance" in checks:
        ev = rank0(checks["packing_invariance"]).get("evidence") or {}
        parts += ["<h2>Packing invariance (rank 0)</h2>", placements_table(ev)]
    parts.append("</body></html>")
    return "\n".join(parts)


REPLAY_FORMAT = "lockstep.replay_report/1"


def replay_render(report):
    verdict = {"pass": "PASS", "mismatch": "FAIL", "evidence": "NO VERDICT"}.get(
        report.get("verdict"), "?")
    program = " ".join(str(a) for a in report.get("program", []))
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>replay {verdict}</title><style>{STYLE}</style></head><body>",
        f"<h1>State replay: {report.get('nproc')} ranks, {report.get('steps')} steps, "
        f"resumed at step {report.get('resume_step')}</h1>",
        f"<p class='verdict'>{verdict} (exit {report.get('exit_code')})</p>",
        f"<p>program: <code>{html.escape(program)}</code></p>",
        "<h2>Launches</h2><table><tr><th>launch</th><th>exit</th><th>seconds</th>"
        "<th>log</th></tr>"]
    for launch in report.get("launches", []):
        failed = "error" in launch
        parts.append(
            f"<tr class='{'fail' if failed else 'pass'}'><td>{html.escape(str(launch.get('name')))}"
            f"</td><td>{html.escape(str(launch.get('exit_code', launch.get('error', ''))))}</td>"
            f"<td>{number(launch.get('seconds', 0)):.1f}</td>"
            f"<td>{html.escape(str(launch.get('log', '')))}</td></tr>")
    parts.append("</table><h2>Comparisons against the reference, byte for byte</h2><table><tr>"
                 "<th>run</th><th>steps</th><th>expected</th><th>verdict</th><th>first step</th>"
                 "<th>rank</th><th>state path</th><th>byte</th><th>element</th><th>reference</th>"
                 "<th>this run</th><th>differing paths of that step</th></tr>")
    for c in report.get("comparisons", []):
        d = c.get("first_difference") or {}
        bad = c.get("verdict") != "as_expected"
        cells = [c.get("name"), "%s..%s" % tuple(c.get("steps", ["?", "?"])), c.get("expected"),
                 c.get("error") if c.get("verdict") == "evidence" else c.get("verdict"),
                 d.get("step", ""), d.get("rank", ""), d.get("path", "match"),
                 d.get("byte_offset", ""), d.get("element_index", ""), d.get("a", ""),
                 d.get("b", ""), ", ".join(d.get("differing_paths", [])[:12])
                 + (" ..." if len(d.get("differing_paths", [])) > 12 else "")]
        row_class = "fail" if bad else ("differs" if d else "pass")
        parts.append(f"<tr class='{row_class}'>"
                     + "".join(f"<td>{html.escape(str(x))}</td>" for x in cells) + "</tr>")
    parts.append("</table></body></html>")
    return "\n".join(parts)


USAGE = ("usage: report EVIDENCE.json OUT_DIR: the HTML page (OUT_DIR/index.html) of qualify's "
         "or verify's evidence, or of a replay's report")


def main(argv):
    if argv[1:] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if len(argv) != 3:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        with open(argv[1], encoding="utf-8") as f:
            evidence = json.load(f)
    except (OSError, ValueError) as e:
        print(f"report: cannot read {argv[1]}: {e}", file=sys.stderr)
        return 1
    replay = isinstance(evidence, dict) and evidence.get("format") == REPLAY_FORMAT
    if not replay and (not isinstance(evidence, dict) or "checks" not in evidence):
        print(f"report: {argv[1]} is not qualify's evidence (no 'checks') nor a replay's report",
              file=sys.stderr)
        return 1
    os.makedirs(argv[2], exist_ok=True)
    path = os.path.join(argv[2], "index.html")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(replay_render(evidence) if replay else render(evidence))
    os.replace(path + ".tmp", path)
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
