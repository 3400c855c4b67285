#!/usr/bin/env bash
# compare and inventory end to end on files written independently (Python standard library).
set -euo pipefail
compare=tools/compare
inventory=tools/inventory
tmp=${TEST_TMPDIR:-$(mktemp -d)}

/usr/bin/python3 - "$tmp" <<'PY'
import json, struct, sys
def write(path, tensors):
    header, buf = {}, b""
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(buf), len(buf) + len(data)]}
        buf += data
    text = json.dumps(header).encode()
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + buf)
d = sys.argv[1]
b = ("b", "F64", [2], struct.pack("<2d", 0.5, -0.5))
write(d + "/a.safetensors", [("w", "F32", [4], struct.pack("<4f", 1, 2, 3, 4)), b])
write(d + "/same.safetensors", [b, ("w", "F32", [4], struct.pack("<4f", 1, 2, 3, 4))])
write(d + "/close.safetensors", [("w", "F32", [4], struct.pack("<4f", 1, 2, 3.01, 4)), b])
write(d + "/far.safetensors", [("w", "F32", [4], struct.pack("<4f", 1, 2, 4, 4)), b])
write(d + "/extra.safetensors", [("w", "F32", [4], struct.pack("<4f", 1, 2, 3, 4)), b,
                                 ("x", "I8", [1], b"\x01")])
raw = open(d + "/a.safetensors", "rb").read()
open(d + "/cut.safetensors", "wb").write(raw[:-3])
PY

source testing/shell/expect.sh

# compare
expect 0 "$compare" "$tmp/a.safetensors" "$tmp/same.safetensors" --out="$tmp/same.json"
json_check "$tmp/same.json" 'j["tool"] == "compare" and j["comparison"]["all_passed"] and j["comparison"]["passed"] == 2'
json_check "$tmp/same.json" 'j["inputs"][0]["state_digest"] == j["inputs"][1]["state_digest"] and len(j["inputs"][0]["state_digest"]) == 32'
json_check "$tmp/same.json" '"digest" in j["context"] and "stable" in j["context"]'
expect 0 "$compare" "$tmp/close.safetensors" "$tmp/a.safetensors"
expect 1 "$compare" "$tmp/close.safetensors" "$tmp/a.safetensors" --bitwise --out="$tmp/bitwise.json"
json_check "$tmp/bitwise.json" 'j["comparison"]["tolerance"]["bitwise"] and not j["comparison"]["all_passed"]'
expect 1 "$compare" "$tmp/far.safetensors" "$tmp/a.safetensors" --out="$tmp/far.json"
grep -q "^w  *FAIL  *1/4 " "$tmp/out.txt" || { cat "$tmp/out.txt"; echo "no failing row for w"; exit 1; }
json_check "$tmp/far.json" '[t for t in j["comparison"]["tensors"] if t["name"] == "w"][0]["first_offending_index"] == [2]'
json_check "$tmp/far.json" 'j["comparison"]["worst_by_tolerance_ratio"][0] == "w"'
expect 1 "$compare" "$tmp/extra.safetensors" "$tmp/a.safetensors" --out="$tmp/extra.json"
json_check "$tmp/extra.json" '[t["outcome"] for t in j["comparison"]["tensors"] if t["name"] == "x"] == ["extra"]'
# A loose enough tolerance passes; flag names have one spelling (snake_case): hyphens are refused.
expect 0 "$compare" "$tmp/far.safetensors" "$tmp/a.safetensors" --atol=1e9 --rel_l2=1e9 --nan_equal
expect 2 "$compare" "$tmp/far.safetensors" "$tmp/a.safetensors" --atol=1e9 --rel-l2=1e9
grep -q "use --rel_l2, not --rel-l2" "$tmp/err.txt" || { cat "$tmp/err.txt"; echo "no spelling hint"; exit 1; }
expect 2 "$compare" "$tmp/cut.safetensors" "$tmp/a.safetensors"
[[ $(wc -l <"$tmp/err.txt") == 1 ]] && grep -q "cut.safetensors: not a valid safetensors file" "$tmp/err.txt" \
  || { cat "$tmp/err.txt"; echo "corrupt input: not one clear line"; exit 1; }
expect 2 "$compare" "$tmp/missing.safetensors" "$tmp/a.safetensors"
grep -q "missing.safetensors" "$tmp/err.txt"
expect 2 "$compare" "$tmp/a.safetensors"
expect 2 "$compare" "$tmp/a.safetensors" "$tmp/a.safetensors" --atol=-1
grep -q "atol is -1" "$tmp/err.txt"

# inventory
expect 0 "$inventory" "$tmp/a.safetensors" --out="$tmp/inv.json"
json_check "$tmp/inv.json" 'j["files"][0]["digest_version"] == 1 and j["files"][0]["tensors"] == 2'
json_check "$tmp/inv.json" 'sorted(e["name"] for e in j["files"][0]["entries"]) == ["b", "w"]'
reference=$(/usr/bin/python3 numerics/digest_reference.py "$tmp/a.safetensors")
/usr/bin/python3 -c "import json,sys; a=json.load(open(sys.argv[1])); r=json.loads(sys.argv[2]); assert a['files'][0]['state_digest'] == r['state_digest'], (a, r)" \
  "$tmp/inv.json" "$reference" || { echo "inventory's digest differs from the Python reference"; exit 1; }
expect 0 "$inventory" "$tmp/a.safetensors" "$tmp/same.safetensors" --out="$tmp/inv2.json"
grep -q "^IDENTICAL states" "$tmp/out.txt"
json_check "$tmp/inv2.json" 'j["identical"] and j["differences"] == []'
expect 1 "$inventory" "$tmp/a.safetensors" "$tmp/extra.safetensors" --out="$tmp/inv3.json"
json_check "$tmp/inv3.json" 'not j["identical"] and j["differences"] == [{"name": "x", "what": "only in B"}]'
expect 1 "$inventory" "$tmp/a.safetensors" "$tmp/close.safetensors"
grep -q "w: digest " "$tmp/out.txt"
expect 2 "$inventory" "$tmp/cut.safetensors"
expect 2 "$inventory"
expect 2 "$inventory" "$tmp/a.safetensors" --out=
echo "evidence tools test: ok"
