"""lockstep.determinism: deterministic mode enforced and verified from Python, a contradicting
setting refused by name, and the execution-context record with its digest and differences.
The mode is process-wide: each case that changes it runs in a fresh interpreter."""

import json
import os
import subprocess
import sys
import textwrap

from lockstep import determinism


def run_python(code):
    """Runs ``code`` in a fresh interpreter with this package; its stdout and exit status."""
    env = dict(os.environ)
    env.pop("CUBLAS_WORKSPACE_CONFIG", None)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


def test_enforce_sets_and_verifies_every_setting():
    code, out = run_python("""
        import json, os, torch, lockstep
        settings = lockstep.determinism.enforce()
        lockstep.determinism.verify()
        print(json.dumps({"settings": settings, "enforced": lockstep.determinism.enforced(),
                          "algorithms": torch.are_deterministic_algorithms_enabled(),
                          "cublas": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
                          "nccl_algo": os.environ.get("NCCL_ALGO")}))
    """)
    assert code == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["enforced"] and result["algorithms"]
    assert result["settings"]["cudnn_benchmark"] is False
    assert result["nccl_algo"] == "Ring"
    # Set only where this LibTorch demands it (Note [cuBLAS workspace setting]).
    if result["settings"]["cublas_workspace_config_required"]:
        assert result["cublas"] in (":4096:8", ":16:8")
    else:
        assert result["cublas"] is None and result["settings"]["cublas_workspace_config"] is None


def test_a_contradicting_setting_is_refused_by_name():
    code, out = run_python("""
        import torch, lockstep
        torch.backends.cudnn.benchmark = True
        try:
            lockstep.determinism.enforce()
        except lockstep.errors.FailedPreconditionError as e:
            print("refused:", e)
            print("enforced:", lockstep.determinism.enforced())
    """)
    assert code == 0, out
    assert "refused:" in out and "benchmark" in out, out
    assert "enforced: False" in out, out


def test_verify_names_a_setting_undone_after_enforce():
    code, out = run_python("""
        import torch, lockstep
        lockstep.determinism.enforce()
        torch.use_deterministic_algorithms(False)
        try:
            lockstep.determinism.verify()
        except lockstep.errors.FailedPreconditionError as e:
            print("refused:", e)
    """)
    assert code == 0, out
    assert "refused:" in out and "deterministic" in out, out


def test_execution_context_digest_and_differences():
    a = determinism.execution_context(seed=1234, topology="DP2")
    assert a["stable"]["caller"] == {"seed": "1234", "topology": "DP2"}
    assert determinism.context_digest(a) == a["digest"]
    b = determinism.execution_context(seed=1235, topology="DP2")
    assert determinism.context_differences(a, b) == ["caller.seed"]
    assert determinism.context_digest(b) != a["digest"]
    assert determinism.context_differences(a, a) == []
