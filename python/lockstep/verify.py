"""Matched actors and repeatability over a whole PyTorch program, as one command.

    python3 -m lockstep.verify --out=DIR [--nproc=N] [--timeout=S] -- python3 train.py ARGS...

runs the program three times, each launch ``--nproc`` ranks with torchrun's environment (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT): once to save its state, then twice as an
actor, each a fresh process loading that state. Each actor runs the program's step cold, warm1
and warm2 (repeatability), once more recorded module by module, and once more recorded operator
by operator. Then, per rank: the repeatability check of each actor, and the actors check (equal
inventories and execution contexts, bit-identical outputs and gradients, else the first module
that diverged, each parameter's gradient localized to a contribution or the accumulation, and
the first operator whose inputs matched and whose outputs differ). It writes DIR/evidence.json
(qualify's format) and DIR/report/index.html (qualify's page), and exits 0 when every check
passed, 1 when one failed, 2 when the evidence could not be made (a launch failed or timed out:
the other ranks are stopped, nothing hangs).

The program cooperates through ``lockstep.verify.program``: after building its model (and before
training), it calls

    if lockstep.verify.program(step, model, optimizer, streams=streams):
        return                      # the launch was one of verify's; its work is done

which does what the launch is for and returns True, or returns False when the program is not run
by this command. ``step`` is the step to check: forward and backward of a fixed batch (as many
backwards as the program's step makes), no optimizer update; it returns the outputs to compare
(a tensor, a dict or ``(name, tensor)`` pairs).
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

from . import variability
from .recording import first_operator_divergence

_ROLE, _DIR, _ACTOR = "LOCKSTEP_VERIFY_ROLE", "LOCKSTEP_VERIFY_DIR", "LOCKSTEP_VERIFY_ACTOR"


def program(step, model, optimizer=None, *, streams=None, caller=None, load=None):
    """The program's side (see the module's docstring): True when this launch was verify's."""
    role = os.environ.get(_ROLE)
    if role is None:
        return False
    out = os.environ[_DIR]
    if role == "save":
        variability.save_state(os.path.join(out, "state"), model, optimizer, streams=streams)
    elif role == "actor":
        actor = os.environ[_ACTOR]
        variability.run_actor(os.path.join(out, "state"), os.path.join(out, f"actor_{actor}"),
                              step, model, optimizer, streams=streams, caller=caller, load=load)
    else:
        raise ValueError(f"{_ROLE}={role!r} is neither 'save' nor 'actor'")
    return True


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _open_log(path):
    """``path`` opened for writing, created 0644 or truncated; a symbolic link planted at it is not
    followed (OSError)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(path, flags, 0o644), "w")


def _launch(name, command, nproc, out, timeout, extra_env):
    """Runs ``nproc`` ranks of ``command``; None when all exit 0, else why not. A rank that fails
    or a launch past ``timeout`` stops the others (SIGTERM, then SIGKILL)."""
    port = _free_port()
    logs = os.path.join(out, "logs")
    os.makedirs(logs, exist_ok=True)
    files = []
    try:  # every log before any rank starts: a log that cannot be opened leaves none running
        for rank in range(nproc):
            files.append(_open_log(os.path.join(logs, f"{name}.rank{rank}.log")))
    except OSError as e:
        for log in files:
            log.close()
        return f"{name}: cannot write its log: {e}"
    procs = []
    for rank, log in enumerate(files):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   **extra_env)
        procs.append((subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True), log))
    deadline = time.monotonic() + timeout
    failure = None
    while failure is None and any(p.poll() is None for p, _ in procs):
        for rank, (p, _) in enumerate(procs):
            if p.poll() not in (None, 0):
                failure = f"{name}: rank {rank} exited {p.returncode} (logs/{name}.rank{rank}.log)"
        if failure is None and time.monotonic() > deadline:
            failure = f"{name}: not done after {timeout:.0f} s"
        time.sleep(0.05)
    for rank, (p, _) in enumerate(procs):
        if failure is None and p.returncode != 0:
            failure = f"{name}: rank {rank} exited {p.returncode} (logs/{name}.rank{rank}.log)"
    for p, log in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        log.close()
    return failure


def _missing(out, name, nproc):
    """Why launch ``name`` left no evidence (the program never called ``program``), or None."""
    for rank in range(nproc):
        path = (os.path.join(out, "state", f"rank{rank}.safetensors") if name == "save"
                else os.path.join(out, f"{name}.rank{rank}.json"))
        if not os.path.exists(path):
            return (f"{name}: rank {rank} exited 0 but wrote no {os.path.relpath(path, out)}: does "
                    f"the program call lockstep.verify.program(step, model, ...)?")
    return None


def _rank_checks(out, rank):
    """The repeatability and actors checks of one rank: (name, passed, detail, evidence)."""
    checks = []
    for actor in ("a", "b"):
        with open(os.path.join(out, f"actor_{actor}.rank{rank}.repeatability.json")) as f:
            r = json.load(f)
        checks.append(("repeatability" if actor == "a" else "repeatability_b", r["passed"],
                       f"actor {actor}: {r['detail']}", r["evidence"]))
    actors = variability.compare_actors(os.path.join(out, "actor_a"),
                                        os.path.join(out, "actor_b"), rank)
    evidence, detail = actors.evidence, actors.detail
    ops_a = os.path.join(out, f"actor_a.rank{rank}.ops.jsonl")
    ops_b = os.path.join(out, f"actor_b.rank{rank}.ops.jsonl")
    if os.path.exists(ops_a) and os.path.exists(ops_b):
        operators = first_operator_divergence(ops_a, ops_b)
        evidence["operators"] = operators.as_dict()
        if operators.diverged:
            detail += f"; operators: {operators.summary}"
    checks.append(("actors", actors.passed, detail, evidence))
    return checks


def evidence_of(out, nproc, command, errors):
    """qualify's evidence format over the ranks' checks (``errors``: why evidence is missing)."""
    by_name = {}
    for rank in range(nproc if not errors else 0):
        try:
            for name, passed, detail, evidence in _rank_checks(out, rank):
                by_name.setdefault(name, []).append(
                    {"rank": rank, "passed": passed, "detail": detail, "evidence": evidence})
        except Exception as e:  # noqa: BLE001  (missing or malformed evidence: named, exit 2)
            errors.append(f"rank {rank}: {type(e).__name__}: {e}")
            break
    checks = [{"name": name, "passed": all(r["passed"] for r in ranks), "ranks": ranks}
              for name, ranks in by_name.items()]
    return {"format": "lockstep.verify/1", "title": "verify: " + " ".join(command),
            "program": command, "nproc": nproc, "topology": {"dp": nproc, "tp": 1, "cp": 1},
            "device": "as each actor's execution context says",
            "passed": bool(checks) and not errors and all(c["passed"] for c in checks),
            "checks": checks, "errors": errors}


def _write_report(evidence_path, out):
    # The page is the evidence's view: one it cannot write (report_page says why on stderr)
    # leaves the JSON, and the exit status, as they are.
    from . import report_page
    report_page.main(["report", evidence_path, os.path.join(out, "report")])


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m lockstep.verify",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="a new (or empty) folder for the evidence")
    parser.add_argument("--nproc", type=int, default=1, help="ranks per launch (default 1)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per launch")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the program and its args")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no program given (after --)")
    if args.nproc < 1 or args.nproc > 1024:
        parser.error(f"--nproc={args.nproc} is outside [1, 1024]")
    if args.timeout <= 0:
        parser.error(f"--timeout={args.timeout} must be > 0")
    out = os.path.abspath(args.out)
    if os.path.islink(out) or (os.path.exists(out) and
                               (not os.path.isdir(out) or os.listdir(out))):
        parser.error(f"--out={args.out} exists and is not an empty folder")
    os.makedirs(out, exist_ok=True)
    errors = []
    for name, env in (("save", {_ROLE: "save"}), ("actor_a", {_ROLE: "actor", _ACTOR: "a"}),
                      ("actor_b", {_ROLE: "actor", _ACTOR: "b"})):
        print(f"verify: {name} ({args.nproc} ranks)", flush=True)
        failure = _launch(name, command, args.nproc, out, args.timeout, dict(env, **{_DIR: out}))
        if failure is None:
            failure = _missing(out, name, args.nproc)
        if failure is not None:
            errors.append(failure)
            break
    evidence = evidence_of(out, args.nproc, command, errors)
    path = os.path.join(out, "evidence.json")
    variability.write_text(path, json.dumps(evidence, indent=1))
    for check in evidence["checks"]:
        print(f"{'PASS' if check['passed'] else 'FAIL'} {check['name']}: "
              f"{check['ranks'][0]['detail']}")
    for error in errors:
        print(f"ERROR {error}")
    print(f"evidence: {path}")
    _write_report(path, out)
    if errors:
        return 2
    return 0 if evidence["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
