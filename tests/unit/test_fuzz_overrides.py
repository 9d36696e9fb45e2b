"""Fuzz ``dtrain plan`` with random override lists (issue 18): whatever a user types, the
answer is a plan (exit 0) or one-line errors (exit 2), never a traceback. In-process
(CliRunner), fixed seed, a few hundred cases."""

from __future__ import annotations

import random

from typer.testing import CliRunner

from dtrain_cli.cli.app import app
from dtrain_cli.config.overrides import SHORTHANDS, schema_fields

runner = CliRunner()
CASES = 300
VALUES = [
    "0", "-1", "-3", "1", "2", "3", "7", "16", "3.5", "1e-3", "1e400", "-1e400", "nan", "inf",
    "1000000000000000000000", "9007199254740993", "abc", "true", "false", "maybe", "null",
    "''", "[1,2]", "[]", "[0]", "{a:1}", "{}", "1,2", "$(ls)", "${oc.env:HOME}",
    "${undefined.key}", "${train.steps}", "${oc.env:NOPE_NOT_SET}", "${", "a b", "-5",
]  # fmt: skip
JUNK = [
    "=", "=2", "--dp=2", "-x", "--steps", "dp", "~", "+", "a b", "key==1", "@x=1", "%",
    "recipe=nope", "precision=bf61", "model=gpt_small", "optim=sgd", "~model", "+model=cnn_bn",
    "train", "train.stepz=3", "+foo=1", "++optim.warmup_step=1", "dp 2", "cluster.env={X:abc}",
    "+cluster.env.X=1", "cluster.env=3", "~cluster.env.X", "hydra.verbose=true",
]  # fmt: skip


def random_override(rng: random.Random, keys: list[str]) -> str:
    roll = rng.random()
    if roll < 0.15:
        return rng.choice(JUNK)
    key = rng.choice(keys)
    if roll < 0.3:  # a typo of a real key
        i = rng.randrange(len(key))
        key = key[:i] + rng.choice("xz_.") + key[i + 1 :]
    prefix = rng.choice(["", "", "", "+", "++", "~"])
    if prefix == "~":
        return f"~{key}"
    return f"{prefix}{key}={rng.choice(VALUES)}"


def test_plan_never_ends_in_a_traceback():
    rng = random.Random(20261201)
    keys = [*schema_fields(), *SHORTHANDS]
    seen_ok = seen_error = 0
    for case in range(CASES):
        args = [random_override(rng, keys) for _ in range(rng.randint(1, 4))]
        result = runner.invoke(app, ["plan", "recipe=gpt_tiny", *args])
        where = f"case {case}: dtrain plan recipe=gpt_tiny {' '.join(args)}\n{result.output}"
        assert result.exit_code in (0, 2), where
        assert "Traceback" not in result.output, where
        assert result.exception is None or isinstance(result.exception, SystemExit), where + repr(
            result.exception
        )
        if result.exit_code == 2:
            lines = result.output.strip().splitlines()
            assert lines and all(line.startswith("error: ") for line in lines), where
            seen_error += 1
        else:
            seen_ok += 1
    assert seen_ok > 10 and seen_error > CASES // 2  # both paths were exercised
