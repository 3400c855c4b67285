#!/usr/bin/env bash
# compare, inventory and diverge as a user runs them on hostile files and outputs: each case is a
# class of defect an outside probe found (a crash, a hang, a file replaced or lost). A tool must
# end with exit 2 (bad input) and a message naming what is wrong, never a signal, an uncaught
# exception, a hang or a "0 bytes" report; what it writes replaces regular files atomically and
# writes through everything else.
set -euo pipefail
compare=tools/compare
inventory=tools/inventory
diverge=tools/diverge
tmp=${TEST_TMPDIR:-$(mktemp -d)}

/usr/bin/python3 - "$tmp" <<'PY'
import json, struct, sys
d = sys.argv[1]
def raw(path, header_text, buf=b""):
    text = header_text.encode() if isinstance(header_text, str) else header_text
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + buf)
def write(path, tensors, metadata=None):
    header, buf = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(buf), len(buf) + len(data)]}
        buf += data
    raw(path, json.dumps(header), buf)
w = ("w", "F32", [4], struct.pack("<4f", 1, 2, 3, 4))
write(d + "/a.safetensors", [w])
# 200 KB of brackets in a tensor's shape: nlohmann's recursive walks overflowed the stack.
raw(d + "/deep_header.safetensors",
    '{"w":{"dtype":"F32","shape":' + "[" * 100000 + "]" * 100000 + ',"data_offsets":[0,0]}}')
# The same inside lockstep's own metadata (a recording's records).
write(d + "/deep_recording.rec", [w], {"lockstep.recording": "[" * 100000 + "]" * 100000})
# A metadata field of the wrong JSON type: a record whose index is a string.
write(d + "/wrong_type.rec", [w], {"lockstep.recording": json.dumps(
    [{"index": "zero", "module": "m", "kind": "forward", "dtype": "float32", "shape": [4]}])})
# A recording whose record says "kept" as a string (nlohmann's value() threw: an abort).
write(d + "/kept_string.rec", [w], {"lockstep.recording": json.dumps(
    [{"index": 0, "module": "m", "kind": "forward_output", "dtype": "float32", "shape": [4],
      "digest": "0" * 32, "summary": {"sum": 0, "mean_abs": 0, "min": 0, "max": 0, "l2": 0},
      "kept": "yes"}])})
# Operator recordings with a header of the wrong type, a version past 32 bits (read as 1 when
# truncated to an int), and one line longer than any record.
for name, header in [("rank_string", {"lockstep.operator_recording": 1, "rank": "zero"}),
                     ("version_wide", {"lockstep.operator_recording": 2**32 + 1, "rank": 0})]:
    open(f"{d}/{name}.ops", "w").write(json.dumps(header) + "\n")
open(d + "/long_line.ops", "w").write(
    json.dumps({"lockstep.operator_recording": 1, "rank": 0}) + "\n" + "[" * (17 << 20) + "\n")
# 200,000 tensors: header parsing was quadratic (20,000 took 16 s, so this one would take about
# half an hour, past the test's timeout); linear parsing takes seconds.
n = 200000
header = {"t%06d" % i: {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i in range(n)}
raw(d + "/many.safetensors", json.dumps(header), bytes(i % 256 for i in range(n)))
PY

source testing/shell/expect.sh

# Deep nesting: refused with the depth named, not a stack overflow.
expect 2 "$compare" "$tmp/deep_header.safetensors" "$tmp/a.safetensors"
says "nest"
expect 2 "$inventory" "$tmp/deep_header.safetensors"
says "nest"
expect 2 "$diverge" "$tmp/deep_recording.rec" "$tmp/deep_recording.rec"
says "nest"
# A field of the wrong type: an error naming the field, not an uncaught exception.
expect 2 "$diverge" "$tmp/wrong_type.rec" "$tmp/wrong_type.rec"
says "index"

expect 2 "$diverge" "$tmp/kept_string.rec" "$tmp/kept_string.rec"
says "kept"
expect 2 "$diverge" "$tmp/rank_string.ops" "$tmp/rank_string.ops"
says "rank"
expect 2 "$diverge" "$tmp/version_wide.ops" "$tmp/version_wide.ops"
says "format version 4294967297"
expect 2 "$diverge" "$tmp/long_line.ops" "$tmp/long_line.ops"
says "exceeds the limit"

# Many tensors: read whole, in linear time (the test's timeout is the bound).
expect 0 "$inventory" "$tmp/many.safetensors" --out="$tmp/many.json"
json_check "$tmp/many.json" "j['files'][0]['tensors'] == 200000"
expect 0 "$compare" "$tmp/many.safetensors" "$tmp/many.safetensors"

# Inputs that are not regular files: refused before a read can block, never "0 bytes".
mkfifo "$tmp/fifo"
expect 2 "$compare" "$tmp/fifo" "$tmp/a.safetensors"
says "not a regular file"
EXPECT_TIMEOUT=20 expect 2 "$diverge" "$tmp/fifo" "$tmp/a.safetensors"
says "not a regular file"
expect 2 "$inventory" "$tmp/fifo"
says "not a regular file"
for special in /dev/zero /proc/self/status; do
  expect 2 "$inventory" "$special"
  says "not a regular file"
done
expect 2 "$inventory" "$tmp"
says "not a regular file"

# A file name that is not UTF-8 (Linux paths are bytes): read, and written into the JSON escaped.
odd=$'\xff\xfe.safetensors'
cp "$tmp/a.safetensors" "$tmp/$odd"
expect 0 "$inventory" "$tmp/$odd" --out="$tmp/odd.json"
json_check "$tmp/odd.json" "j['files'][0]['path'].endswith('\\\\xff\\\\xfe.safetensors')"
expect 0 "$compare" "$tmp/$odd" "$tmp/a.safetensors" --out="$tmp/odd_compare.json"
json_check "$tmp/odd_compare.json" "j['comparison']['all_passed'] and j['inputs'][0]['path'].endswith('\\\\xff\\\\xfe.safetensors')"

# Outputs. A FIFO is written into, and stays a FIFO.
mkfifo "$tmp/out_fifo"
cat "$tmp/out_fifo" >"$tmp/from_fifo.json" &
reader=$!
expect 0 "$inventory" "$tmp/a.safetensors" --out="$tmp/out_fifo"
wait "$reader"
[[ -p $tmp/out_fifo ]] || { echo "the output FIFO was replaced"; exit 1; }
json_check "$tmp/from_fifo.json" "j['files'][0]['entries'][0]['name'] == 'w'"
# A symlink (another user's, planted in a shared folder) is refused before any work: the link
# stays and its target is untouched (Note [Outputs through links]).
echo "old" >"$tmp/target.json"
ln -s target.json "$tmp/link.json"
expect 2 "$inventory" "$tmp/a.safetensors" --out="$tmp/link.json"
says "symbolic link"
[[ -L $tmp/link.json ]] || { echo "the output symlink was replaced by a file"; exit 1; }
[[ $(cat "$tmp/target.json") == old ]] || { echo "the link's target was written"; exit 1; }
# A name of 250 bytes (NAME_MAX is 255) is writable: the temporary beside it fits.
long=$(printf 'n%.0s' {1..245}).json
expect 0 "$inventory" "$tmp/a.safetensors" --out="$tmp/$long"
json_check "$tmp/$long" "j['files'][0]['entries'][0]['name'] == 'w'"
[[ $(find "$tmp" -maxdepth 1 -name '*.tmp*' | wc -l) == 0 ]] || { echo "a temporary was left"; exit 1; }
# A full device: an error naming it, and the device stays a device.
expect 2 "$inventory" "$tmp/a.safetensors" --out=/dev/full
says "/dev/full"
[[ -c /dev/full ]] || { echo "/dev/full was replaced"; exit 1; }
# ... found before the inputs are read (a FIFO input would otherwise be named first).
for tool in "$diverge" "$compare"; do
  EXPECT_TIMEOUT=20 expect 2 "$tool" "$tmp/fifo" "$tmp/fifo" --out=/dev/full
  says "/dev/full"
done
# An output that cannot be written is found before any work: nothing is created.
expect 2 "$inventory" "$tmp/a.safetensors" --out="$tmp/no/such/dir/inv.json"
[[ ! -e $tmp/no ]] || { echo "something was created under the output's path"; exit 1; }
echo "every hostile input and output was handled"
