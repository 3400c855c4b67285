"""examples/lora/cost_benchmark.py: what lockstep's Python-side proofs cost on the Qwen-shaped
LoRA model of model.py, each as a paired ratio against the same program without lockstep,
measured in the same run.

    cd examples/lora && PYTHONPATH=<lockstep package dir> python3 cost_benchmark.py \
        [--device=cpu|cuda] [--dtype=float32|bfloat16] [--layers=N] [--hidden=H] \
        [--repeats=N] [--out=results.json]

(the package dir is bazel-bin/python/pkg after `bazel build -c opt //python:package`: the
figures are those of an optimized build; --help lists the other sizes.) The
inventory target's size: each layer adds 68 tensors (26 of the model, 42 of AdamW), so
--layers=295 gives 20,063; there, --measure=inventory skips the recorders, which take long.

What is measured, each pair alternated inside one loop (the order flips every iteration), both
arms warmed up outside the timed region, medians reported with the ratio of the medians; on CUDA
the device is synchronized before every clock reading:
  1. module recorder: the step (--microbatches forward+backward, no optimizer update) plain, and
     inside ``with lockstep.recording.ModuleRecorder(model)`` (keep_full_tensors=0).
     Target ratio <= 1.3.
  2. operator recorder: the plain step, and the step inside ``with
     lockstep.recording.OperatorRecorder(path, module=model)`` (a fresh file each iteration,
     deleted afterwards). Target ratio <= 2.0.
  3. state capture: ``lockstep.replay.capture_state`` of the model, AdamW (after one update, so it
     has state), the RNG streams and the gradients, into a fresh directory each iteration;
     baseline: the disk's own time for the same bytes (those of the capture's
     state.safetensors, written with open/write/fsync/os.replace in the same filesystem).
     Target ratio <= 1.0 (the capture also serializes and hashes, and writes index.json and
     complete.json). For reference, also paired: the capture's three files written as the
     capture writes them (each fsynced with its directory), to tell disk work from the rest.
  4. inventory: ``lockstep.numerics.inventory(lockstep.numerics.module_state(model, opt))``;
     reference: a read-only pass over the same tensors (module_state, then one abs().amax()
     per tensor, stacked). Reports tensors, bytes and GB/s (bytes / median time). Target, on an
     H100/H200 at >= 20,000 tensors: >= 2 TB/s (elsewhere reported, not judged).

Prints a table (median baseline, median instrumented, ratio, target, MET / NOT MET), the
machine and the sizes; --out writes the same as JSON (atomically). Exit status: 0 when every
measurement was made (met or not: the closing note names what was not met), 2 when one could
not be (bad arguments, an error, a zero median).
"""

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback

import torch

import lockstep
from lockstep import numerics

from model import Config, QwenLora, fixed_batch, lora_parameters, loss_fn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MEASUREMENTS = ("module_recorder", "operator_recorder", "state_capture", "inventory")
INVENTORY_TARGET_BYTES_PER_S = 2e12  # 2 TB/s
INVENTORY_TARGET_MIN_TENSORS = 20_000


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv_heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=160)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--microbatches", type=int, default=3, help="backwards per step")
    parser.add_argument("--repeats", type=int, default=20, help="timed iterations per arm")
    parser.add_argument("--warmup", type=int, default=2, help="untimed iterations per arm")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--measure", default=",".join(MEASUREMENTS),
                        help="comma-separated subset of " + ",".join(MEASUREMENTS))
    parser.add_argument("--tmpdir", default="",
                        help="where recordings and captures go (default: the system's temp "
                             "dir); the disk baseline writes to the same filesystem")
    parser.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=True,
                        help="lockstep.determinism.enforce() first, as train.py does")
    parser.add_argument("--init_on_device", action="store_true",
                        help="draw the weights on the device in --dtype (QwenLora's "
                             "init_on_device): for sizes whose float32 CPU init would not fit")
    parser.add_argument("--out", default="", help="also write the results here as JSON")
    args = parser.parse_args(argv)
    for name in ("layers", "batch", "seq", "microbatches", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} must be >= 1")
    if args.warmup < 0:
        parser.error(f"--warmup={args.warmup} must be >= 0")
    args.measure = [m.strip() for m in args.measure.split(",") if m.strip()]
    unknown = [m for m in args.measure if m not in MEASUREMENTS]
    if unknown or not args.measure:
        parser.error(f"--measure: unknown {unknown}; choose from {', '.join(MEASUREMENTS)}")
    return args


class Clock:
    """perf_counter, after the device has finished its queued work (CUDA runs asynchronously:
    without the synchronize a clock would time the launches, not the work)."""

    def __init__(self, device):
        self._cuda = device.type == "cuda"

    def now(self):
        if self._cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


def paired(arms, repeats, warmup):
    """Runs the arms (name -> fn returning its own elapsed seconds, setup and cleanup outside
    its timed span) alternately; returns name -> list of seconds. The order is reversed every
    other iteration so that neither arm always follows the other (caches, allocator, clocks)."""
    names = list(arms)
    for _ in range(warmup):
        for name in names:
            arms[name]()
    times = {name: [] for name in names}
    for i in range(repeats):
        for name in (names if i % 2 == 0 else names[::-1]):
            gc.collect()  # a collection is not charged to whichever arm happens to trigger it
            times[name].append(arms[name]())
    return times


def median(samples):
    value = statistics.median(samples)
    if not value > 0:
        raise RuntimeError(f"median time {value!r} s: too short to measure (raise --repeats or "
                           f"the sizes)")
    return value


def spread(samples):
    """Interquartile range over the median: how noisy the median is."""
    q = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
    return (q[2] - q[0]) / statistics.median(samples)


def machine(device):
    info = {"torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "device": str(device),
            "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    else:
        info["device_name"] = f"CPU {info['cpu']} x{info['cpu_count']}"
    return info


class Bench:
    """The program (model, AdamW over the adapters, a fixed batch, the step) and the arms."""

    def __init__(self, args, device, tmp):
        self.args, self.device, self.tmp = args, device, tmp
        self.clock = Clock(device)
        torch.manual_seed(args.seed)
        self.streams = lockstep.rng.RankStreams(device.index if device.type == "cuda" else -1)
        self.config = Config(layers=args.layers, hidden=args.hidden, heads=args.heads,
                             kv_heads=args.kv_heads, intermediate=args.intermediate,
                             seed=args.seed, dtype=DTYPES[args.dtype])
        self.model = QwenLora(self.config, device=device, init_on_device=args.init_on_device)
        self.adapters = [p for _, p in lora_parameters(self.model)]
        self.optimizer = torch.optim.AdamW(self.adapters, lr=1e-3)
        self.batches = [(ids.to(device), targets.to(device)) for ids, targets in
                        fixed_batch(self.config, args.batch, args.seq, args.seed + 1,
                                    args.microbatches)]
        # One update, as train.py's warm step: AdamW then has state (step, exp_avg,
        # exp_avg_sq) for the capture and the inventory to cover.
        self.optimizer.zero_grad(set_to_none=True)
        self.step()
        self.optimizer.step()
        self.counter = 0

    def step(self):
        """train.py's step: the microbatches' backwards, gradients accumulating, no update."""
        total = torch.zeros((), dtype=torch.float32, device=self.device)
        for ids, targets in self.batches:
            loss = loss_fn(self.model(ids), targets) / len(self.batches)
            loss.backward()
            total += loss.detach()
        return {"loss": total}

    def fresh(self, suffix=""):
        self.counter += 1
        return os.path.join(self.tmp, f"{self.counter:06d}{suffix}")

    # -- 1 and 2: the step, plain and recorded ------------------------------------------------

    def plain_step(self):
        # Gradients start absent in every arm, so no arm accumulates into a larger .grad history.
        self.optimizer.zero_grad(set_to_none=True)
        start = self.clock.now()
        self.step()
        return self.clock.now() - start

    def module_recorded_step(self, info):
        self.optimizer.zero_grad(set_to_none=True)
        start = self.clock.now()
        with lockstep.recording.ModuleRecorder(self.model) as recorder:
            self.step()
        elapsed = self.clock.now() - start
        info["records"] = len(recorder.recording)
        return elapsed

    def operator_recorded_step(self, info):
        self.optimizer.zero_grad(set_to_none=True)
        path = self.fresh(".ops.jsonl")
        start = self.clock.now()
        with lockstep.recording.OperatorRecorder(path, module=self.model) as recorder:
            self.step()
            # Read inside the block: after it, `recorded` answers 0.
            calls = recorder.recorded
        elapsed = self.clock.now() - start
        info["operator_calls"] = calls
        info["recording_bytes"] = os.path.getsize(path)
        os.remove(path)
        return elapsed

    # -- 3: state capture against the disk -----------------------------------------------------

    def capture(self, info):
        root = self.fresh(".capture")
        start = self.clock.now()
        lockstep.replay.capture_state(
            root, 1, model=self.model, optimizer=self.optimizer, streams=self.streams,
            data_position=1, absent={"ledger": "benchmark", "python_random": "benchmark",
                                     "numpy_random": "benchmark"})
        elapsed = self.clock.now() - start
        files = {name: os.path.join(d, name) for d, _, names in os.walk(root) for name in names}
        if "state.safetensors" not in files:
            raise RuntimeError(f"capture_state wrote no state.safetensors under {root}: "
                               f"{sorted(files)}")
        info["state_bytes"] = os.path.getsize(files["state.safetensors"])
        info["files"] = {name: os.path.getsize(p) for name, p in sorted(files.items())}
        if "payload" not in info:
            # The baseline writes these very bytes, so content (compressing filesystems) and
            # size match; the capture-shaped reference writes all three files.
            info["payloads"] = {}
            for name, p in sorted(files.items()):
                with open(p, "rb") as f:
                    info["payloads"][name] = f.read()
            info["payload"] = info["payloads"]["state.safetensors"]
        shutil.rmtree(root)
        return elapsed

    def disk_write(self, info):
        payload = info["payload"]
        directory = self.fresh(".disk")
        os.mkdir(directory)
        target = os.path.join(directory, "state.safetensors")
        start = self.clock.now()
        with open(target + ".tmp", "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(target + ".tmp", target)
        elapsed = self.clock.now() - start
        shutil.rmtree(directory)
        return elapsed

    def disk_write_as_capture(self, info):
        """Reference only (not the target's baseline): the disk work a capture does itself,
        as base/file_io.h writes: its directories, then each file through a temporary,
        fsynced, renamed, and its directory fsynced. What the capture takes beyond this is
        its serializing, hashing and execution-context record."""
        root = self.fresh(".disk3")
        start = self.clock.now()
        directory = os.path.join(root, "step1", "rank0")
        os.makedirs(directory)
        for name, payload in info["payloads"].items():
            target = os.path.join(directory, name)
            with open(target + ".tmp", "wb") as f:
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(target + ".tmp", target)
            fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        elapsed = self.clock.now() - start
        shutil.rmtree(root)
        return elapsed

    # -- 4: inventory against a read-only pass --------------------------------------------------

    def inventory(self, info):
        start = self.clock.now()
        inv = numerics.inventory(numerics.module_state(self.model, self.optimizer))
        elapsed = self.clock.now() - start
        info["tensors"], info["bytes"] = inv.tensors, inv.bytes
        return elapsed

    def read_only(self, info):
        start = self.clock.now()
        # Same named set as the inventory (module_state included in both, so the ratio compares
        # the digests with the cheapest pass that still reads every element).
        named = numerics.module_state(self.model, self.optimizer)
        # One reduction per tensor, each on its own device (module_state holds CPU RNG states).
        peaks = [t.abs().amax() for _, t in named if t.numel()]
        elapsed = self.clock.now() - start
        info["read_only_tensors"] = len(named)
        info["read_only_bytes"] = sum(t.numel() * t.element_size() for _, t in named)
        del peaks
        return elapsed

    def named_set_only(self):
        start = self.clock.now()
        numerics.module_state(self.model, self.optimizer)
        return self.clock.now() - start


def row(name, baseline_label, times, base, inst, target_ratio, info):
    b, i = median(times[base]), median(times[inst])
    ratio = i / b
    return {"name": name, "baseline": baseline_label,
            "baseline_median_s": b, "instrumented_median_s": i, "ratio": ratio,
            "baseline_spread": spread(times[base]), "instrumented_spread": spread(times[inst]),
            "target": f"ratio <= {target_ratio:g}" if target_ratio is not None else "",
            "met": target_ratio is not None and ratio <= target_ratio,
            "applies": target_ratio is not None, "details": info,
            "samples_s": {"baseline": times[base], "instrumented": times[inst]}}


def measure(bench, which, machine_info):
    args = bench.args
    arms_args = (args.repeats, args.warmup)
    if which == "module_recorder":
        info = {}
        times = paired({"plain": bench.plain_step,
                        "recorded": lambda: bench.module_recorded_step(info)}, *arms_args)
        return row("module recorder", "plain step", times, "plain", "recorded", 1.3, info)
    if which == "operator_recorder":
        info = {}
        times = paired({"plain": bench.plain_step,
                        "recorded": lambda: bench.operator_recorded_step(info)}, *arms_args)
        return row("operator recorder", "plain step", times, "plain", "recorded", 2.0, info)
    if which == "state_capture":
        info = {}
        bench.capture(info)  # the payload's size is the capture's: known before the loop
        times = paired({"disk": lambda: bench.disk_write(info),
                        "capture": lambda: bench.capture(info),
                        "disk_as_capture": lambda: bench.disk_write_as_capture(info)},
                       *arms_args)
        del info["payload"], info["payloads"]
        result = row("state capture", f"disk write {info['state_bytes']:,} B", times,
                     "disk", "capture", 1.0, info)
        info["disk_bytes_per_s"] = info["state_bytes"] / result["baseline_median_s"]
        info["disk_as_capture_median_s"] = median(times["disk_as_capture"])
        result["samples_s"]["disk_as_capture"] = times["disk_as_capture"]
        return result
    if which == "inventory":
        info = {}
        times = paired({"read_only": lambda: bench.read_only(info),
                        "inventory": lambda: bench.inventory(info),
                        "module_state": bench.named_set_only}, *arms_args)
        result = row("inventory", "read-only pass", times, "read_only", "inventory", None, info)
        rate = info["bytes"] / result["instrumented_median_s"]
        info["inventory_bytes_per_s"] = rate
        info["read_only_bytes_per_s"] = info["bytes"] / result["baseline_median_s"]
        info["module_state_median_s"] = median(times["module_state"])
        name = machine_info.get("device_name", "")
        applies = (bench.device.type == "cuda" and ("H100" in name or "H200" in name)
                   and info["tensors"] >= INVENTORY_TARGET_MIN_TENSORS)
        result.update(target=f">= {INVENTORY_TARGET_BYTES_PER_S / 1e12:g} TB/s",
                      met=rate >= INVENTORY_TARGET_BYTES_PER_S, applies=applies)
        result["samples_s"]["module_state"] = times["module_state"]
        return result
    raise ValueError(which)


def status(result):
    verdict = "MET" if result["met"] else "NOT MET"
    return verdict if result["applies"] else f"n/a ({verdict} here)"


def print_report(report):
    m, s = report["machine"], report["sizes"]
    print(f"machine: torch {m['torch']}, {m['device_name']} ({m['device']}), "
          f"python {m['python']}, {m['cpu_count']} CPUs, {m['torch_threads']} torch threads")
    print(f"sizes: layers={s['layers']} hidden={s['hidden']} intermediate={s['intermediate']} "
          f"dtype={s['dtype']} batch={s['batch']} seq={s['seq']} "
          f"microbatches={s['microbatches']}; parameters {s['parameters']:,} "
          f"({s['trainable_parameters']:,} trainable); repeats={s['repeats']} "
          f"warmup={s['warmup']}")
    header = (f"{'measurement':<18} {'baseline':<24} {'base ms':>10} {'instr ms':>10} "
              f"{'ratio':>7}  {'target':<14} status")
    print()
    print(header)
    print("-" * len(header))
    for r in report["measurements"]:
        print(f"{r['name']:<18} {r['baseline']:<24} {r['baseline_median_s'] * 1e3:>10.3f} "
              f"{r['instrumented_median_s'] * 1e3:>10.3f} {r['ratio']:>7.3f}  "
              f"{r['target']:<14} {status(r)}")
    for name, error in report["errors"].items():
        print(f"{name:<18} ERROR: {error}")
    print()
    for r in report["measurements"]:
        d = r["details"]
        noise = (f"IQR/median {r['baseline_spread']:.0%} baseline, "
                 f"{r['instrumented_spread']:.0%} instrumented")
        if r["name"] == "module recorder":
            print(f"  module recorder: {d['records']:,} records per step; {noise}")
        elif r["name"] == "operator recorder":
            print(f"  operator recorder: {d['operator_calls']:,} operator calls, "
                  f"{d['recording_bytes']:,} B of JSON lines per step; {noise}")
        elif r["name"] == "state capture":
            files = ", ".join(f"{k} {v:,} B" for k, v in d["files"].items())
            print(f"  state capture: {files}; disk {d['disk_bytes_per_s'] / 1e6:.1f} MB/s "
                  f"for the state's bytes; {noise}")
            as_capture = d["disk_as_capture_median_s"]
            print(f"    reference: the same 3 files written as the capture writes them (each "
                  f"fsynced with its directory) {as_capture * 1e3:.3f} ms; capture / that = "
                  f"{r['instrumented_median_s'] / as_capture:.2f}")
        elif r["name"] == "inventory":
            print(f"  inventory: {d['tensors']:,} tensors, {d['bytes']:,} B: "
                  f"{d['inventory_bytes_per_s'] / 1e9:.3f} GB/s (read-only pass "
                  f"{d['read_only_bytes_per_s'] / 1e9:.3f} GB/s; module_state alone "
                  f"{d['module_state_median_s'] * 1e3:.3f} ms); {noise}")
            if not r["applies"]:
                print(f"    the 2 TB/s target is judged on an H100/H200 at >= "
                      f"{INVENTORY_TARGET_MIN_TENSORS:,} tensors only")
    print()
    print(report["note"])


def write_json(path, report):
    path = os.path.abspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv=None):
    args = parse(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device=cuda: no CUDA device is available", file=sys.stderr)
        return 2
    if args.deterministic:
        lockstep.determinism.enforce()  # before any CUDA work, as train.py
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" \
        else torch.device("cpu")
    report = {"machine": machine(device), "measurements": [], "errors": {}}
    tmp = tempfile.mkdtemp(prefix="lockstep_cost_", dir=args.tmpdir or None)
    try:
        try:
            bench = Bench(args, device, tmp)
        except Exception as e:  # noqa: BLE001  (reported, and the exit status says so)
            traceback.print_exc()
            report["errors"]["setup"] = f"{type(e).__name__}: {e}"
            bench = None
        if bench is not None:
            report["sizes"] = {
                "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                "kv_heads": args.kv_heads, "intermediate": args.intermediate,
                "dtype": args.dtype, "batch": args.batch, "seq": args.seq,
                "microbatches": args.microbatches, "repeats": args.repeats,
                "warmup": args.warmup, "deterministic": args.deterministic,
                "parameters": sum(p.numel() for p in bench.model.parameters()),
                "trainable_parameters": sum(p.numel() for p in bench.adapters),
                "tmpdir": tmp}
            for which in args.measure:
                print(f"measuring {which} ...", file=sys.stderr, flush=True)
                try:
                    report["measurements"].append(measure(bench, which, report["machine"]))
                except Exception as e:  # noqa: BLE001  (the others can still be measured)
                    traceback.print_exc()
                    report["errors"][which] = f"{type(e).__name__}: {e}"
            inventory = [r for r in report["measurements"] if r["name"] == "inventory"]
            if inventory:
                report["sizes"]["inventory_tensors"] = inventory[0]["details"]["tensors"]
                report["sizes"]["inventory_bytes"] = inventory[0]["details"]["bytes"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report.setdefault("sizes", {"layers": args.layers, "hidden": args.hidden,
                                "intermediate": args.intermediate, "dtype": args.dtype,
                                "batch": args.batch, "seq": args.seq,
                                "microbatches": args.microbatches, "parameters": 0,
                                "trainable_parameters": 0, "repeats": args.repeats,
                                "warmup": args.warmup})
    not_met = [r["name"] for r in report["measurements"] if r["applies"] and not r["met"]]
    if report["errors"]:
        report["note"] = f"NOT MEASURED: {', '.join(report['errors'])} (errors above); exit 2."
    elif not_met:
        report["note"] = f"NOT MET: {', '.join(not_met)} (every measurement was made)."
    else:
        report["note"] = "All applicable targets MET."
    print_report(report)
    if args.out:
        write_json(args.out, report)
        print(f"wrote {args.out}")
    return 2 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
