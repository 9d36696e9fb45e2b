"""``dtrain resume`` planned the continued run without what ``dtrain launch`` warns of:
a resume that puts a larger micro-batch (or the same model on fewer devices) above the
device's memory, and overrides the layout never reads, started without a word. Its
replan now adds both to the plan's own warnings, as launch does."""

from __future__ import annotations

from pathlib import Path

from dtrain_cli.cli.resume_cmd import replan
from dtrain_cli.config.compose import compose_config, config_to_yaml
from dtrain_cli.rundir.layout import RunDir

SAVED = ["train.global_batch_size=4096", "train.micro_batch_size=64"]


def _checkpoint(tmp_path: Path) -> Path:
    """A checkpoint folder as far as a resume's plan reads it: the config it was saved with."""
    ckpt = tmp_path / "run" / "checkpoints" / "step_000010"
    ckpt.mkdir(parents=True)
    RunDir(ckpt).config.write_text(config_to_yaml(compose_config("gpt_tiny", SAVED)))
    return ckpt


def test_a_resume_above_the_devices_memory_says_so_and_what_fits(tmp_path):
    ckpt = _checkpoint(tmp_path)
    cfg, plan = replan(ckpt, ["train.micro_batch_size=4096"], [])
    assert cfg.train.micro_batch_size == 4096
    fit = [w for w in plan.warnings if w.startswith("peak memory per device estimated")]
    assert len(fit) == 1, plan.warnings
    assert "above hardware=cpu's" in fit[0] and "train.micro_batch_size=2048" in fit[0]
    _, fits = replan(ckpt, ["train.micro_batch_size=2048"], [])
    assert not any(w.startswith("peak memory") for w in fits.warnings), fits.warnings


def test_a_resume_names_an_override_its_layout_never_reads(tmp_path):
    _, plan = replan(_checkpoint(tmp_path), ["pipeline.schedule=gpipe"], [])
    said = "pipeline.schedule=gpipe: read only with pp > 1 (parallel.pp=1); ignored"
    assert said in plan.warnings, plan.warnings
    _, quiet = replan(_checkpoint(tmp_path / "again"), ["train.steps=20"], [])
    assert not any("ignored" in w or "peak memory" in w for w in quiet.warnings), quiet.warnings
