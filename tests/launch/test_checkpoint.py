"""Checkpoints you can trust: exact continuation, resharding, atomic saves, recovery, export."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from dtrain_cli.checkpoint import catalog
from tests.conftest import Run, run_dtrain, wait_for_checkpoint

pytestmark = pytest.mark.multiproc

# A small synthetic corpus (140 train windows) so 20 steps of 8 samples cross an epoch:
# the resume at step 10 is mid-epoch, and the stream must continue exactly.
CK = [
    "recipe=gpt_tiny",
    "data=synthetic",
    "data.synthetic_tokens=20000",
    "train.steps=20",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
    "logging.every=1",
    "checkpoint.every_steps=10",
    "train.eval_every=0",
    "optim.warmup_steps=2",
    "logging.tensorboard=false",
    "debug.replica_check_at_end=true",  # param_digest
]


def launch_ok(cwd: Path, *args: str, env: dict | None = None) -> Run:
    run = run_dtrain(["launch", *CK, *args], cwd, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def interrupted(cwd: Path, dp: int, fault: str) -> Path:
    run = run_dtrain(["launch", *CK, f"dp={dp}"], cwd, env={"DTRAIN_FAULTS": fault})
    assert run.returncode != 0
    assert run.run_dir is not None
    return run.run_dir


def resume(run_dir: Path, *args: str, ckpt: Path | None = None) -> Run:
    run = run_dtrain(["resume", "--ckpt", str(ckpt or run_dir), *args], run_dir.parent.parent)
    run.run_dir = run_dir
    return run


def train_steps(run: Run) -> list[int]:
    return [r["step"] for r in run.metrics()]


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict[int, Run]:
    return {dp: launch_ok(tmp_path_factory.mktemp(f"straight{dp}"), f"dp={dp}") for dp in (1, 2)}


@pytest.fixture(scope="module")
def killed_dp2(tmp_path_factory) -> Path:
    """dp=2 killed (SIGKILL, rank 0) after step 13: step_000010 is the newest checkpoint."""
    return interrupted(tmp_path_factory.mktemp("killed2"), 2, "kill:step=13:rank=0")


def copy_run(run_dir: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "runs" / run_dir.name
    shutil.copytree(run_dir, dest)
    return dest


@pytest.mark.parametrize("dp", [1, 2])
def test_exact_continuation_is_bitwise(dp, straight, killed_dp2, tmp_path):
    run_dir = (
        copy_run(killed_dp2, tmp_path)
        if dp == 2
        else interrupted(tmp_path, 1, "kill:step=13:rank=0")
    )
    assert (catalog.checkpoints_dir(run_dir) / "latest").read_text().strip() == "step_000010"
    done = resume(run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert train_steps(done) == list(range(1, 21))  # no duplicate, none missing
    ref = straight[dp]
    assert [r["loss"] for r in done.metrics()] == [r["loss"] for r in ref.metrics()]
    assert done.summary()["param_digest"] == ref.summary()["param_digest"]
    assert done.summary()["resumed_from"] == "step_000010"


def test_exact_continuation_with_powersgd_is_bitwise(tmp_path):
    """PowerSGD's per-rank state (error feedback, warm-start P/Q, its RNG) is in the
    checkpoint: killed after step 13, resumed from step 10, the run is the straight one."""
    psgd = ["dp=2", "comm.compression=powersgd", "comm.powersgd_rank=2"]
    psgd += ["comm.powersgd_start_iter=2"]  # compressing from step 3: state at step 10
    (tmp_path / "a").mkdir()
    ref = launch_ok(tmp_path / "a", *psgd)
    run = run_dtrain(["launch", *CK, *psgd], tmp_path, env={"DTRAIN_FAULTS": "kill:step=13:rank=1"})
    assert run.returncode != 0 and run.run_dir is not None
    done = resume(run.run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert train_steps(done) == list(range(1, 21))
    assert [r["loss"] for r in done.metrics()] == [r["loss"] for r in ref.metrics()]
    assert done.summary()["param_digest"] == ref.summary()["param_digest"]


@pytest.mark.parametrize(
    ("dp", "micro", "tp", "rel"), [(1, 4, 1, 1e-5), (4, 2, 1, 1e-5), (1, 4, 2, 1e-4)]
)
def test_resume_at_another_world_size_continues_the_curve(
    dp, micro, tp, rel, straight, killed_dp2, tmp_path
):
    """Also into tensor parallel: AdamW's checkpoint from dp=2 held ``foreach=True``, which
    overrode the per-tensor loop a tp layout needs (its first step failed: 'got mixed
    torch.Tensor and DTensor'). tp sums its shards' products in another order: 1e-4."""
    run_dir = copy_run(killed_dp2, tmp_path)
    done = resume(run_dir, f"dp={dp}", f"tp={tp}", f"train.micro_batch_size={micro}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert train_steps(done) == list(range(1, 21))
    for got, ref in zip(done.metrics(), straight[2].metrics(), strict=True):
        assert got["loss"] == pytest.approx(ref["loss"], rel=rel), got["step"]
    assert done.summary()["world_size"] == dp * tp
    assert done.summary()["param_sum"] == pytest.approx(straight[2].summary()["param_sum"], rel=rel)


@pytest.fixture(scope="module")
def every4(tmp_path_factory) -> tuple[Run, Path]:
    """Logged every 4 steps, saved at 10: the straight run, and one killed after step 13
    whose newest checkpoint (10) is inside the window of steps 9-12."""
    four = ["dp=2", "logging.every=4"]
    straight4 = launch_ok(tmp_path_factory.mktemp("every4"), *four)
    cwd = tmp_path_factory.mktemp("every4-killed")
    run = run_dtrain(["launch", *CK, *four], cwd, env={"DTRAIN_FAULTS": "kill:step=13:rank=0"})
    assert run.returncode != 0 and run.run_dir is not None
    return straight4, run.run_dir


@pytest.mark.parametrize(("dp", "rel"), [(2, 1e-6), (1, 1e-5)])
def test_a_resume_between_logging_steps_logs_the_whole_window(dp, rel, every4, tmp_path):
    """Step 12's loss is the mean of steps 9-12, two of them before the checkpoint: the
    resume logged steps 11-12 alone as step 12's (loss_steps 2, 6.6e-2 off the straight
    run, and dtrain compare said it diverged: a new user's find). The checkpoint keeps the
    open window, at any layout."""
    straight4, killed = every4
    run_dir = copy_run(killed, tmp_path)
    done = resume(run_dir, f"dp={dp}")
    assert done.returncode == 0, done.stderr[-3000:]
    got, want = done.metrics(), straight4.metrics()
    assert [r["step"] for r in got] == [4, 8, 12, 16, 20] == [r["step"] for r in want]
    assert [r["loss_steps"] for r in got] == [4, 4, 4, 4, 4]
    for a, b in zip(got, want, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=rel), a["step"]


def test_a_window_that_logging_every_moves_is_not_carried(every4, tmp_path):
    """Resumed with logging.every=5, step 15's window is steps 11-15, as a run logging every
    5 steps has it: the checkpoint's open window (from step 9) is not carried into it (a
    review's find: it logged steps 9-15 as step 15's)."""
    run_dir = copy_run(every4[1], tmp_path)
    done = resume(run_dir, "logging.every=5")
    assert done.returncode == 0, done.stderr[-3000:]
    logged = [(r["step"], r["loss_steps"]) for r in done.metrics()]
    assert logged == [(4, 4), (8, 4), (15, 5), (20, 5)]


def test_a_resume_that_trains_nothing_leaves_the_run_dir_as_it_was(killed_dp2, tmp_path):
    """A resume into another layout that fails before anything past its checkpoint is kept
    (no newer checkpoint, no logged step) left the run's config.yaml and plan.yaml in the
    layout that never trained, and a line in resumes.jsonl; they are as before now. The
    steps logged before the resume (11-13, after the step-10 checkpoint) do not count."""
    run_dir = copy_run(killed_dp2, tmp_path)
    files = ("config.yaml", "plan.yaml", "resumes.jsonl")
    before = {f: (run_dir / f).read_bytes() if (run_dir / f).exists() else None for f in files}
    run = run_dtrain(
        ["resume", "--ckpt", str(run_dir), "dp=1", "tp=2"],
        tmp_path,
        env={"DTRAIN_FAULTS": "kill:step=11:rank=0"},
    )
    assert run.returncode != 0
    assert "nothing trained past step 10: the run's config.yaml and plan.yaml are as before" in (
        run.stderr
    ), run.stderr[-2000:]
    after = {f: (run_dir / f).read_bytes() if (run_dir / f).exists() else None for f in files}
    assert after == before
    done = resume(run_dir)  # and it still resumes as it was
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.summary()["world_size"] == 2


def test_a_failed_resume_from_an_older_checkpoint_puts_the_newer_ones_back(straight, tmp_path):
    """A resume from an older checkpoint sets the newer ones aside; when it then failed
    before training past its step, they stayed in superseded/ and latest named the older
    one: the next plain resume lost the steps between (a new user's find)."""
    run_dir = copy_run(straight[2].run_dir, tmp_path)
    steps = [c.step for c in catalog.list_checkpoints(run_dir)]
    assert len(steps) >= 2, steps
    older = run_dir / "checkpoints" / catalog.step_dir_name(steps[-2])
    run = run_dtrain(
        ["resume", "--ckpt", str(older)],
        tmp_path,
        env={"DTRAIN_FAULTS": f"kill:step={steps[-2] + 1}:rank=0"},
    )
    assert run.returncode != 0
    assert "newer checkpoint set aside" in run.stderr
    assert "its newer checkpoints back in place" in " ".join(run.stderr.split()), run.stderr[-2000:]
    assert [c.step for c in catalog.list_checkpoints(run_dir)] == steps
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert latest == catalog.step_dir_name(steps[-1])
    assert not list((run_dir / "checkpoints" / "superseded").glob("*"))


def test_a_resume_that_cannot_write_its_record_puts_the_newer_checkpoints_back(straight, tmp_path):
    """A full disk at the resume's record (resumes.jsonl, config.yaml) came after the newer
    checkpoints were set aside and outside the code that puts them back: a traceback, and
    the next plain resume started from the older step (a user's find). Here the record
    cannot be written because a folder stands at its name."""
    run_dir = copy_run(straight[2].run_dir, tmp_path)
    steps = [c.step for c in catalog.list_checkpoints(run_dir)]
    (run_dir / "resumes.jsonl").unlink(missing_ok=True)
    (run_dir / "resumes.jsonl").mkdir()
    older = run_dir / "checkpoints" / catalog.step_dir_name(steps[-2])
    run = run_dtrain(["resume", "--ckpt", str(older)], tmp_path)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    line = next(x for x in run.stderr.splitlines() if x.startswith("error:"))
    assert line.startswith(f"error: {run_dir}: cannot record this resume (Is a directory)"), line
    assert [c.step for c in catalog.list_checkpoints(run_dir)] == steps
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert latest == catalog.step_dir_name(steps[-1])


def test_crash_during_save_keeps_the_previous_checkpoint(straight, tmp_path):
    run_dir = interrupted(tmp_path, 2, "kill_in_save:step=20:rank=1")
    root = catalog.checkpoints_dir(run_dir)
    assert (root / "latest").read_text().strip() == "step_000010"
    # the half-written one, never visible: removed by rank 0, whose save failed with it
    assert not list(root.glob(".tmp-step_000020-*")), sorted(p.name for p in root.iterdir())
    assert [c.step for c in catalog.list_checkpoints(run_dir)] == [10]
    done = resume(run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.summary()["param_digest"] == straight[2].summary()["param_digest"]
    assert not list(root.glob(".tmp-*"))  # cleaned once a newer checkpoint was complete


def test_automatic_recovery_after_sigkill(straight, tmp_path):
    """max_restarts=1: the agent restarts the group, which resumes from the newest complete
    (async-saved) checkpoint by itself; the result equals the uninterrupted run bitwise."""
    cmd = [
        "launch",
        *CK,
        "dp=2",
        "launcher.max_restarts=1",
        "checkpoint.every_steps=5",
        "checkpoint.async_save=true",
    ]
    run = run_dtrain(cmd, tmp_path, timeout=240, env={"DTRAIN_FAULTS": "kill:step=13:rank=1"})
    assert run.returncode == 0, run.stderr[-3000:]
    # async: the step-10 save may still have been in flight when rank 1 died at step 13
    assert run.summary()["resumed_from"] in ("step_000005", "step_000010")
    # colleague's c: the console says who died, that the group restarted, and from where
    said = next(line for line in run.stdout.splitlines() if line.startswith("restarted"))
    step = int(run.summary()["resumed_from"].split("_")[1])
    assert said == (
        "restarted (attempt 1 of 1) after rank 1 was killed by SIGKILL after step 13; "
        f"resuming from checkpoint {run.summary()['resumed_from']} (step {step})"
    )
    assert train_steps(run) == list(range(1, 21))
    assert run.summary()["param_digest"] == straight[2].summary()["param_digest"]
    assert [c.step for c in catalog.list_checkpoints(run.run_dir)] == [10, 15, 20]


def test_async_saves_every_step_keep_every_ranks_files(tmp_path):
    """An async save finished at the next save's start: rank 0 published it and pruned
    every .tmp-* folder, among them the next save's, which rank 1 had begun to write: 2 of
    3 checkpoints lost rank 1's RNG and own state, and --verify passed them. The next
    save's folder stays now, and --verify names a rank's missing file."""
    cmd = ["launch", *CK, "dp=2", "train.steps=6", "checkpoint.every_steps=2"]
    run = run_dtrain([*cmd, "checkpoint.async_save=true"], tmp_path, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "pruned .tmp-" not in run.stdout + run.stderr
    kept = catalog.list_checkpoints(run.run_dir)
    assert [c.step for c in kept] == [2, 4, 6]
    for c in kept:
        assert {f"rng_rank_{k}.safetensors" for k in (0, 1)} <= {p.name for p in c.path.iterdir()}
    ok = run_dtrain(["checkpoints", str(run.run_dir), "--verify"], tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lost = kept[-1].path / "rng_rank_1.safetensors"
    lost.unlink()
    manifest = kept[-1].path / catalog.MANIFEST
    files = json.loads(manifest.read_text())
    files["files"].pop(lost.name)  # as the race left it: not in the manifest either
    manifest.write_text(json.dumps(files))
    bad = run_dtrain(["checkpoints", str(run.run_dir), "--verify"], tmp_path)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert f"error: {kept[-1].path}: no rng_rank_1.safetensors of its 2 ranks" in bad.stderr


def test_corrupted_and_truncated_shards_are_named_and_skipped(straight, tmp_path):
    run_dir = copy_run(straight[2].run_dir, tmp_path)
    newest = catalog.checkpoints_dir(run_dir) / "step_000020"
    shard = newest / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    explicit = resume(run_dir, "train.steps=30", ckpt=newest)
    assert explicit.returncode == 2
    assert f"{shard}: corrupted" in explicit.stderr.replace("\n", "")
    table = run_dtrain(["checkpoints", str(run_dir), "--verify"], tmp_path)
    assert "corrupted" in table.stdout
    fallback = resume(run_dir, "train.steps=30")
    assert fallback.returncode == 0, fallback.stderr[-3000:]
    assert "skipping step_000020" in fallback.stderr
    assert fallback.summary()["resumed_from"] == "step_000010"
    assert train_steps(fallback) == list(range(1, 31))
    # truncated: the size check catches it without reading the data
    other = copy_run(straight[2].run_dir, tmp_path / "t")
    shard = catalog.checkpoints_dir(other) / "step_000020" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    bad = resume(other, "train.steps=30", ckpt=shard.parent)
    assert bad.returncode == 2 and "truncated" in bad.stderr


def test_verify_exits_nonzero_on_corruption_with_the_whole_path(straight, tmp_path):
    deep = tmp_path / ("a-long-folder-name-" * 4) / "more"  # the path is wider than 80 columns
    run_dir = copy_run(straight[2].run_dir, deep)
    ok = run_dtrain(["checkpoints", str(run_dir), "--verify"], tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "latest" in ok.stdout and "error" not in ok.stderr
    shard = catalog.checkpoints_dir(run_dir) / "step_000020" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    bad = run_dtrain(["checkpoints", str(run_dir), "--verify"], tmp_path)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    lines = bad.stderr.splitlines()
    assert f"error: {shard}: corrupted (sha256 does not match the manifest)" in lines
    assert "error: latest -> step_000020 is bad; a resume uses step_000010 instead" in lines
    # without --verify only sizes are checked: a truncated file is found too
    shard.write_bytes(bytes(data[:100]))
    quick = run_dtrain(["checkpoints", str(run_dir)], tmp_path)
    assert quick.returncode == 1 and f"error: {shard}: truncated" in quick.stderr


def test_a_checkpoint_before_the_first_logged_loss_says_none(tmp_path):
    """A save before any logging window has no loss to record: meta.json says null (it
    wrote NaN, which is not JSON) and `dtrain checkpoints` shows '-' (it showed 'nan')."""
    run = run_dtrain(
        ["launch", *CK, "train.steps=4", "logging.every=3", "checkpoint.every_steps=2"],
        tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]

    def meta(step: int) -> dict:
        path = catalog.checkpoints_dir(run.run_dir) / f"step_{step:06d}" / "meta.json"
        return json.loads(path.read_text(), parse_constant=pytest.fail)  # NaN: not JSON

    assert meta(2)["loss"] is None
    assert meta(4)["loss"] == pytest.approx(run.metrics()[-1]["loss"], rel=1e-6)
    table = run_dtrain(["checkpoints", str(run.run_dir)], tmp_path, env={"COLUMNS": "200"})
    assert table.returncode == 0 and "nan" not in table.stdout.lower(), table.stdout
    lines = table.stdout.splitlines()
    header = [cell.strip() for cell in next(x for x in lines if "┃ step" in x).split("┃")]
    rows = {cells[1].strip(): cells for cells in (x.split("│") for x in lines) if len(cells) > 2}
    loss = header.index("loss")
    assert rows["2"][loss].strip() == "-" and rows["4"][loss].strip() != "-", table.stdout


def test_export_round_trip(straight, tmp_path):
    import torch
    from safetensors.torch import load_model

    from dtrain_cli.models.gpt import GPTConfig
    from dtrain_cli.models.gpt.net import GPT

    ref = straight[2]
    out = tmp_path / "model.safetensors"
    ckpt = catalog.checkpoints_dir(ref.run_dir) / "step_000020"
    done = run_dtrain(["export", "--ckpt", str(ckpt), "--out", str(out)], tmp_path)
    assert done.returncode == 0, done.stderr
    info = json.loads(out.with_suffix(".json").read_text())
    model = GPT(GPTConfig(**info["model"]))
    load_model(model, str(out))
    import hashlib

    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    assert h.hexdigest() == ref.summary()["param_digest"]  # the trained weights, bit for bit
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(tokens)
    assert logits.shape == (2, 16, 256) and torch.isfinite(logits).all()
    # into a folder that exists: its model.safetensors (it was 'cannot write (Is a directory)')
    folder = tmp_path / "exported"
    folder.mkdir()
    done = run_dtrain(["export", str(ckpt), "--out", str(folder)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert (folder / "model.safetensors").read_bytes() == out.read_bytes()
    assert json.loads((folder / "model.json").read_text())["model"] == info["model"]
    new = tmp_path / "new"  # a folder named with a trailing /: made (it was another file)
    done = run_dtrain(["export", str(ckpt), "--out", f"{new}/"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert (new / "model.safetensors").read_bytes() == out.read_bytes()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--ckpt", "/nonexistent/run"], "/nonexistent/run: no such file or folder"),
        (["--ckpt", "{empty}"], "no complete checkpoint"),
        (["--ckpt", "{run}", "model.n_layer=2"], "model.n_layer=2: cannot change on resume"),
        (["--ckpt", "{run}", "train.steps=20"], "already at step 20"),
        (["--ckpt", "{run}", "data.path=x"], "data.path=x: cannot change on resume"),
        (  # it waited for a second node up to launcher.rdzv_timeout_s (900 s), saying nothing
            ["{run}", "parallel.nnodes=2", "train.steps=30"],
            "parallel.nnodes=2: dtrain resume starts this machine's workers only; continue "
            "here with parallel.nnodes=1",
        ),
    ],
)
def test_resume_bad_input(args, expected, straight, tmp_path):
    empty = tmp_path / "runs" / "empty"
    (empty / "checkpoints" / ".tmp-step_000005-x").mkdir(parents=True)
    (empty / "plan.yaml").write_text("{}")
    args = [a.format(empty=empty, run=straight[2].run_dir) for a in args]
    before = sorted(p.name for p in catalog.checkpoints_dir(straight[2].run_dir).iterdir())
    run = run_dtrain(["resume", *args], tmp_path)
    assert run.returncode == 2, run.stderr
    assert expected in run.stderr.replace("\n", "") and "Traceback" not in run.stderr
    assert sorted(p.name for p in catalog.checkpoints_dir(straight[2].run_dir).iterdir()) == before


def _mount_tmpfs(path: Path, options: str) -> None:
    path.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True)


@pytest.mark.parametrize(
    ("options", "cause"), [("size=12m", "No space left on device"), ("ro", "Read-only file system")]
)
def test_save_failure_is_one_line_and_keeps_the_last_good(options, cause, tmp_path):
    ckpts = tmp_path / "runs" / "r" / "checkpoints"
    _mount_tmpfs(ckpts, options)
    try:
        run = run_dtrain(
            ["launch", *CK, "dp=2", "run.name=r", "checkpoint.every_steps=5"], tmp_path
        )
        assert run.returncode != 0
        line = next(ln for ln in run.stderr.splitlines() if ln.startswith("error:"))
        if options == "ro":  # said before the start: every step up to the first save was lost
            assert line == (
                f"error: {ckpts}: cannot be written (read-only, or not this user's); the run's "
                "checkpoints go there: make it writable, or resume a copy of the run elsewhere"
            ), line
            assert run.returncode == 2 and "first step done" not in run.stdout + run.stderr
            return
        assert "cannot write checkpoint" in line and cause in line
        assert "Traceback" not in run.stderr.split(line)[1]
        # the partial save is removed: it kept the full disk full (a user's find)
        assert "the partial save is removed" in line
        assert not list(ckpts.glob(".tmp-*")), sorted(p.name for p in ckpts.iterdir())
        # the first save fit: it stays the newest complete
        assert (ckpts / "latest").read_text().strip() == "step_000005"
        catalog.verify(ckpts / "step_000005")
    finally:
        subprocess.run(["umount", str(ckpts)], check=False)


@pytest.mark.multiproc
def test_resume_of_a_run_still_training_is_refused(tmp_path):
    """A resume of a run still training started a second group in its run dir: each pruned
    the other's checkpoint in progress and the first died (a new user's find). The running
    launcher holds the run dir; the resume is one line, exit 2, and changes nothing."""
    import os
    import signal

    from tests.conftest import DTRAIN, cache_dir

    args = ["launch", "recipe=gpt_tiny", "dp=2", "train.steps=100000", "checkpoint.every_steps=2",
            "logging.tensorboard=false", "run.name=busy"]  # fmt: skip
    env = {**os.environ, "DTRAIN_CACHE": str(cache_dir())}
    proc = subprocess.Popen([*DTRAIN, *args], cwd=tmp_path, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    run_dir = tmp_path / "runs" / "busy"
    try:
        wait_for_checkpoint(run_dir, 2, proc)
        before = sorted(p.name for p in run_dir.iterdir())
        resumed = run_dtrain(["resume", str(run_dir), "train.steps=200000"], tmp_path)
        assert proc.poll() is None  # still training
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    assert resumed.returncode == 2
    (line,) = resumed.stderr.strip().splitlines()
    assert line.startswith(f"error: {run_dir}: in use by a running dtrain (pid {proc.pid} since ")
    assert "dtrain launch recipe=gpt_tiny dp=2" in line and line.endswith("then resume")
    assert not (run_dir / "resumes.jsonl").exists() and "superseded" not in before
