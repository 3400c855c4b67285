"""Checks a lockstep wheel before anyone installs it: every problem found is printed, and the
exit status is 1 if there is any.

    python3 check_wheel.py dist/lockstep-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl

What it holds a wheel to:
  - RECORD lists every file with its SHA-256 and size, and nothing that is not there;
  - the WHEEL file's tag is the file name's;
  - every ELF file (the extension, lockstep's module libraries, the tools, the libraries
    vendored into lockstep/_libs) has only run paths relative to itself ($ORIGIN...), none
    naming a build tree or any absolute folder, and each library it needs is either in the wheel
    or one the platform and torch provide (elf.PROVIDED);
  - the platform tag (manylinux_2_N) claims no older glibc than the newest its files need;
  - METADATA requires torch at one release (==X.Y.Z.*), and each console command names a
    function of lockstep/_tools.py, whose C++ programs are in lockstep/bin.
"""

import ast
import base64
import csv
import hashlib
import io
import os
import re
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import elf  # noqa: E402

WHEEL_NAME = re.compile(r"^(?P<name>[A-Za-z0-9_]+)-(?P<version>[^-]+)-(?P<tag>[^-]+-[^-]+-[^-]+)"
                        r"\.whl$")


def _record_problems(z, record_path):
    problems = []
    listed = {}
    for row in csv.reader(io.TextIOWrapper(z.open(record_path), encoding="utf-8")):
        if row:
            listed[row[0]] = row[1:]
    for name in z.namelist():
        if name.endswith("/") or name == record_path:
            continue
        if name not in listed:
            problems.append(f"{name}: not in RECORD")
            continue
        digest, size = listed.pop(name)
        data = z.read(name)
        want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(
            b"=").decode()
        if digest != want or size != str(len(data)):
            problems.append(f"{name}: RECORD says {digest} {size}, the file is {want} {len(data)}")
    listed.pop(record_path, None)
    problems += [f"{name}: in RECORD but not in the wheel" for name in listed]
    return problems


def _elf_problems(root, names):
    problems = []
    shipped = {os.path.basename(n) for n in names}
    newest = (2, 0)
    for name in names:
        path = os.path.join(root, name)
        if os.path.isdir(path) or not elf.is_elf(path):
            continue
        for entry in elf.run_paths(path):
            if not entry.startswith("$ORIGIN"):
                problems.append(f"{name}: run path '{entry}' is not relative to the file "
                                f"($ORIGIN): it names a folder of the machine that built it")
                continue
            where = os.path.normpath(os.path.join(os.path.dirname(path), entry[len("$ORIGIN"):]
                                                  .lstrip("/")))
            if not where.startswith(os.path.normpath(root)):
                problems.append(f"{name}: run path '{entry}' leaves the wheel")
        for soname in elf.needed(path):
            if not elf.PROVIDED.match(soname) and soname not in shipped:
                problems.append(f"{name}: needs {soname}, which is neither in the wheel nor "
                                f"provided by the platform or torch")
        newest = max(newest, elf.glibc_needed(path))
    return problems, newest


def _metadata_problems(z, info, root):
    problems = []
    metadata = z.read(f"{info}/METADATA").decode()
    if not re.search(r"^Requires-Dist: torch==\d+\.\d+\.\d+\.\*$", metadata, re.M):
        problems.append("METADATA does not require torch at one release (torch==X.Y.Z.*)")
    tools_py = os.path.join(root, "lockstep", "_tools.py")
    functions, programs = set(), set()
    if os.path.exists(tools_py):
        tree = ast.parse(open(tools_py, encoding="utf-8").read())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                functions.add(node.name)
                for call in ast.walk(node):
                    if (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "_run"
                            and call.args and isinstance(call.args[0], ast.Constant)):
                        programs.add(call.args[0].value)
    entry_points = z.read(f"{info}/entry_points.txt").decode() if (
        f"{info}/entry_points.txt" in z.namelist()) else ""
    commands = re.findall(r"^(lockstep-[a-z]+)\s*=\s*lockstep\._tools:(\w+)$", entry_points, re.M)
    if not commands:
        problems.append("entry_points.txt names no lockstep-* console command")
    for command, function in commands:
        if function not in functions:
            problems.append(f"{command}: lockstep._tools has no function {function}")
    for program in sorted(programs):
        if not os.path.isfile(os.path.join(root, "lockstep", "bin", program)):
            problems.append(f"lockstep/bin/{program} is missing (lockstep._tools runs it)")
    return problems


def check(path):
    """The problems of the wheel at ``path`` (an empty list: none)."""
    match = WHEEL_NAME.match(os.path.basename(path))
    if not match:
        return [f"{path}: not a wheel's file name (name-version-python-abi-platform.whl)"]
    info = f"{match['name']}-{match['version']}.dist-info"
    with zipfile.ZipFile(path) as z, tempfile.TemporaryDirectory() as root:
        names = [n for n in z.namelist() if not n.endswith("/")]
        problems = _record_problems(z, f"{info}/RECORD")
        tags = re.findall(r"^Tag: (.+)$", z.read(f"{info}/WHEEL").decode(), re.M)
        if tags != [match["tag"]]:
            problems.append(f"WHEEL's tags {tags} are not the file name's {match['tag']}")
        z.extractall(root)
        elf_problems, newest = _elf_problems(root, names)
        problems += elf_problems
        platform = match["tag"].split("-")[2]
        claimed = re.match(r"manylinux_(\d+)_(\d+)_", platform)
        if not claimed:
            problems.append(f"platform tag {platform} says nothing of the glibc it needs "
                            f"(manylinux_2_{newest[1]}_x86_64 would)")
        elif (int(claimed[1]), int(claimed[2])) < newest:
            problems.append(f"platform tag {platform} claims glibc {claimed[1]}.{claimed[2]}, "
                            f"but its files need {newest[0]}.{newest[1]}")
        problems += _metadata_problems(z, info, root)
    return problems


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) == 2 else 2
    problems = check(argv[1])
    for problem in problems:
        print(f"check_wheel: {problem}", file=sys.stderr)
    if not problems:
        print(f"check_wheel: {os.path.basename(argv[1])}: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
