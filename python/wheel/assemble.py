"""Assembles lockstep's wheel from what Bazel built (//python/wheel:wheel runs it; users run
tools/build_wheel.sh): the package (//python:package), lockstep's tools as lockstep/bin/*, the
shared libraries they need that neither the platform nor torch provides copied into
lockstep/_libs, every run path made relative ($ORIGIN), the metadata written, and the wheel packed
by the `wheel` tool (python3-wheel), which writes RECORD. check_wheel.py must pass on the result,
or nothing is written.

    python3 assemble.py --out=lockstep.whl --name_out=name.txt --version=VERSION \\
        --torch_facts=F --python_facts=F --package FILE... --tool NAME=PATH...
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_wheel  # noqa: E402
import elf  # noqa: E402

SUMMARY = ("Keeps distributed training ranks in step: agreeing RNG streams, exact recompute, "
           "admission under a memory cap, and proofs that two runs match")
# lockstep-<tool> runs lockstep/bin/<tool>; report is Python (report/report.py).
TOOLS = ("qualify", "replay", "diverge", "compare", "inventory", "ledger", "launch")
COMMANDS = TOOLS + ("report",)


def facts(path):
    with open(path, encoding="utf-8") as f:
        return dict(line.strip().split("=", 1) for line in f if "=" in line)


def resolved(path):
    """soname -> path of the libraries the dynamic loader finds for ``path`` (ldd)."""
    out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
    return dict(re.findall(r"^\s*(\S+) => (/\S+)", out, re.M))


def vendor(tree, elf_files):
    """Copies into lockstep/_libs every library the files need, directly or through another
    vendored one, that is neither provided (elf.PROVIDED) nor already in the wheel."""
    libs = os.path.join(tree, "lockstep", "_libs")
    os.makedirs(libs, exist_ok=True)
    ours = {os.path.basename(f) for f in elf_files}
    queue = list(elf_files)
    while queue:
        path = queue.pop()
        found = resolved(path)
        for soname in elf.needed(path):
            if elf.PROVIDED.match(soname) or soname in ours:
                continue
            if soname not in found:
                sys.exit(f"assemble: {os.path.basename(path)} needs {soname}, which this "
                         f"machine does not have")
            target = os.path.join(libs, soname)
            shutil.copy2(found[soname], target)  # follows the soname's link to the file
            os.chmod(target, 0o755)
            ours.add(soname)
            queue.append(target)
    return sorted(os.path.join(libs, n) for n in os.listdir(libs))


def set_run_path(path, run_path):
    subprocess.run(["patchelf", "--set-rpath", run_path, path], check=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--name_out", required=True)
    parser.add_argument("--version", required=True, help="the VERSION file")
    parser.add_argument("--torch_facts", required=True)
    parser.add_argument("--python_facts", required=True)
    parser.add_argument("--package", nargs="+", required=True)
    parser.add_argument("--tool", nargs="+", required=True, help="NAME=PATH")
    args = parser.parse_args(argv)
    version = open(args.version, encoding="utf-8").read().strip()
    torch, python = facts(args.torch_facts), facts(args.python_facts)
    py = "cp" + python["python_version"].replace(".", "")

    with tempfile.TemporaryDirectory() as work:
        tree = os.path.join(work, f"lockstep-{version}")
        package = os.path.join(tree, "lockstep")
        os.makedirs(os.path.join(package, "bin"))
        for path in args.package:
            target = os.path.join(package, path.split("/pkg/lockstep/", 1)[1])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(path, target)
        tools = dict(t.split("=", 1) for t in args.tool)
        missing = sorted(set(TOOLS) - set(tools))
        if missing:
            sys.exit(f"assemble: no --tool for {', '.join(missing)}")
        for name in TOOLS:
            shutil.copyfile(tools[name], os.path.join(package, "bin", name))
            os.chmod(os.path.join(package, "bin", name), 0o755)
        # Libraries beside the package's files and its programs, before run paths change.
        ours = [os.path.join(package, n) for n in os.listdir(package) if n.endswith(".so")]
        programs = [os.path.join(package, "bin", n) for n in TOOLS]
        for path in ours:
            os.chmod(path, 0o755)
        # ldd must see the originals' run paths to find what Bazel linked: vendor from them.
        originals = [p for p in args.package if p.endswith(".so")] + [tools[n] for n in TOOLS]
        vendored = vendor(tree, originals)
        for path in ours:
            set_run_path(path, "$ORIGIN:$ORIGIN/_libs")
        for path in programs:
            set_run_path(path, "$ORIGIN/..:$ORIGIN/../_libs")
        for path in vendored:
            set_run_path(path, "$ORIGIN")
        newest = max(elf.glibc_needed(p) for p in ours + programs + vendored)
        tag = f"{py}-{py}-manylinux_{newest[0]}_{newest[1]}_x86_64"

        info = os.path.join(tree, f"lockstep-{version}.dist-info")
        os.makedirs(info)
        with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as f:
            f.write(f"Metadata-Version: 2.1\nName: lockstep\nVersion: {version}\n"
                    f"Summary: {SUMMARY}\n"
                    f"Requires-Python: =={python['python_version']}.*\n"
                    f"Requires-Dist: torch=={torch['torch_release']}.*\n")
        with open(os.path.join(info, "WHEEL"), "w", encoding="utf-8") as f:
            f.write(f"Wheel-Version: 1.0\nGenerator: lockstep python/wheel/assemble.py\n"
                    f"Root-Is-Purelib: false\nTag: {tag}\n")
        with open(os.path.join(info, "entry_points.txt"), "w", encoding="utf-8") as f:
            f.write("[console_scripts]\n" + "".join(
                f"lockstep-{c} = lockstep._tools:{c}\n" for c in COMMANDS))
        dist = os.path.join(work, "dist")
        os.makedirs(dist)
        subprocess.run([sys.executable, "-m", "wheel", "pack", "--dest-dir", dist, tree],
                       check=True, stdout=subprocess.DEVNULL)
        (built,) = os.listdir(dist)
        problems = check_wheel.check(os.path.join(dist, built))
        if problems:
            sys.exit("assemble: the wheel fails its checks:\n  " + "\n  ".join(problems))
        shutil.copyfile(os.path.join(dist, built), args.out)
        with open(args.name_out, "w", encoding="utf-8") as f:
            f.write(built + "\n")


if __name__ == "__main__":
    main()
