#!/usr/bin/env bash
# Builds lockstep's API reference with Doxygen (docs/Doxyfile) from the public headers: the hdrs
# of every //visibility:public, non-testonly target of the top-level packages' BUILD files
# (third_party's stand-ins aside), less generated .pb.h files and headers under internal/. An
# undocumented public declaration, or a malformed comment, is a warning, and any warning fails.
#   tools/apidocs.sh                      check only: build into a temporary directory, removed
#   tools/apidocs.sh OUT_DIR              keep the reference: open OUT_DIR/html/index.html
#   tools/apidocs.sh OUT_DIR|- PACKAGE... only these packages' headers (- : a temporary directory)
# Prints the warnings (file:line: message) and exits 1 when there are any; otherwise prints
# "apidocs: N headers, 0 warnings".
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"
  exit 0
fi

out=${1:--}
[[ $# -gt 0 ]] && shift
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
if [[ $out == - ]]; then
  out=$scratch/out
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)  # OUT_DIR relative to where the script was called from
cd "$(dirname "$0")/.."
root=$PWD

command -v doxygen >/dev/null || { echo "apidocs: doxygen is not installed (./setup.sh)" >&2; exit 1; }

# The public headers, read from the BUILD files (Starlark parses as Python): a target counts
# when its visibility (or the package's default_visibility) is //visibility:public and it is not
# testonly. A package named on the command line without a BUILD file is skipped with a note, so
# a package that has not landed yet costs nothing.
header_list=$(python3 - "$@" <<'EOF'
import ast, glob, os, sys

PUBLIC = "//visibility:public"

def evaluate(node, package):
    """A BUILD expression of strings: lists, +, glob() and select() (every branch)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [v for e in node.elts for v in evaluate(e, package)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return evaluate(node.left, package) + evaluate(node.right, package)
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "glob":
        kw = {k.arg: k.value for k in node.keywords}
        include = evaluate(node.args[0] if node.args else kw["include"], package)
        exclude = set(evaluate(kw["exclude"], package)) if "exclude" in kw else set()
        found = set()
        for pattern in include:
            for path in glob.glob(os.path.join(package, pattern), recursive=True):
                found.add(os.path.relpath(path, package))
        return sorted(found - exclude)
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "select":
        return [v for branch in node.args[0].values for v in evaluate(branch, package)]
    sys.exit("apidocs: %s/BUILD:%d: cannot read this hdrs expression" % (package, node.lineno))

if len(sys.argv) > 1:
    packages = sys.argv[1:]
else:
    packages = sorted(os.path.dirname(b) for b in glob.glob("*/BUILD"))
    packages = [p for p in packages if p != "third_party"]
headers = []
for package in packages:
    build = os.path.join(package, "BUILD")
    if not os.path.isfile(build):
        print("apidocs: no %s, skipped" % build, file=sys.stderr)
        continue
    default_public = False
    for statement in ast.parse(open(build).read(), build).body:
        if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)):
            continue
        call = statement.value
        kw = {k.arg: k.value for k in call.keywords if k.arg}
        if getattr(call.func, "id", None) == "package":
            if "default_visibility" in kw:
                default_public = PUBLIC in evaluate(kw["default_visibility"], package)
            continue
        if "hdrs" not in kw:
            continue
        visibility = evaluate(kw["visibility"], package) if "visibility" in kw else None
        public = PUBLIC in visibility if visibility is not None else default_public
        testonly = isinstance(kw.get("testonly"), ast.Constant) and kw["testonly"].value
        if not public or testonly:
            continue
        for header in evaluate(kw["hdrs"], package):
            if header.startswith(":") or header.startswith("//"):
                continue  # a generated file's label (a .pb.h)
            if header.endswith(".pb.h") or header.startswith("internal/") or "/internal/" in header:
                continue
            headers.append(os.path.join(package, header))
for header in sorted(set(headers)):
    print(header)
EOF
)
headers=()
[[ -z $header_list ]] || mapfile -t headers <<<"$header_list"
if [[ ${#headers[@]} == 0 ]]; then
  echo "apidocs: no public headers in ${*:-any package}" >&2
  exit 1
fi

warnings=$scratch/warnings.txt
: >"$warnings"
rc=0
APIDOCS_ROOT=$root APIDOCS_OUT=$out APIDOCS_INPUT="${headers[*]}" APIDOCS_WARNINGS=$warnings \
  doxygen docs/Doxyfile >"$scratch/doxygen.log" 2>&1 || rc=$?
# Paths relative to the repository root ("base/subprocess.h:88: error: Member ..."; WARN_AS_ERROR
# makes Doxygen call its warnings errors).
sed -i "s|$root/||g" "$warnings"
count=$(grep -cE '(warning|error): ' "$warnings" || true)
if [[ $rc != 0 || $count != 0 ]]; then
  cat "$warnings" "$scratch/doxygen.log"
  echo "apidocs: ${#headers[@]} headers, $count warnings"
  exit 1
fi
echo "apidocs: ${#headers[@]} headers, 0 warnings"
