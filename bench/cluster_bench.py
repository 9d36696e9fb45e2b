"""Cluster benchmarks: writes bench/RESULTS_cluster.md.

    .venv/bin/python bench/cluster_bench.py            # ~2 minutes on 2 cores
    .venv/bin/python bench/cluster_bench.py --quick    # 1 round, fewer sizes, 1 SLURM job

1. ``dtrain validate-cluster``'s live check: all_reduce (sum, float32) latency and bus
   bandwidth on gloo, 1 KB - 64 MB, with 2 and 4 ranks on this machine (median of rounds).
2. Time from ``dtrain sbatch --submit`` to the first finished training step on the local
   SLURM (tests/slurm/start-local-slurm.sh; needs root): the job's ``summary.json`` times
   its first step from the moment ``dtrain sbatch`` called sbatch.

Every measurement runs dtrain as users do, in its own process; no torch import here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
SIZES = ["1K", "4K", "16K", "64K", "256K", "1M", "4M", "16M", "64M"]
TINY = [
    "recipe=gpt_tiny",
    "model.n_layer=1",
    "dp=2",
    "train.steps=20",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
    "logging.every=5",
    "logging.tensorboard=false",
    "optim.warmup_steps=0",
]


def log(msg: str) -> None:
    print(f"[cluster_bench] {msg}", file=sys.stderr, flush=True)


def dtrain(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [PY, "-m", "dtrain_cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def allreduce(nranks: int, sizes: list[str], rounds: int, work: Path) -> list[dict]:
    per_size: dict[int, list[dict]] = {}
    for r in range(rounds):
        out = dtrain(
            [
                "validate-cluster",
                "--json",
                "--nproc-per-node",
                str(nranks),
                "--sizes",
                ",".join(sizes),
                "--timeout",
                "120",
                "--run-dir",
                str(work),
            ],
            work,
        )
        report = json.loads(out.stdout)
        if not report["ok"]:
            raise SystemExit(f"validate-cluster failed with {nranks} ranks:\n{out.stdout}")
        for row in report["live"]["bandwidth"]:
            per_size.setdefault(row["bytes"], []).append(row)
        log(f"{nranks} ranks, round {r + 1}/{rounds} done")
    return [
        {
            "bytes": size,
            "latency_us": statistics.median(x["latency_us"] for x in rows),
            "busbw_GBps": statistics.median(x["busbw_GBps"] for x in rows),
            "algbw_GBps": statistics.median(x["algbw_GBps"] for x in rows),
        }
        for size, rows in sorted(per_size.items())
    ]


def ensure_slurm() -> str | None:
    """None when a local SLURM is up (started if needed), else why not."""
    env = {**os.environ, "SLURM_LOCAL_NODES": "2"}
    if os.geteuid() != 0 and shutil.which("sbatch") is None:
        return "no SLURM here and starting one needs root"
    out = subprocess.run(
        ["bash", str(REPO / "tests" / "slurm" / "start-local-slurm.sh")],
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        return f"start-local-slurm.sh failed: {out.stderr[-300:]}"
    os.environ["SLURM_CONF"] = os.environ.get("SLURM_CONF", "/tmp/slurm/etc/slurm.conf")
    os.environ["PATH"] += ":/usr/sbin"
    return None


def job_state(job_id: str) -> str:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True
    ).stdout
    for field in out.split():
        if field.startswith("JobState="):
            return field.split("=", 1)[1]
    return ""


def submit_to_first_step(jobs: int, work: Path) -> list[dict]:
    rows = []
    for i in range(jobs):
        out = dtrain(["sbatch", *TINY, f"run.name=bench-{i}", "--submit"], work)
        if out.returncode != 0:
            raise SystemExit(f"dtrain sbatch failed: {out.stderr}")
        job_id = out.stdout.strip()
        deadline = time.time() + 300
        while job_state(job_id) not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            if time.time() > deadline:
                raise SystemExit(f"job {job_id} did not finish")
            time.sleep(0.2)
        summary = json.loads((work / "runs" / f"bench-{i}" / "summary.json").read_text())
        keys = ("worker_start", "process_group_ready", "first_step_done")
        rows.append({k: summary[f"startup_{k}_s"] for k in keys})
        log(f"job {job_id}: first step {rows[-1]['first_step_done']:.2f} s after submit")
    return rows


def human(n: int) -> str:
    for unit, size in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n // size} {unit}"
    return f"{n} B"


def render(results: dict, args: argparse.Namespace) -> str:
    lines = [
        "# Cluster benchmarks",
        "",
        f"`{' '.join(['python', 'bench/cluster_bench.py', *sys.argv[1:]])}` on "
        f"{platform.node()}: {os.cpu_count()} cores, {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}. Medians of {args.rounds} round(s).",
        "",
        "## all_reduce on gloo (validate-cluster's live check)",
        "",
        "float32 sum over CPU processes on one machine; latency = the slowest rank's mean time",
        "per call; busbw = size / latency x 2(n-1)/n (nccl-tests' convention). 4 ranks on 2",
        "cores are oversubscribed: that row shows the cost, not a network.",
        "",
        "| size | 2 ranks latency | 2 ranks busbw | 4 ranks latency | 4 ranks busbw |",
        "|---:|---:|---:|---:|---:|",
    ]
    two = {r["bytes"]: r for r in results["allreduce"]["2"]}
    four = {r["bytes"]: r for r in results["allreduce"]["4"]}
    for size in sorted(two):
        a, b = two[size], four.get(size)
        cells = [
            human(size),
            f"{a['latency_us']:,.0f} us",
            f"{a['busbw_GBps']:.3f} GB/s",
            f"{b['latency_us']:,.0f} us" if b else "-",
            f"{b['busbw_GBps']:.3f} GB/s" if b else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## `dtrain sbatch --submit` to the first training step (local SLURM)", ""]
    slurm = results["slurm"]
    if isinstance(slurm, str):
        lines.append(f"not measured: {slurm}")
    else:
        lines += [
            "gpt_tiny (1 layer), dp=2 on one node of the local 2-node SLURM (tests/slurm/). "
            "Times from the sbatch call; each job is a fresh `srun` + elastic agent + workers.",
            "",
            "| job | workers started | process group ready | first step done |",
            "|---:|---:|---:|---:|",
        ]
        for i, r in enumerate(slurm):
            lines.append(
                f"| {i + 1} | {r['worker_start']:.2f} s | {r['process_group_ready']:.2f} s | "
                f"{r['first_step_done']:.2f} s |"
            )
        med = statistics.median(r["first_step_done"] for r in slurm)
        lines += ["", f"Median: **{med:.2f} s** from `dtrain sbatch --submit` to the first step."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "RESULTS_cluster.md")
    args = p.parse_args()
    args.rounds = 1 if args.quick else 3
    sizes = ["1K", "64K", "1M", "16M"] if args.quick else SIZES
    results: dict = {"allreduce": {}}
    with tempfile.TemporaryDirectory(prefix="dtrain-cluster-bench-") as tmp:
        work = Path(tmp)
        for n in (2, 4):
            results["allreduce"][str(n)] = allreduce(n, sizes, args.rounds, work)
        why = ensure_slurm()
        results["slurm"] = why or submit_to_first_step(1 if args.quick else 3, work)
    args.out.write_text(render(results, args))
    (args.out.with_suffix(".json")).write_text(json.dumps(results, indent=2))
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
