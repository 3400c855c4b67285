# testing/shell/expect.sh — assertions for the tools' shell tests. Source it after setting $tmp
# (a scratch directory) in a test with `set -euo pipefail`:
#
#   expect WANT CMD...       runs CMD (bounded by $EXPECT_TIMEOUT seconds, default 120), its
#                            output in $tmp/out.txt and $tmp/err.txt; fails the test unless it
#                            exits WANT, printing both
#   says TEXT                fails the test unless the last expect's output contains TEXT
#   json_check FILE EXPR     fails the test unless the Python expression EXPR holds, with `j` the
#                            JSON document FILE holds

expect() {
  local want=$1
  shift
  set +e
  timeout "${EXPECT_TIMEOUT:-120}" "$@" >"$tmp/out.txt" 2>"$tmp/err.txt"
  local rc=$?
  set -e
  [[ $rc == "$want" ]] || { echo "$* exited $rc, expected $want"; cat "$tmp/out.txt" "$tmp/err.txt"; exit 1; }
}

says() {
  grep -qF -- "$1" "$tmp/out.txt" "$tmp/err.txt" || {
    echo "the output does not say '$1':"; cat "$tmp/out.txt" "$tmp/err.txt"; exit 1; }
}

json_check() {
  /usr/bin/python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert $2, j" "$1" \
    || { echo "JSON check failed: $2"; exit 1; }
}
