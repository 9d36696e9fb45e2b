"""Every file and folder of a run directory, by name, in one object.

    runs/gpt_small-20261201-101500/      RunDir(path): .config, .plan, .rank_log(0), ...

``ENTRIES`` is the listing users read (``docs/run-directory.md`` is checked against it by a
test): a file a run dir gains must be named here, with what it holds and who writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONFIG_FILE = "config.yaml"
PLAN_FILE = "plan.yaml"
"""The two files every process of a run reads (a pod gets them from its ConfigMap)."""

ENTRIES: dict[str, str] = {
    CONFIG_FILE: "the fully resolved config (the launcher writes it; workers never compose)",
    PLAN_FILE: "the plan, with the rank -> (pp, dp, tp) table",
    "metrics.jsonl": "one line per logging window (train), validation (val) and other records",
    "summary.json": "the outcome: losses, tokens/s, start-up breakdown, per-rank times, memory",
    "first_step.json": "rank 0 wrote it when the first optimizer step finished: the run trained",
    "tb/": "TensorBoard scalars (logging.tensorboard=true)",
    "checkpoints/": "step_<N>/ (sharded DCP checkpoints with a manifest), latest",
    "resumes.jsonl": "one line per `dtrain resume` of this run (checkpoint, overrides)",
    "preempted.json": "the run stopped for a preemption with its checkpoint saved (exit 75)",
    "finished.json": "a dtrain run script's run that ended well (exit 0): when",
    "launch.json": "multi-node launches: the rendezvous id of the node that created the dir",
    "launcher.lock": (
        "held by a single-node run's launcher while it runs (its pid): a `dtrain resume` "
        "meanwhile is refused"
    ),
    "logs/rank_<k>.log": "every rank's log (your script's stdout and stderr under dtrain run)",
    "logs/elastic/": "torch's elastic agent: its error files per attempt",
    "logs/hang/": "the hang watchdog's records: every rank's stack and last collective",
    "logs/failures/": "a failing rank's note: its step and the time, for the launcher's report",
    "elastic/": "elastic runs: progress.json (size, last step), changes.jsonl (each resize)",
    "servers/": "sync.mode=param_server: server_<i>.json, each server's apply rate and staleness",
    "slurm/": (
        "dtrain sbatch: job.sbatch, job_id, job-<id>.out, FINISHED, rendezvous, "
        "join.sbatch, join-<id>.out"
    ),
    "profile/": "torch.profiler traces (debug.profile_steps)",
    "report/": "dtrain report's plots and tables",
    "simulate/": "dtrain simulate: rank_<k>.json and .log per simulated rank, report.json",
}


@dataclass(frozen=True)
class RunDir:
    """Paths of one run directory (nothing is created or read here)."""

    path: Path

    @property
    def config(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def plan(self) -> Path:
        return self.path / PLAN_FILE

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def summary(self) -> Path:
        return self.path / "summary.json"

    @property
    def first_step(self) -> Path:
        return self.path / "first_step.json"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tb"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def resumes(self) -> Path:
        return self.path / "resumes.jsonl"

    @property
    def preempted(self) -> Path:
        return self.path / "preempted.json"

    @property
    def finished(self) -> Path:
        return self.path / "finished.json"

    @property
    def launch_record(self) -> Path:
        return self.path / "launch.json"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank_{rank}.log"

    def rank_logs(self) -> list[Path]:
        return sorted(self.logs.glob("rank_*.log"))

    @property
    def agent_logs(self) -> Path:
        return self.logs / "elastic"

    @property
    def hang(self) -> Path:
        return self.logs / "hang"

    @property
    def failures(self) -> Path:
        return self.logs / "failures"

    @property
    def elastic(self) -> Path:
        return self.path / "elastic"

    @property
    def elastic_progress(self) -> Path:
        return self.elastic / "progress.json"

    @property
    def elastic_changes(self) -> Path:
        return self.elastic / "changes.jsonl"

    def server_record(self, shard: int) -> Path:
        """sync.mode=param_server: what server ``shard`` saw (rank 0 reads it at the end)."""
        return self.path / "servers" / f"server_{shard}.json"

    @property
    def slurm(self) -> Path:
        return self.path / "slurm"

    @property
    def slurm_finished(self) -> Path:
        """``dtrain agent`` writes it once its workers completed the run."""
        return self.slurm / "FINISHED"

    @property
    def slurm_rendezvous(self) -> Path:
        """``host:port id`` of an elastic SLURM job's current attempt."""
        return self.slurm / "rendezvous"

    @property
    def slurm_job_id(self) -> Path:
        """The job id ``dtrain sbatch --submit`` got."""
        return self.slurm / "job_id"

    @property
    def launcher_lock(self) -> Path:
        return self.path / "launcher.lock"

    @property
    def profile(self) -> Path:
        return self.path / "profile"

    def profile_trace(self, rank: int) -> Path:
        return self.profile / f"rank_{rank}.trace.json"

    @property
    def report(self) -> Path:
        return self.path / "report"

    def is_run(self) -> bool:
        """Holds a config and a plan (what every command that reads a run needs)."""
        return self.config.is_file() and self.plan.is_file()
