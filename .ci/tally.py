#!/usr/bin/env python3
"""CI's count of tests (.ci/run): each check's result as one line "STATUS<TAB>NAME<TAB>WHY",
STATUS one of PASSED, FAILED, NOT RUN, collected in one file, and the closing summary.

  tally.py bazel WHERE LOG TESTLOGS RC   a `bazel test` run: each test of its summary (LOG, its
                                         output), PASSED read again under TESTLOGS (the run's
                                         bazel-testlogs); RC its exit status; WHERE names the
                                         workspace ("" for lockstep's own)
  tally.py lines PREFIX RC LOG [ANNOUNCED]
                                         a script that prints "PREFIX: NAME PASSED",
                                         "PREFIX: NAME FAILED[: why]" or "PREFIX: NAME NOT RUN: why"
                                         per check (LOG, its output; RC, its exit status);
                                         ANNOUNCED: a regular expression whose group 1, matched
                                         in LOG, is the number of checks it said it would report
  tally.py summary RESULTS               prints "not run: NAME — why" and "failed: NAME — why" for
                                         each such line of RESULTS, then "N passed, N failed, N not
                                         run"; exits 1 if any failed

The not-run convention (docs/building.md): a test that cannot run its subject, or part of it,
exits 0 (Bazel has no skip status) and says so: a line of its output that begins "NOT RUN: "
(shell tests, testing/netns/hosts.sh), or a skipped test case in its test.xml (GoogleTest's
GTEST_SKIP, pytest's skips: python/run_pytest.sh writes pytest's XML there). Such a test is
counted as not run, never as passed, whatever Bazel says; a test with any skipped case is not
run as a whole (its cases that ran are not counted apart).
"""

import glob
import os
import re
import sys
import xml.etree.ElementTree as ET

PASSED, FAILED, NOT_RUN = "PASSED", "FAILED", "NOT RUN"
# Bazel's summary: "//pkg:name   (cached) PASSED in 1.2s".
BAZEL_RESULT = re.compile(
    r"^(//\S+)\s+(?:\(cached\) )?(PASSED|FAILED|TIMEOUT|NO STATUS|FLAKY|INCOMPLETE|"
    r"REMOTE FAILURE|FAILED TO BUILD|SKIPPED)\b")
NOT_RUN_LINE = re.compile(r"^NOT RUN: (.*)$")


def emit(status, name, why=""):
    why = " ".join(why.split())  # one line
    print(f"{status}\t{name}\t{why}")


def skipped_cases(xml_path):
    """(skipped "Suite.case: message" list, number of cases) of a JUnit-style test.xml."""
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        return [], 0
    skipped, cases = [], 0
    for case in root.iter("testcase"):
        cases += 1
        skip = case.find("skipped")
        if skip is None and case.get("result") != "skipped":
            continue
        # GoogleTest's message is "file:line\nwhy": joined as "file:line: why".
        message = (skip.get("message") if skip is not None else "") or ""
        message = ": ".join(l.strip() for l in message.strip().splitlines()) or "skipped"
        name = ".".join(n for n in (case.get("classname"), case.get("name")) if n)
        skipped.append(f"{name}: {message}")
    return skipped, cases


def not_run_reason(target_dir):
    """Why a test Bazel reports PASSED did not run its subject, or None if it did."""
    logs = sorted(glob.glob(os.path.join(target_dir, "test.log")) +
                  glob.glob(os.path.join(target_dir, "shard_*_of_*", "test.log")))
    if not logs:
        return f"no test.log under {target_dir} to tell whether it ran"
    reasons = []
    for log in logs:
        with open(log, errors="replace") as f:
            for line in f:
                m = NOT_RUN_LINE.match(line.rstrip("\n"))
                if m:
                    reasons.append(m.group(1))
        skipped, cases = skipped_cases(os.path.join(os.path.dirname(log), "test.xml"))
        if skipped:
            reasons.append(f"{len(skipped)} of {cases} cases skipped: " + "; ".join(skipped))
    return "; ".join(reasons) if reasons else None


def tally_bazel(where, log, testlogs, rc):
    suffix = f" ({where})" if where else ""
    failed = 0
    with open(log, errors="replace") as f:
        lines = f.read().splitlines()
    for line in lines:
        m = BAZEL_RESULT.match(line)
        if not m:
            continue
        label, status = m.group(1), m.group(2)
        name = label + suffix
        if status == "PASSED":
            path = label[2:].replace(":", "/")
            reason = not_run_reason(os.path.join(testlogs, path))
            if reason:
                emit(NOT_RUN, name, reason)
            else:
                emit(PASSED, name)
        elif status == "SKIPPED":
            emit(NOT_RUN, name, "Bazel skipped it (not built for this configuration)")
        else:
            failed += 1
            emit(FAILED, name, f"Bazel: {status}")
    # A build error stops Bazel before it reports tests.
    if rc != 0 and failed == 0:
        emit(FAILED, f"bazel test{suffix}", f"exit {rc} with no failing test named (a build error?)")


def tally_lines(prefix, rc, log, announced=None):
    pattern = re.compile(r"^" + re.escape(prefix) + r": (\S+) (PASSED|FAILED|NOT RUN)\b(.*)$")
    with open(log, errors="replace") as f:
        text = f.read()
    results = []
    for line in text.splitlines():
        m = pattern.match(line)
        if m:
            name, status, why = m.groups()
            why = why.strip()  # ": why", " (why)" or nothing
            if why.startswith(":"):
                why = why[1:].strip()
            elif why.startswith("(") and why.endswith(")"):
                why = why[1:-1]
            results.append((name, status, why))
    for name, status, why in results:
        emit(status, f"{name} ({prefix})", why)
    failed = sum(1 for r in results if r[1] == FAILED)
    if announced:
        m = re.search(announced, text, re.M)
        expected = int(m.group(1)) if m else None
        if expected is None:
            emit(FAILED, prefix, f"exit {rc} before it said how many checks it would run")
            failed += 1
        elif expected > len(results):
            emit(FAILED, prefix, f"{expected - len(results)} of {expected} checks reported nothing")
            failed += 1
    if not results and failed == 0:
        emit(FAILED, prefix, f"exit {rc}, no check reported")
    elif rc != 0 and failed == 0:
        emit(FAILED, prefix, f"exit {rc} with no failing check named")


def summary(results):
    counts = {PASSED: 0, FAILED: 0, NOT_RUN: 0}
    listed = []
    with open(results) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 2 or parts[0] not in counts:
                continue
            status, name, why = parts[0], parts[1], parts[2] if len(parts) > 2 else ""
            counts[status] += 1
            if status != PASSED:
                listed.append((status, name, why))
    for wanted in (NOT_RUN, FAILED):
        for status, name, why in listed:
            if status == wanted:
                print(f"{status.lower()}: {name}" + (f" — {why}" if why else ""))
    print(f"{counts[PASSED]} passed, {counts[FAILED]} failed, {counts[NOT_RUN]} not run")
    return 1 if counts[FAILED] else 0


def main(argv):
    if len(argv) >= 6 and argv[1] == "bazel":
        tally_bazel(argv[2], argv[3], argv[4], int(argv[5]))
        return 0
    if len(argv) in (5, 6) and argv[1] == "lines":
        tally_lines(argv[2], int(argv[3]), argv[4], argv[5] if len(argv) == 6 else None)
        return 0
    if len(argv) == 3 and argv[1] == "summary":
        return summary(argv[2])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
