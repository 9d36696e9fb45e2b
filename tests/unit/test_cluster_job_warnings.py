"""``dtrain sbatch`` printed none of the plan's warnings, and neither it nor ``dtrain k8s``
checked the memory the plan estimates: a layout 12x above its GPUs' memory, or a script
that reads its rank from SLURM_PROCID, was submitted without a word, to fail after its
wait in the queue. Both now say what ``dtrain plan`` says, planned on the job's nodes."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from dtrain_cli.cli.app import app

runner = CliRunner()
TOO_BIG = [
    "recipe=gpt_1b",
    "parallel.strategy=fsdp",
    "parallel.nnodes=2",
    "cluster.gpus_per_node=8",
]
SAYS = "warning: peak memory per device estimated at 971 GiB, above hardware=h100_80g's 78 GiB"
REMEDY = "train.micro_batch_size=16 (gradient accumulation keeps the global batch)"


def _warnings(result) -> list[str]:
    assert result.exit_code == 0, result.output
    return [" ".join(w.split()) for w in result.stderr.split("warning: ")[1:]]


def test_sbatch_says_a_layout_above_its_gpus_memory_and_what_fits(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["sbatch", *TOO_BIG, "--dry-run"], env={"COLUMNS": "400"})
    said = _warnings(result)
    assert any(("warning: " + w).startswith(SAYS) and REMEDY in w for w in said), said
    assert result.stdout.startswith("#!/bin/bash")  # the script still printed, alone
    fits = runner.invoke(app, ["sbatch", *TOO_BIG, "train.micro_batch_size=16", "--dry-run"])
    assert not any("peak memory" in w for w in _warnings(fits))


def test_k8s_says_it_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    image = "cluster.image=registry.example/team/train:1.0"
    result = runner.invoke(
        app, ["k8s", *TOO_BIG, image, "cluster.pvc=runs", "--dry-run"], env={"COLUMNS": "400"}
    )
    said = _warnings(result)
    assert any(("warning: " + w).startswith(SAYS) and REMEDY in w for w in said), said


def test_a_gpu_job_on_the_cpu_profile_is_said(tmp_path, monkeypatch):
    """hardware defaults to this machine's CPU: a GPU job's step time, MFU and a pod's grace
    period were estimated on it without a word (gpt_1b's pods: 546,492 s, 6 days to be
    killed, a platform engineer's find)."""
    monkeypatch.chdir(tmp_path)
    gpus = ["recipe=gpt_small", "nodes=2", "gpus_per_node=8", "dp=16"]
    image = ["cluster.image=registry.example/team/train:1.0", "cluster.pvc=runs"]
    for command in (["sbatch", *gpus], ["k8s", *gpus, *image]):
        said = _warnings(runner.invoke(app, [*command, "--dry-run"], env={"COLUMNS": "400"}))
        assert any(w.startswith("hardware=cpu: a CPU's profile for a job of GPUs") for w in said)
        on_h100 = runner.invoke(app, [*command, "hardware=h100_80g", "--dry-run"])
        assert not any(w.startswith("hardware=") for w in _warnings(on_h100))
    slow = ["k8s", "recipe=gpt_1b", *gpus[1:], *image, "hardware=cpu", "--dry-run"]
    said = _warnings(runner.invoke(app, slow, env={"COLUMNS": "400"}))
    assert any(w.startswith("terminationGracePeriodSeconds=") for w in said), said


def test_sbatch_says_what_the_plan_says_of_a_script_and_of_unread_keys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import os\nrank = int(os.environ['SLURM_PROCID'])\n")
    args = ["sbatch", "parallel.nnodes=2", "dp=4", "--dry-run", "--", "train.py"]
    said = _warnings(runner.invoke(app, args, env={"COLUMNS": "400"}))
    assert any(w.startswith("script train.py line 2 reads SLURM_PROCID") for w in said), said
    unread = runner.invoke(app, ["sbatch", "recipe=gpt_tiny", "pipeline.schedule=gpipe"])
    assert any("pipeline.schedule" in w for w in _warnings(unread))


REFUSED = "971 GiB, 12.5x hardware=h100_80g's 78 GiB: not submitted"


def test_sbatch_submit_refuses_a_layout_far_above_its_gpus_memory(tmp_path, monkeypatch):
    """12x its memory waited in the queue to fail at step 1; now exit 2, nothing written,
    unless --force (then it goes on to sbatch, absent from this PATH)."""
    monkeypatch.chdir(tmp_path)
    env = {"COLUMNS": "400", "PATH": str(tmp_path)}
    result = runner.invoke(app, ["sbatch", *TOO_BIG, "--submit"], env=env)
    assert result.exit_code == 2, result.output
    assert REFUSED in result.stderr and "--force submits it anyway" in result.stderr
    assert "Traceback" not in result.output and not (tmp_path / "runs").exists()
    forced = runner.invoke(app, ["sbatch", *TOO_BIG, "--submit", "--force"], env=env)
    assert forced.exit_code == 1 and "sbatch: not found on PATH" in forced.stderr, forced.output
    # under 1.5x its memory it is a warning only (the estimate is within 10% of published)
    near = [*TOO_BIG, "train.micro_batch_size=32", "parallel.activation_checkpointing=selective"]
    said = runner.invoke(app, ["sbatch", *near, "--submit"], env=env)
    assert said.exit_code == 1 and "not submitted" not in said.stderr, said.output


def test_a_jobs_first_step_is_timed_from_its_own_start_not_its_submission(monkeypatch):
    """The submission's time went into the job's environment: a requeued job (or one that
    waited in the queue) said 'first step done 187 s after launch (agent 186 s ...)' (a new
    user's find). The job's agent marks its own start."""
    import subprocess

    from dtrain_cli.cli import sbatch_cmd
    from dtrain_cli.rundir import env as launch_env

    seen = {}

    def fake_sbatch(args, **kwargs):
        seen.update(kwargs["env"])
        return subprocess.CompletedProcess(args, 0, stdout="42\n", stderr="")

    monkeypatch.setenv(launch_env.LAUNCH_T0, "123.0")  # this shell's own launch, say
    monkeypatch.setattr(sbatch_cmd.subprocess, "run", fake_sbatch)
    assert sbatch_cmd.run_sbatch(Path("job.sbatch"), lambda line, code: None) == "42"
    assert launch_env.LAUNCH_T0 not in seen


def test_sbatch_says_a_script_without_a_signal_handler_loses_its_work_to_the_time_limit(
    tmp_path, monkeypatch
):
    """A script with no SIGUSR1 handler was killed 120 s before the time limit with no word
    at submission (a new user's find); the guide's examples/train.py handles it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "naive.py").write_text("import time\nfor _ in range(200):\n    time.sleep(0.2)\n")
    args = ["sbatch", "dp=1", "--dry-run", "--", "naive.py"]
    said = _warnings(runner.invoke(app, args, env={"COLUMNS": "400"}))
    assert (
        "script naive.py sets no signal handler: SLURM's SIGUSR1 120 s before the time limit "
        "(cluster.signal, signal_lead_s) and a requeue's SIGTERM end it without a checkpoint"
    ) in " ".join(said), said
    example = Path(__file__).resolve().parents[2] / "examples" / "train.py"
    args = ["sbatch", "dp=1", "--dry-run", "--", str(example)]
    assert not any("signal handler" in w for w in _warnings(runner.invoke(app, args)))
