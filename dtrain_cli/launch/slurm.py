"""The sbatch script of a run, as a pure function of its config, plan and run dir. Torch-free.

    dtrain sbatch recipe=gpt_small nodes=2 gpus_per_node=8 partition=gpu time=04:00:00 --dry-run

One ``srun`` task per node starts dtrain's launcher (``dtrain agent RUN_DIR``), which runs
the same elastic agent as ``dtrain launch``: rendezvous at the first host of
``SLURM_JOB_NODELIST``, node rank from ``SLURM_NODEID``. The run dir is fixed when the job
is submitted, so a requeued job continues the same run from its newest checkpoint.
Preemption: SLURM sends ``cluster.signal`` to the batch shell ``signal_lead_s`` before the
time limit (``--signal=B:...``); the shell passes it to srun, the workers checkpoint at the
next logging step and exit 75; the shell then requeues the job when the run's own record
says it was preempted (``preempted.json``, written once the checkpoint is complete), not on
srun's exit code, unless ``slurm/FINISHED`` says the run completed.

Elastic runs (``parallel.nnodes=MIN:MAX``): the job asks for ``--nodes=MIN-MAX`` (SLURM
starts it with as many as it can give at once) and ``--no-kill``, and srun runs with
``--kill-on-bad-exit=0``, so a lost node's task ends alone and the agents left
re-rendezvous without it (:mod:`dtrain_cli.runtime.components.membership`). The job
succeeds on the run's own record
(``slurm/FINISHED``, which ``dtrain agent`` writes when its workers completed the run), not
on srun's exit code (the lost task's). Each attempt writes its rendezvous to
``slurm/rendezvous``; ``dtrain sbatch --join RUN_DIR`` submits nodes that join it
(:mod:`.slurm_join`): SLURM cannot add nodes to a running job. Node 0 (the batch host)
hosts the rendezvous: if it is lost SLURM ends the job, and a requeue continues.

Every value that reaches the shell is quoted with :func:`shlex.quote` (sbatch strips the
same quotes in ``#SBATCH`` lines); values that cannot be quoted there (newlines, control
characters) are refused as config errors. ``cluster.setup`` lines are the site's own shell
code and are written as they are.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from dtrain_cli.config.schema import ClusterConfig, DtrainConfig
from dtrain_cli.config.suggest import not_allowed
from dtrain_cli.plan.plan import Plan
from dtrain_cli.rundir.layout import RunDir
from dtrain_cli.rundir.protocol import SIGNAL_NAMES

SCRIPT_NAME = "job.sbatch"
SHELL_RUN = RunDir(Path("$RUN_DIR"))
"""The run dir's files as the job script names them (``$RUN_DIR/slurm/FINISHED``...)."""
FINISHED = SHELL_RUN.slurm_finished
RENDEZVOUS = SHELL_RUN.slurm_rendezvous
"""``host:port id`` of the elastic job's current attempt (`dtrain sbatch --join` reads it)."""
PREEMPTED = SHELL_RUN.preempted
RENDEZVOUS_TMP = RENDEZVOUS.with_name(f".{RENDEZVOUS.name}.tmp")
TIME_RE = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^\d+-\d+$|^(UNLIMITED|INFINITE)$")
MEM_RE = re.compile(r"^\d+[KMGT]?$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class SbatchJob:
    """Everything the script says, resolved (paths absolute)."""

    run_dir: Path
    job_name: str
    nnodes: int
    """The most nodes (the plan's)."""
    nproc_per_node: int
    python: str
    workdir: Path
    cluster: ClusterConfig
    node_command: list[str] = field(default_factory=list)
    """Arguments after ``$PYTHON -m dtrain_cli`` on every node (before the rdzv flags)."""
    summary: str = ""
    requeue: bool = True
    preemptible: bool = True
    """Training: SLURM warns with ``cluster.signal``; workers checkpoint and stop (exit 75)."""
    resume_hint: str = "dtrain resume --ckpt $RUN_DIR"
    """How to continue a preempted run by hand when the job is not requeued."""
    min_nnodes: int | None = None
    """Elastic (``parallel.nnodes=MIN:MAX``): the fewest nodes the run trains on."""

    @property
    def node_count(self) -> str:
        """``--nodes``/``--nnodes`` text: ``2``, or ``1-2`` for SLURM / ``1:2`` for dtrain."""
        return str(self.nnodes) if self.min_nnodes is None else f"{self.min_nnodes}-{self.nnodes}"


def cluster_problems(c: ClusterConfig) -> list[str]:
    """Value checks of the ``cluster`` group, one line each (exit 2 in the CLI)."""
    problems = []
    if not TIME_RE.match(c.time):
        problems.append(
            f"cluster.time={c.time!r}: not a SLURM time; use MM, HH:MM:SS or D-HH:MM:SS"
        )
    elif (limit := time_seconds(c.time)) is not None and limit <= c.signal_lead_s:
        problems.append(
            f"cluster.time={c.time} ({limit} s) is not longer than cluster.signal_lead_s="
            f"{c.signal_lead_s}: SLURM would send the preemption signal at the job's start, "
            "and the job checkpoint and requeue itself at once, again and again; a longer "
            "cluster.time, or a smaller cluster.signal_lead_s"
        )
    if c.signal.upper().removeprefix("SIG") not in SIGNAL_NAMES:
        problems.append(not_allowed("cluster.signal", repr(c.signal), SIGNAL_NAMES))
    for key, value, low in (
        ("gpus_per_node", c.gpus_per_node, 0),
        ("signal_lead_s", c.signal_lead_s, 1),
        ("max_requeues", c.max_requeues, 0),
        ("rdzv_port", c.rdzv_port, 0),
        ("cpus_per_task", c.cpus_per_task, 1),
    ):
        if value is not None and value < low:
            problems.append(f"cluster.{key}={value}: must be >= {low}")
    if c.rdzv_port > 65535:
        problems.append(f"cluster.rdzv_port={c.rdzv_port}: must be <= 65535 (0 = from job id)")
    if c.mem is not None and not MEM_RE.match(c.mem):
        problems.append(f"cluster.mem={c.mem!r}: use a SLURM size such as 64G or 500M")
    for key in c.env:
        if not ENV_KEY_RE.match(key):
            problems.append(f"cluster.env: {key!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)")
    for key, value in (
        ("partition", c.partition),
        ("account", c.account),
        ("qos", c.qos),
        ("python", c.python),
        *(("sbatch_args", a) for a in c.sbatch_args),
        *((f"env.{k}", v) for k, v in c.env.items()),
    ):
        problems += _one_line(f"cluster.{key}", value)
    for arg in c.sbatch_args:
        if not arg.startswith("-"):
            problems.append(
                f"cluster.sbatch_args: {arg!r} is not an option; e.g. --constraint=a100"
            )
    return problems


def time_seconds(text: str) -> int | None:
    """SLURM's time forms in seconds (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); None
    for UNLIMITED and for 0 (SLURM's "no limit" too)."""
    days, _, rest = text.rpartition("-") if "-" in text else ("0", "", text)
    if not rest.isdigit() and ":" not in rest:
        return None
    parts = [int(x) for x in rest.split(":")]
    if days != "0" or "-" in text:  # D-HH[:MM[:SS]]
        parts += [0] * (3 - len(parts))
        h, m, sec = parts
    elif len(parts) == 3:
        h, m, sec = parts
    else:  # MM or MM:SS
        h, m, sec = 0, parts[0], parts[1] if len(parts) > 1 else 0
    return ((int(days or 0) * 24 + h) * 60 + m) * 60 + sec or None


def _one_line(key: str, value: str | None) -> list[str]:
    if value is not None and CONTROL_RE.search(value):
        return [f"{key}={value!r}: newlines and control characters are not allowed"]
    return []


def job_problems(job: SbatchJob) -> list[str]:
    return (
        _one_line("job name (run.name)", job.job_name)
        + _one_line("run directory (run.root/run.name)", str(job.run_dir))
        + _one_line("working directory", str(job.workdir))
    )


def job_from_plan(
    cfg: DtrainConfig, plan: Plan, run_dir: Path, python: str, workdir: Path
) -> SbatchJob:
    """A training job: every node runs ``dtrain agent RUN_DIR``."""
    c = cfg.cluster
    low = plan.elastic.min_nnodes if plan.elastic is not None else None
    nodes = f"{low}-{plan.nnodes}" if low is not None else str(plan.nnodes)
    return SbatchJob(
        run_dir=run_dir,
        job_name=run_dir.name,
        nnodes=plan.nnodes,
        min_nnodes=low,
        nproc_per_node=plan.nproc_per_node,
        python=c.python or python,
        workdir=workdir,
        cluster=c,
        node_command=["agent", str(run_dir), "--nnodes", nodes.replace("-", ":")],
        summary=(
            f"run {run_dir.name} (script {shlex.join(plan.script.argv())}): {nodes} "
            f"node(s) x {plan.nproc_per_node} process(es), {plan.device}/{plan.backend}"
            if plan.script is not None  # your own script: it exits 75 to be requeued
            else f"run {run_dir.name} (recipe {plan.recipe}): {nodes} node(s) x "
            f"{plan.nproc_per_node} process(es), {plan.device}/{plan.backend}, {plan.steps} steps"
        ),
        requeue=c.requeue,
        **({"resume_hint": f"sbatch $RUN_DIR/slurm/{SCRIPT_NAME}"} if plan.script else {}),
    )


def validate_job(cfg: DtrainConfig, run_dir: Path, python: str, workdir: Path) -> SbatchJob:
    """A ``dtrain validate-cluster`` job on the requested nodes (``dtrain sbatch --validate``)."""
    c = cfg.cluster
    nproc = c.gpus_per_node or cfg.parallel.nproc_per_node or 1
    nnodes = cfg.parallel.nnodes
    return SbatchJob(
        run_dir=run_dir,
        job_name=run_dir.name,
        nnodes=nnodes,
        nproc_per_node=nproc,
        python=c.python or python,
        workdir=workdir,
        cluster=c,
        node_command=[
            "validate-cluster",
            "--nnodes",
            str(nnodes),
            "--nproc-per-node",
            str(nproc),
            "--run-dir",
            str(run_dir),
        ],
        summary=f"validate-cluster on {nnodes} node(s) x {nproc} process(es)",
        requeue=False,
        preemptible=False,
    )


def header_lines(job: SbatchJob) -> list[str]:
    """The ``#SBATCH`` lines."""
    c, q = job.cluster, shlex.quote
    # "%" starts a SLURM file-name pattern: "%%" is a literal one
    out_path = q(str(job.run_dir).replace("%", "%%") + "/slurm/job-%j.out")
    lines = [f"--job-name={q(job.job_name)}", f"--nodes={job.node_count}"]
    if job.min_nnodes is None:
        lines.append("--ntasks-per-node=1")
    else:
        # no task count: with one, SLURM derives the tasks from MIN and grants MIN nodes
        # even when MAX are idle (srun still runs one task per node); a lost node leaves
        # the job running on the others
        lines.append("--no-kill")
    if c.gpus_per_node:
        lines.append(f"--gpus-per-node={c.gpus_per_node}")
    if c.cpus_per_task:
        lines.append(f"--cpus-per-task={c.cpus_per_task}")
    if c.mem:
        lines.append(f"--mem={q(c.mem)}")
    lines.append(f"--time={q(c.time)}")
    for key in ("partition", "account", "qos"):
        value = getattr(c, key)
        if value:
            lines.append(f"--{key}={q(value)}")
    lines += [f"--output={out_path}", f"--error={out_path}", "--open-mode=append"]
    lines.append("--requeue" if job.requeue else "--no-requeue")
    if job.preemptible:
        sig = c.signal.upper().removeprefix("SIG")
        lines.append(f"--signal=B:{sig}@{c.signal_lead_s}")
    lines += [q(a) for a in c.sbatch_args]
    return [f"#SBATCH {line}" for line in lines]


def setup_lines(job: SbatchJob) -> list[str]:
    """After the ``#SBATCH`` lines: shell options, the run's paths, the site's own setup
    (``cluster.setup``, as written) and environment (``cluster.env``, quoted)."""
    c, q = job.cluster, shlex.quote
    lines = [
        "set -uo pipefail",
        "",
        f"RUN_DIR={q(str(job.run_dir))}",
        f"PYTHON={q(job.python)}",
        f"cd {q(str(job.workdir))} || exit 1",
    ]
    if c.setup:
        lines += ["", "# site setup (cluster.setup)", *c.setup]
    if c.env:
        lines += ["", *(f"export {k}={q(v)}" for k, v in sorted(c.env.items()))]
    return lines


def render_sbatch(job: SbatchJob) -> str:
    """The script text. Pure: the same job gives the same bytes (golden-file tested)."""
    script_path = shlex.quote(str(RunDir(job.run_dir).slurm / SCRIPT_NAME))
    lines = [
        "#!/bin/bash",
        f"# dtrain sbatch: {comment_text(job.summary)}",
        f"# Resubmit (continues from the newest checkpoint): sbatch {comment_text(script_path)}",
        *header_lines(job),
        *setup_lines(job),
        "",
        *attempt_lines(job),
        *srun_lines(job),
        *requeue_lines(job),
    ]
    return "\n".join(lines)


def attempt_lines(job: SbatchJob) -> list[str]:
    """This attempt of the job: a finished run stops here; the rendezvous address and id
    (one per requeue), the signal trap, the stale preemption record gone."""
    c = job.cluster
    sig = c.signal.upper().removeprefix("SIG")
    port = str(c.rdzv_port) if c.rdzv_port else "$((20000 + SLURM_JOB_ID % 20000))"
    lines = [
        'echo "dtrain: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on'
        ' $SLURM_JOB_NODELIST"',
        f'if [ -e "{FINISHED}" ]; then',
        '  echo "dtrain: $RUN_DIR already finished; not running it again"',
        "  exit 0",
        "fi",
        # this job's id (a resubmit by hand of job.sbatch: not the one --submit got)
        f'echo "$SLURM_JOB_ID" > "{SHELL_RUN.slurm_job_id}"',
        'RDZV_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"RDZV_PORT={port}",
        "TRAPPED=0",
        'forward() { TRAPPED=1; echo "dtrain: got SIG$1, workers checkpoint and stop"; '
        'kill -s "$1" "$SRUN_PID" 2>/dev/null; }',
        f"trap 'forward {sig}' {sig}",
        # the run's own record of a preemption (rank 0 writes it once the checkpoint is
        # complete); one left from an earlier attempt must not requeue this one
        f'rm -f "{PREEMPTED}"',
        'RDZV_ID="dtrain-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"',
    ]
    if job.min_nnodes is not None:  # where `dtrain sbatch --join` jobs find this attempt
        lines += [
            f'echo "$RDZV_HOST:$RDZV_PORT $RDZV_ID" > "{RENDEZVOUS_TMP}" &&'
            f' mv "{RENDEZVOUS_TMP}" "{RENDEZVOUS}"',
        ]
    return lines


def srun_cpus(job: SbatchJob) -> str:
    """The job's CPUs for its one task a node: srun of SLURM 22.05-23.02 does not inherit
    sbatch's ``--cpus-per-task`` (the agent and all its workers got one CPU a node)."""
    return f"--cpus-per-task={job.cluster.cpus_per_task} " if job.cluster.cpus_per_task else ""


def srun_lines(job: SbatchJob) -> list[str]:
    """One ``dtrain agent`` task per node, waited for through trapped signals; a run its
    agents finished exits 0."""
    node_cmd = " ".join(shlex.quote(a) for a in job.node_command)
    # elastic: a task that ends (a lost node) ends alone; the agents left go on without it
    kill = (
        "--no-kill --kill-on-bad-exit=0" if job.min_nnodes is not None else "--kill-on-bad-exit=1"
    )
    return [
        # one task per node; SLURM_NODEID (node rank) is read by `dtrain agent` on each node
        f'srun --export=ALL --ntasks-per-node=1 {srun_cpus(job)}{kill} "$PYTHON" -m dtrain_cli '
        f"{node_cmd} \\",
        '  --rdzv-endpoint "$RDZV_HOST:$RDZV_PORT" --rdzv-id "$RDZV_ID" &',
        "SRUN_PID=$!",
        "while :; do",
        "  TRAPPED=0",
        '  wait "$SRUN_PID"; rc=$?',
        '  [ "$TRAPPED" = 1 ] && [ "$rc" -gt 128 ] || break  # a trap cut the wait short',
        "done",
        # the run's own record: an agent whose workers completed the run wrote FINISHED (an
        # elastic job's srun reports the lost node's task)
        f'if [ "$rc" -eq 0 ] || [ -e "{FINISHED}" ]; then',
        f'  [ -e "{FINISHED}" ] || date > "{FINISHED}"'
        "  # a requeue of a finished run exits at once",
        '  echo "dtrain: finished"',
        "  exit 0",
        "fi",
    ]


def requeue_lines(job: SbatchJob) -> list[str]:
    """A preempted attempt requeues the job (up to ``cluster.max_requeues``); any other
    ending exits with srun's code."""
    c = job.cluster
    lines = []
    if job.requeue:
        # requeue on the marker, not on srun's code: srun reports the first task that ended
        # (a node that exited 75 first gets the others killed: 143)
        lines += [
            f'if [ -e "{PREEMPTED}" ] && [ ! -e "{FINISHED}" ]; then',
            f'  if [ "${{SLURM_RESTART_COUNT:-0}}" -lt {c.max_requeues} ]; then',
            '    echo "dtrain: checkpoint saved (srun exited with $rc); requeueing job'
            ' $SLURM_JOB_ID"',
            '    scontrol requeue "$SLURM_JOB_ID" && exit 0',
            "  fi",
            f'  echo "dtrain: not requeued (cluster.max_requeues={c.max_requeues} or scontrol'
            f' failed); continue with: {job.resume_hint}"',
            "fi",
        ]
    return [*lines, 'echo "dtrain: srun exited with $rc"', 'exit "$rc"', ""]


def comment_text(text: str) -> str:
    """Text for a ``#`` comment line: one line, nothing that could end the comment."""
    return CONTROL_RE.sub("?", text)
