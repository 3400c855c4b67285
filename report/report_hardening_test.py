#!/usr/bin/python3
"""report.py against hostile and malformed input: every evidence value escaped (the page has no
element the evidence did not intend), any readable evidence rendered with what could not be
drawn named on the page, unreadable evidence and unwritable output refused in one line with
exit 2, the page without matplotlib, and no write through a planted symbolic link.

    report_hardening_test.py     (Debian's /usr/bin/python3, with matplotlib)
"""

import contextlib
import html
import io
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import report  # noqa: E402
import report_fuzz  # noqa: E402  (the page check the fuzzer uses too)

REPORT = os.path.join(HERE, "report.py")
SCRATCH = os.environ.get("TEST_TMPDIR") or None  # Bazel's, else the system's
# The sandbox's HOME is not writable; the subprocesses inherit it.
os.environ.setdefault("MPLCONFIGDIR", os.path.join(SCRATCH or tempfile.gettempdir(),
                                                   "report_hardening_matplotlib"))
PAYLOADS = ["<script>alert(1)</script>", '"><img src=x onerror=1>', "'><iframe onload=alert(1)>",
            "--><svg onload=alert(1)>", "<![CDATA[<script>alert(1)</script>]]>",
            "</td></tr></table><script>alert(1)</script>", "&lt;script&gt;", "javascript:x"]


def strings(hostile):
    """The i-th call gives the i-th payload (cycling), or "x" for the benign twin."""
    n = itertools.count()
    return lambda: PAYLOADS[next(n) % len(PAYLOADS)] if hostile else "x"


def records(s, first_index):
    """Module records, forward and backward, whose module names are s() (and one all s())."""
    kinds = ["forward_output", "gradient_at_output", "gradient_at_input", "incoming_gradient",
             "accumulated_gradient"]
    out = [{"index": i, "module": s(), "kind": kinds[i % len(kinds)], "relative_l2": 0.1 * i,
            "max_tolerance_ratio": 2.0 ** i, "note": s()} for i in range(10)]
    out[3]["index"] = first_index
    out.append({"index": s(), "module": s(), "kind": s(), "relative_l2": s(),
                "max_tolerance_ratio": s()})
    return out


def context(s, keys):
    # Both actors name the same (hostile) fields, so the benign twin has as many rows.
    return {"digest": s(), "stable": {keys[0]: s(), "same": "v",
                                      "nested": {keys[1]: [s(), 1], "n": s()}}}


def qualify_evidence(s, title=False):
    """qualify-style evidence whose every string (and every field that may be one) is s()."""
    first_index = s()
    first = {"module": s(), "kind": s(), "index": first_index}
    keys = [s() + "1", s() + "2"]
    evidence = {
        "format": s(), "passed": s(), "device": s(), "negative_control": s(), "transport": s(),
        "topology": {"dp": s(), "tp": s(), "cp": s()}, "errors": [s(), s()],
        "checks": [
            {"name": "repeatability", "passed": s(), "ranks": [
                {"rank": s(), "passed": s(), "detail": s(),
                 "evidence": {"records": records(s, first_index), "first_divergence": first}}]},
            {"name": "actors", "passed": False, "ranks": [
                {"rank": 0, "passed": False, "detail": s(), "evidence": {
                    "records": records(s, first_index), "first_divergence": first,
                    "context_a": context(s, keys), "context_b": context(s, keys),
                    "operators": {"diverged": True, "summary": s() + "\n" + s()}}},
                {"rank": s(), "passed": s(), "detail": s()}]},
            {"name": "packing_invariance", "passed": True, "ranks": [
                {"passed": True, "detail": s(), "evidence": {"placements": [
                    {"name": s(), "microbatches": s(), "reproduced": s(),
                     "differences_from_alone": [{"first_module": s(),
                                                 "figures": {"max_abs_diff": s()}}]},
                    {"name": s(), "microbatches": 3, "reproduced": True,
                     "differences_from_alone": [{"first_module": s(),
                                                 "figures": {"max_abs_diff": 0.25}}]}]}}]},
            {"name": s(), "passed": s(), "ranks": [{"detail": s(), "passed": s()}]}]}
    if title:
        evidence["title"] = s()
    return evidence


def replay_report(s):
    """A replay report whose every string (and every field that may be one) is s()."""
    return {
        "format": report.REPLAY_FORMAT, "verdict": s(), "nproc": s(), "steps": s(),
        "resume_step": s(), "exit_code": s(), "program": [s(), s()],
        "launches": [{"name": s(), "exit_code": s(), "seconds": s(), "log": s()},
                     {"name": s(), "error": s(), "seconds": 1.5, "log": s()}],
        "comparisons": [
            {"name": s(), "steps": [s(), s()], "expected": s(), "verdict": s(), "error": s(),
             "first_difference": {"step": s(), "rank": s(), "path": s(), "byte_offset": s(),
                                  "element_index": s(), "a": s(), "b": s(),
                                  "differing_paths": [s(), s()]}},
            {"name": s(), "steps": [1, 2], "expected": s(), "verdict": "evidence",
             "error": s()},
            {"name": s(), "steps": [1, 2], "expected": s(), "verdict": "as_expected"}]}


def run_main(*args):
    """report.main in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = report.main(["report", *args])
    return rc, out.getvalue(), err.getvalue()


def render(content, work, name="evidence"):
    """Writes `content` (bytes, or JSON-able) as evidence and renders it: (rc, page, stderr)."""
    path = os.path.join(work, name + ".json")
    with open(path, "wb") as f:
        f.write(content if isinstance(content, bytes) else json.dumps(content).encode())
    out = os.path.join(work, name)
    rc, _, err = run_main(path, out)
    page = os.path.join(out, "index.html")
    return rc, read(page) if os.path.exists(page) else None, err


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


class Base(unittest.TestCase):
    def setUp(self):
        report.STRICT = True  # a section that fails is a test failure, not a note
        self.work = tempfile.mkdtemp(prefix="report_hardening.", dir=SCRATCH)
        self.addCleanup(shutil.rmtree, self.work)

    def rendered(self, content, name="evidence"):
        rc, page, err = render(content, self.work, name)
        self.assertEqual(rc, 0, err)
        self.assertIsNotNone(page, err)
        self.assertNotIn("Traceback", err)
        return page

    def refused(self, args, named):
        rc, out, err = run_main(*args)
        self.assertEqual(rc, 2, out + err)
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertIn(named, err)
        self.assertNotIn("Traceback", err)


class EscapingTest(Base):
    def assert_escaped(self, make, name, plots=0):
        hostile = self.rendered(make(strings(True)), name)
        benign = self.rendered(make(strings(False)), name + "_benign")
        problems = report_fuzz.page_problems(hostile, benign)
        self.assertEqual(problems, [], "\n".join(problems))
        self.assertEqual(hostile.count("<svg"), plots)
        if plots:
            # A tick label with a hostile module name reached matplotlib: drawn as paths, its text
            # only in an escaped comment.
            labels = re.findall(r"<!-- (.*) \[(?:forward|gradient)\] -->", hostile)
            self.assertTrue(any("&lt;" in label for label in labels), labels)

    def test_qualify_page_escapes_every_value(self):
        self.assert_escaped(qualify_evidence, "qualify", plots=3)

    def test_qualify_page_escapes_its_title(self):
        self.assert_escaped(lambda s: qualify_evidence(s, title=True), "titled", plots=3)

    def test_replay_page_escapes_every_value(self):
        self.assert_escaped(replay_report, "replay")

    def test_the_check_sees_an_unescaped_value(self):
        # The check's negative control: a page with one value left unescaped fails it.
        page = self.rendered(qualify_evidence(strings(False)), "control")
        bad = page.replace("<h2>", "<h2><img src=x onerror=1>", 1)
        self.assertTrue(report_fuzz.page_problems(bad, page))


class RobustnessTest(Base):
    def test_non_finite_and_huge_figures_are_drawn_or_noted(self):
        figures = [float("inf"), float("-inf"), float("nan"), "inf", "-inf", "nan", 10 ** 400,
                   -10 ** 400, "12", [1], None, True, {"a": 1}]
        recs = [{"index": i, "module": f"m{i}", "kind": "forward_output", "relative_l2": f,
                 "max_tolerance_ratio": f} for i, f in enumerate(figures)]
        evidence = {"checks": [
            {"name": "repeatability", "passed": False, "ranks": [{"evidence": {
                "records": recs, "first_divergence": {"module": "m1", "index": 1}}}]},
            {"name": "packing_invariance", "ranks": [{"evidence": {"placements": [
                {"name": "p", "microbatches": 10 ** 400, "differences_from_alone": [
                    {"first_module": "m", "figures": {"max_abs_diff": 10 ** 400}}]}]}}]}],
            "topology": {"dp": 10 ** 400, "tp": float("inf"), "cp": float("nan")}}
        page = self.rendered(evidence)
        self.assertGreaterEqual(page.count("<svg"), 2)
        self.assertIn("relative_l2", page)  # named: the figures that are not numbers
        self.assertIn("1" + "0" * 400, page)
        # Integers past Python's digit limit for int() read too.
        text = json.dumps(evidence).replace('"dp": 1' + "0" * 400, '"dp": 1' + "0" * 5000)
        self.rendered(text.encode(), "digits")

    def assert_noted(self, evidence, name, *notes):
        """The page of `evidence` is written and its notes name each of `notes`."""
        page = html.unescape(self.rendered(evidence, name))
        for note in notes:
            self.assertIn(note, page)

    def test_mistyped_qualify_fields_are_noted(self):
        rank_evidence = {"records": ["a", 1, None, [1], {"kind": ["forward_output"]}],
                         "first_divergence": "block1", "context_a": [1], "context_b": "x",
                         "operators": ["diverged"]}
        cases = {
            "checks": ({"checks": {"name": "actors"}}, "checks: an object, not a list"),
            "checks_items": ({"checks": ["actors", 1, None, [1]]},
                             "checks: 4 of 4 items are not objects"),
            "ranks": ({"checks": [{"name": "actors", "ranks": {"0": {}}}]},
                      "check actors: ranks: an object, not a list"),
            "rank0": ({"checks": [{"name": "actors", "ranks": ["a", 1, None]},
                                  {"name": "repeatability", "ranks": [None]}]},
                      "check actors: ranks[0]: a string, not an object",
                      "check repeatability: ranks[0]: null, not an object"),
            "evidence": ({"checks": [{"name": n, "ranks": [{"evidence": [1, 2]}]}
                                     for n in ("actors", "repeatability", "packing_invariance")]},
                         "check actors: ranks[0].evidence: a list, not an object",
                         "check packing_invariance: ranks[0].evidence: a list, not an object"),
            "records": ({"checks": [{"name": n, "ranks": [{"evidence": rank_evidence}]}
                                    for n in ("actors", "repeatability")]},
                        "repeatability: records: 4 of 5 items are not objects",
                        "actors: first_divergence: a string, not an object",
                        "actors: context_a: a list, not an object",
                        "actors: operators: a list, not an object"),
            "placements": ({"checks": [{"name": "packing_invariance", "ranks": [{"evidence": {
                "placements": ["p", {"differences_from_alone": "many"},
                               {"differences_from_alone": [1, {"figures": [1]}]}]}}]}]},
                           "packing_invariance: placements: 1 of 3 items are not objects",
                           "packing_invariance: differences_from_alone: a string, not a list"),
            "stable": ({"checks": [{"name": "actors", "ranks": [{"evidence": {
                "context_a": {"stable": [1]}, "context_b": {"stable": {"a": float("nan")}}}}]}]},
                       "actors: context_a.stable: a list, not an object"),
            "topology": ({"checks": [{"name": ["unhashable"]}, {"name": {"a": 1}}],
                          "topology": [1, 2], "errors": "one", "title": ["t"]},
                         "topology: a list, not an object", "errors: a string, not a list"),
        }
        for name, (evidence, *notes) in cases.items():
            with self.subTest(case=name):
                self.assert_noted(evidence, "case_" + name, *notes)

    def test_mistyped_replay_fields_are_noted(self):
        base = {"format": report.REPLAY_FORMAT, "verdict": "pass", "program": "train.py"}
        pair = "not a [first, last] pair"
        cases = {
            "verdict": ({"verdict": ["pass"], "program": {"a": 1}}, "? (exit None)"),
            "launches": ({"launches": 7}, "launches: a number, not a list"),
            "launch_items": ({"launches": [None, "x", {"seconds": "long", "name": 1}]},
                             "launches: 2 of 3 items are not objects", "<td>long</td>"),
            "comparisons": ({"comparisons": {"a": 1}}, "comparisons: an object, not a list"),
            "comparison_items": ({"comparisons": ["x", {}]},
                                 "comparisons: 1 of 2 items are not objects"),
            "steps": ({"comparisons": [{"steps": [1, 2, 3]}]}, "steps: a list, " + pair),
            "steps_text": ({"comparisons": [{"steps": "1..2"}]}, "steps: a string, " + pair),
            "steps_null": ({"comparisons": [{"steps": None}]}, "steps: null, " + pair),
            "difference": ({"comparisons": [{"first_difference": [1]}]},
                           "first_difference: a list, not an object"),
            "paths": ({"comparisons": [{"first_difference": {"differing_paths": 5}}]},
                      "differing_paths: a number, not a list"),
            "path_items": ({"comparisons": [{"first_difference": {
                "differing_paths": [1, None, {"a": 1}]}}]}, "<td>1, None, {'a': 1}</td>"),
            "paths_text": ({"comparisons": [{"first_difference": {"differing_paths": "abc"}}]},
                           "differing_paths: a string, not a list"),
        }
        for name, (fields, *notes) in cases.items():
            with self.subTest(case=name):
                self.assert_noted(dict(base, **fields), "replay_" + name, *notes)

    def test_unreadable_evidence_exits_2_naming_the_path(self):
        out = os.path.join(self.work, "out")
        cases = {"missing": None, "not_json": b"{not json", "empty": b"",
                 "deep": b"[" * 100000 + b"]" * 100000,
                 "deep_object": b'{"checks": ' + b"[" * 300 + b"]" * 300 + b"}",
                 "a_list": b"[1, 2]", "no_checks": b'{"not": "evidence"}', "a_number": b"1"}
        for name, content in cases.items():
            with self.subTest(case=name):
                path = os.path.join(self.work, name + ".json")
                if content is not None:
                    with open(path, "wb") as f:
                        f.write(content)
                self.refused([path, out], path)
                self.assertFalse(os.path.exists(os.path.join(out, "index.html")))
        self.refused([self.work, out], self.work)  # a folder, not a file

    def test_non_utf8_evidence_is_rendered_with_a_note(self):
        page = self.rendered(b'{"checks": [{"name": "a\xff\xfeb", "ranks": []}], '
                             b'"title": "t\\ud800"}')
        self.assertIn("not UTF-8", page)
        self.assertIn("a\ufffd\ufffdb", page)

    def test_an_output_that_is_a_file_exits_2(self):
        path = os.path.join(self.work, "evidence.json")
        with open(path, "w") as f:
            json.dump({"checks": []}, f)
        out = os.path.join(self.work, "file")
        open(out, "w").close()
        self.refused([path, out], out)

    def test_usage_exits_2(self):
        for args in ([], ["one"], ["a", "b", "c"]):
            rc, _, err = run_main(*args)
            self.assertEqual(rc, 2, err)

    def test_the_tool_prints_no_traceback(self):
        deep = os.path.join(self.work, "deep.json")
        with open(deep, "wb") as f:
            f.write(b"[" * 100000 + b"]" * 100000)
        outfile = os.path.join(self.work, "outfile")
        open(outfile, "w").close()
        good = os.path.join(self.work, "good.json")
        with open(good, "w") as f:
            json.dump({"checks": []}, f)
        for args, named in (([deep, os.path.join(self.work, "o")], deep),
                            ([good, outfile], outfile)):
            done = subprocess.run([sys.executable, REPORT, *args], capture_output=True,
                                  text=True, timeout=120)
            self.assertEqual(done.returncode, 2, done.stderr)
            self.assertNotIn("Traceback", done.stderr)
            self.assertEqual(len(done.stderr.strip().splitlines()), 1, done.stderr)
            self.assertIn(named, done.stderr)

    def test_a_section_that_fails_becomes_a_note(self):
        # Evidence nobody foresaw: outside the tests (STRICT) the rest of the page is written.
        report.STRICT = False
        broken = report.placements_parts
        report.placements_parts = lambda *args: 1 / 0
        try:
            page = self.rendered({"checks": [{"name": "packing_invariance", "ranks": []}]})
        finally:
            report.placements_parts = broken
        self.assertIn("ZeroDivisionError", page)


# Runs report.py with `import matplotlib` failing, as on a machine without it.
WITHOUT_MATPLOTLIB = """
import importlib.abc, runpy, sys
class NoMatplotlib(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib' (hidden by the test)")
        return None
sys.meta_path.insert(0, NoMatplotlib())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


class WithoutMatplotlibTest(Base):
    def test_the_page_is_written_with_a_note_per_plot(self):
        path = os.path.join(self.work, "evidence.json")
        with open(path, "w") as f:
            json.dump(qualify_evidence(strings(False)), f)
        out = os.path.join(self.work, "out")
        done = subprocess.run([sys.executable, "-c", WITHOUT_MATPLOTLIB, REPORT, path, out],
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        warning = [line for line in done.stderr.splitlines() if "matplotlib" in line]
        self.assertEqual(len(warning), 1, done.stderr)
        self.assertNotIn("Traceback", done.stderr)
        page = read(os.path.join(out, "index.html"))
        self.assertEqual(page.count("plot not drawn: matplotlib is not installed"), 3)
        self.assertNotIn("<svg", page)
        self.assertIn("first divergence: x", page)


class WriterTest(Base):
    def setUp(self):
        super().setUp()
        self.evidence = os.path.join(self.work, "evidence.json")
        with open(self.evidence, "w") as f:
            json.dump({"checks": [], "title": "written"}, f)
        self.victim = os.path.join(self.work, "victim")
        with open(self.victim, "w") as f:
            f.write("keep")
        self.out = os.path.join(self.work, "out")
        os.mkdir(self.out)

    def test_a_planted_temporary_is_not_written_through(self):
        os.symlink(self.victim, os.path.join(self.out, "index.html.tmp"))
        rc, _, err = run_main(self.evidence, self.out)
        self.assertEqual(rc, 0, err)
        self.assertEqual(read(self.victim), "keep")
        page = os.path.join(self.out, "index.html")
        self.assertFalse(os.path.islink(page))
        self.assertIn("written", read(page))
        self.assertEqual(sorted(os.listdir(self.out)), ["index.html", "index.html.tmp"])

    def test_a_page_that_is_a_link_is_refused(self):
        page = os.path.join(self.out, "index.html")
        os.symlink(self.victim, page)
        self.refused([self.evidence, self.out], page)
        self.assertEqual(read(self.victim), "keep")
        self.assertTrue(os.path.islink(page))
        self.assertEqual(os.listdir(self.out), ["index.html"])  # no temporary left

    def test_the_page_mode_follows_the_umask(self):
        old = os.umask(0o027)
        try:
            rc, _, err = run_main(self.evidence, self.out)
        finally:
            os.umask(old)
        self.assertEqual(rc, 0, err)
        self.assertEqual(os.stat(os.path.join(self.out, "index.html")).st_mode & 0o777, 0o640)


if __name__ == "__main__":
    unittest.main(verbosity=2)
