#!/usr/bin/env bash
# The report of a real qualify run (under the nondeterministic-op control, so that it has a first
# divergence to mark) renders in headless Chromium without errors, and its screenshot shows the
# plots (report/report_test.py); the report tool gives the same page from the evidence; and the
# fuzz target's fixed examples pass (report/report_fuzz.py).
set -euo pipefail
tmp=${TEST_TMPDIR:-$(mktemp -d)}
export MPLCONFIGDIR="$tmp/matplotlib"  # the sandbox's HOME is not writable
set +e
tools/qualify --dp=1 --tp=1 --cp=2 --negative_control=nondeterministic-op --report="$tmp/qualify" \
  >"$tmp/qualify.txt" 2>&1
rc=$?
set -e
cat "$tmp/qualify.txt"
[[ $rc == 1 ]] || { echo "qualify under nondeterministic-op exited $rc, expected 1"; exit 1; }
grep -q "^report: $tmp/qualify/index.html" "$tmp/qualify.txt" || { echo "qualify did not say where the report is"; exit 1; }
report/report "$tmp/qualify/evidence.json" "$tmp/tool"
cmp "$tmp/qualify/index.html" "$tmp/tool/index.html" || { echo "the report tool and qualify --report differ"; exit 1; }

# Bad input: exit 2 naming the file, nothing written.
echo '{"not": "evidence"}' >"$tmp/bogus.json"
set +e
report/report "$tmp/bogus.json" "$tmp/bogus" 2>"$tmp/bogus.txt"
rc=$?
set -e
[[ $rc == 2 ]] || { echo "report of bogus evidence exited $rc, expected 2"; exit 1; }
grep -q "bogus.json is neither qualify's evidence" "$tmp/bogus.txt" || { cat "$tmp/bogus.txt"; exit 1; }
[[ ! -e "$tmp/bogus/index.html" ]] || { echo "a page was written for bogus evidence"; exit 1; }

/usr/bin/python3 report/report_test.py "$tmp/qualify/index.html" "$tmp"
# The fuzz target's fixed examples (tools/fuzz.sh runs it for longer).
/usr/bin/python3 report/report_fuzz.py --quick
echo "report test: ok"
