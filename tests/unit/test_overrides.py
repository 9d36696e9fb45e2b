"""Override and CLI-input defects (issues 11 and 18): what a user types by mistake gets one
line naming the key and the form to write, exit code 2; what is fine runs."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from dtrain_cli.cli.app import app
from dtrain_cli.cli.plan_cmd import FORMATS

runner = CliRunner()


NO_SERVER = "launcher.start_method=spawn"  # in-process launches: no fork server to outlive us


def plan(*args: str):
    return runner.invoke(app, ["plan", *args])


def errors(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("error:")]


def test_short_run_plans_with_a_warning():
    result = plan("recipe=gpt_tiny", "train.steps=5")
    assert result.exit_code == 0, result.output
    assert "warmup_steps=10 is longer than training (train.steps=5)" in result.output


@pytest.mark.parametrize(
    "name", ["../../../tmp/escape", "a/b", "..", ".", "-rf", "", "x\\y", "tab\there"]
)
@pytest.mark.parametrize("command", ["plan", "sbatch", "launch"])
def test_run_name_must_be_one_folder_name(name, command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [command, "recipe=gpt_tiny", f"run.name={name!r}"]
    extra = {"sbatch": ["--dry-run"], "launch": [NO_SERVER]}.get(command, [])
    result = runner.invoke(app, args + extra)
    assert result.exit_code == 2, result.output
    assert "RUN_DIR=" not in result.output and "Traceback" not in result.output
    (line,) = errors(result)
    assert line.startswith("error: run.name=") and "single folder name" in line
    assert not (tmp_path / "runs").exists() and not (tmp_path.parent / "tmp").exists()


def test_rdzv_id_names_the_run_dir_and_is_checked_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["launch", "recipe=gpt_tiny", NO_SERVER, "dp=2", "--nnodes", "2", "--node-rank", "0"]
    args += ["--rdzv-endpoint", "localhost:29511", "--rdzv-id", "../escape"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "--rdzv-id='../escape': contains a path separator" in result.output
    assert not (tmp_path / "escape").exists() and not (tmp_path / "runs").exists()


def test_ordinary_run_names_are_fine():
    for name in ("exp1", "gpt_tiny-20261201-080000", "ref $(touch X) it's"):
        assert plan("recipe=gpt_tiny", f"run.name={name!r}").exit_code == 0, name


# issue 18.1: `+` on an unknown key is the same error as without; on a known key it sets.
@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("+optim.warmup_step=1", "did you mean 'optim.warmup_steps'"),
        ("++optim.warmup_step=1", "did you mean 'optim.warmup_steps'"),
        ("+train.stepz=3", "did you mean 'train.steps'"),
        ("+foo=1", "unknown key 'foo'"),
    ],
)
def test_plus_on_an_unknown_key_is_an_error(override, expected):
    for form in (override, override.lstrip("+")):
        result = plan("recipe=gpt_tiny", form)
        assert result.exit_code == 2, (form, result.output)
        (line,) = errors(result)
        assert expected in line and "unknown key" in line


def test_plus_recipe_picks_the_recipe():
    result = runner.invoke(app, ["plan", "+recipe=gpt_small", "-f", "json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["recipe"] == "gpt_small"


def test_plus_on_a_known_key_sets_it():
    result = runner.invoke(app, ["plan", "recipe=gpt_tiny", "+optim.warmup_steps=1", "-f", "yaml"])
    assert result.exit_code == 0, result.output
    assert "warmup_steps: 1\n" in result.output


# issue 11.4: a whole dict for a dict field works (replacing it); entries too.
def test_dict_override_replaces_the_dict(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = ["sbatch", "recipe=gpt_tiny", "cluster=example_gpu", "gpus_per_node=1", "nodes=2"]
    whole = runner.invoke(app, [*base, "cluster.env={X:abc}", "--dry-run"])
    assert whole.exit_code == 0, whole.output
    exports = [ln for ln in whole.output.splitlines() if ln.startswith("export ")]
    assert exports == ["export X=abc"]  # example_gpu's NCCL_* replaced
    entry = runner.invoke(app, [*base, "+cluster.env.X=abc", "~cluster.env.NCCL_DEBUG"])
    exports = [ln for ln in entry.output.splitlines() if ln.startswith("export ")]
    assert exports == ["export NCCL_SOCKET_IFNAME=ib0", "export X=abc"], entry.output
    # a misspelt entry to remove removed nothing and said nothing (a new user's find)
    typo = runner.invoke(app, [*base, "~cluster.env.NCCL_DEBUGG", "--dry-run"])
    assert typo.exit_code == 2 and (
        "~cluster.env.NCCL_DEBUGG: cluster.env has no entry 'NCCL_DEBUGG' to remove (did you "
        "mean 'NCCL_DEBUG'?); its entries: NCCL_DEBUG, NCCL_SOCKET_IFNAME"
    ) in " ".join(typo.output.split())


@pytest.mark.parametrize("value", ["3", "[a]", "{X:{a:1}}"])
def test_dict_override_of_the_wrong_shape_names_the_key(value):
    result = plan("recipe=gpt_tiny", f"cluster.env={value}")
    assert result.exit_code == 2 and "Could not override" not in result.output
    (line,) = errors(result)
    assert line.startswith("error: cluster.env") and "+cluster.env.NAME=value" in line


# issue 11.6: an interpolation that does not resolve, or gives the wrong type, is one line.
@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("dp=${oc.env:HOME}", "parallel.dp=${oc.env:HOME}: the interpolation fails"),
        ("optim.weight_decay=${undefined.key}", "optim.weight_decay=${undefined.key}: the inter"),
        ("train.steps=${oc.env:DTRAIN_NO_SUCH_VAR}", "train.steps=${oc.env:DTRAIN_NO_SUCH_VAR}"),
        ("train.steps=${nope:1}", "train.steps=${nope:1}: the interpolation fails"),
        ("train.steps=${", "train.steps"),
    ],
)
def test_bad_interpolation_is_a_config_error(override, expected):
    result = plan("recipe=gpt_tiny", override, "train.eval_batches=0")
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = errors(result)
    assert expected in lines[0], lines
    assert "error: train.eval_batches=0: must be >= 1" in lines  # the other one still reported


def test_interpolation_that_resolves_is_fine():
    result = runner.invoke(app, ["plan", "recipe=gpt_tiny", "train.steps=${train.eval_every}"])
    assert result.exit_code == 0 and "50 / " in result.output, result.output


# issue 18.13: ordinary slips get a dtrain line naming the key and the form to write.
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["dp", "2"], "'dp 2': write dp=2 (no spaces around '=')"),
        (["dp 2"], "'dp 2': write dp=2 (no spaces around '=')"),
        (["optim.base_lr = 3e-4"], "write optim.base_lr=3e-4 (no spaces"),  # it said "=="
        (["--dp=2"], "'--dp=2': overrides take no dashes; write dp=2"),
        (["--train.steps", "5"], "'--train.steps 5': overrides take no dashes; write train.st"),
        (["--bogus"], "'--bogus': not an option of this command (see --help)"),
        # a misspelt option of the command: its closest option is named
        (["--formt", "json"], "'--formt': not an option of this command (did you mean --format?)"),
        (["train.compile=maybe"], "train.compile: value 'maybe' is not a boolean; write e.g. "),
        (["~train.steps"], "train.steps: cannot be unset (it has no null value); set it, e.g. "),
        (["=2"], "'=2': no key before '='"),
        (
            ["train.steps=abc"],
            "train.steps: value 'abc' is not an integer; write e.g. train.steps=",
        ),
        (["dp=1,2"], "parallel.dp=1,2: one value per key; dtrain simulate sweeps it"),
        # a number's comma list was told to quote it (a string, refused next as not a number)
        (["train.steps=4,8"], "train.steps=4,8: one value per key; write one value (a sweep"),
        (["run.name=a,b"], "run.name=a,b: one value per key; write one value, or quote one th"),
        (["dp"], "'dp': no value; write dp=VALUE"),
        (["train.steps=$(ls)"], "train.steps=$(ls): cannot parse the value"),
        (["gpt_small"], "'gpt_small': a recipe; write recipe=gpt_small"),  # a bare recipe
        # two recipes: the last was taken, silently
        (["recipe=gpt_small"], "recipe=gpt_tiny recipe=gpt_small: one recipe per command"),
        # JSON's quoted keys: the line gives the override that parses (it was "quote it")
        (
            ['cluster.env={"NCCL_DEBUG": "WARN"}'],
            "a dict's keys go unquoted: 'cluster.env={NCCL_DEBUG: \"WARN\"}'",
        ),
    ],
)
def test_slips_get_a_dtrain_line(args, expected):
    result = plan("recipe=gpt_tiny", *args)
    assert result.exit_code == 2, result.output
    lines = errors(result)
    assert len(lines) == 1 and expected in lines[0], lines
    for hydra_word in ("Error parsing", "LexerNoViable", "Error merging", "Could not"):
        assert hydra_word not in result.output


# issue 18.10: every numeric field's range is checked before arithmetic uses it.
NUMERIC = [
    "train.micro_batch_size",
    "train.global_batch_size",
    "train.grad_accum",
    "pipeline.microbatches",
    "parallel.nproc_per_node",
    "parallel.dp",
    "parallel.tp",
    "parallel.pp",
    "parallel.nnodes",
    "pipeline.virtual_stages",
    "model.n_head",
    "model.n_layer",
    "model.n_embd",
    "model.block_size",
    "train.steps",
    "checkpoint.every_steps",
    "logging.every",
    "sync.every",
    "launcher.threads_per_proc",
    "launcher.rdzv_timeout_s",
    "precision.growth_interval",
    "optim.eps",
    "train.seed",
]


@pytest.mark.parametrize("key", NUMERIC)
@pytest.mark.parametrize("value", ["0", "-1"])
def test_numeric_ranges_before_arithmetic(key, value):
    if value == "0" and key in ("checkpoint.every_steps", "train.seed"):
        value = "-1"  # 0 is allowed there
    extra = ["pp=2"] if key.startswith("pipeline.") else []
    result = plan("recipe=gpt_tiny", *extra, f"{key}={value}")
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    (line,) = errors(result)
    assert line.startswith(f"error: {key}={value}") and ": must be " in line, line


# issue 18.14: root causes only, all of them, with suggestions that are valid values.
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["dp=3"],
            ["train.global_batch_size=16: not divisible by dp=3; use a multiple of 3 (15 or 18)"],
        ),
        (["dp=-3"], ["parallel.dp=-3: must be >= 1"]),
        (["train.steps=-5"], ["train.steps=-5: must be >= 1"]),
        (["model.attention=flash"], ["model.attention=flash: choose one of sdpa, math"]),
        (
            ["train.stepz=3", "dp=0"],
            ["unknown key 'train.stepz' (did you mean 'train.steps'?)", "parallel.dp=0: must be"],
        ),
        (
            ["train.stepz=3", "optim.lrr=1", "dp=3"],
            ["unknown key 'train.stepz'", "unknown key 'optim.lrr'", "not divisible by dp=3"],
        ),
        (["dp=3", "pp=2"], ["train.global_batch_size=16: not divisible by dp=3"]),
        (
            ["parallel.nproc_per_node=3", "dp=2", "tp=2"],
            ["processes were asked for; set nproc_per_node=4"],
        ),
    ],
)
def test_root_causes_only_all_of_them(args, expected):
    result = plan("recipe=gpt_tiny", *args)
    assert result.exit_code == 2, result.output
    lines = errors(result)
    assert len(lines) == len(expected), lines
    for line, fragment in zip(lines, expected, strict=True):
        assert fragment in line, lines
    for line in lines:  # every number suggested is a valid value
        assert "multiple of -" not in line and "at most -" not in line and "=?" not in line


@pytest.mark.parametrize(
    ("pp", "global_batch", "microbatches"),
    [
        (2, 10, 2),
        # a prime share: 1F1B needs a micro-batch per stage, so one of each sample, not one
        # of all (the plan refused the batch with 'lower train.micro_batch_size', unset)
        (2, 5, 5),
        (4, 9, 9),
        (4, 16, 8),  # as before: the most up to two per stage
    ],
)
def test_default_pipeline_microbatches_fit_the_batch(pp, global_batch, microbatches):
    args = ["plan", "recipe=gpt_tiny", f"pp={pp}", f"train.global_batch_size={global_batch}"]
    if pp == 4:
        args.append("model.n_layer=4")
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"{microbatches} micro-batches x 1 call(s)" in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["dp=100000"],
        ["checkpoint.every_steps=1", "train.steps=100000000000"],
        ["model.n_layer=9007199254740993"],
        ["optim.base_lr=inf"],
        ["optim.beta1=nan"],
    ],
)
def test_huge_and_non_finite_values_are_refused_fast(args):
    result = plan("recipe=gpt_tiny", *args)
    assert result.exit_code == 2 and len(errors(result)) == 1, result.output


# issue 18.6: every format the help lists gives loadable output; unknown ones are refused.
class _UniqueKeys(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
        assert len(keys) == len(set(keys)), f"duplicate keys: {keys}"
        return super().construct_mapping(node, deep=deep)


def _load(text: str, fmt: str) -> dict:
    return json.loads(text) if fmt == "json" else yaml.load(text, Loader=_UniqueKeys)


@pytest.mark.parametrize("show_config", [False, True])
@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "table"])
def test_plan_formats_load(fmt, show_config):
    help_text = runner.invoke(app, ["plan", "--help"], terminal_width=200).output
    assert all(f in help_text for f in FORMATS)
    args = ["plan", "recipe=gpt_small", "dp=2", "--format", fmt]
    result = runner.invoke(app, args + (["--show-config"] if show_config else []))
    assert result.exit_code == 0, result.output
    doc = _load(result.stdout, fmt)
    plan_doc = doc["plan"] if show_config else doc
    assert plan_doc["world_size"] == 2 and plan_doc["model"] == "gpt_small"
    assert len(plan_doc["ranks"]) == 2
    if show_config:
        assert doc["config"]["model"]["n_layer"] == 8 and doc["config"]["parallel"]["dp"] == 2


@pytest.mark.parametrize("fmt", ["xml", "JSON", ""])
def test_unknown_plan_format_is_refused(fmt):
    result = runner.invoke(app, ["plan", "recipe=gpt_tiny", "--format", fmt])
    assert result.exit_code == 2
    (line,) = errors(result)
    assert f"--format={fmt}: not a format; choose one of table, yaml, json" in line


# issue 18.8: resume refuses recipe= and run.recipe= with the reason; its help says what it takes.
@pytest.mark.parametrize("override", ["recipe=gpt_small", "run.recipe=gpt_small", "+run.recipe=x"])
def test_resume_refuses_another_recipe(override, tmp_path):
    result = runner.invoke(app, ["resume", "--ckpt", str(tmp_path), override])
    assert result.exit_code == 2, result.output
    (line,) = errors(result)
    assert line.startswith(f"error: {override}: a resume continues its own run")
    assert "did you mean" not in line


def test_resume_help_says_what_it_accepts():
    text = runner.invoke(app, ["resume", "--help"], terminal_width=200).output
    assert "recipe=NAME" not in text and "Not recipe=" in text and "steps" in text


def test_recipe_is_fixed_on_resume_even_in_the_config():
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.config.resume_changes import unsafe_resume_changes

    old = compose_config("gpt_tiny", [])
    new = compose_config("gpt_tiny", [])
    new.run.recipe = "gpt_small"
    (line,) = unsafe_resume_changes(old, new)
    assert line.startswith("run.recipe=gpt_small: cannot change on resume")


def test_another_model_on_resume_is_refused_in_one_line():
    """`dtrain resume RUN model=gpt_small` said "defaults: Key 'defaults' not in 'GPTConfig'"
    (the group's YAML merged into the checkpoint's model); optim=sgd was already clear."""
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.config.resume_changes import override_config
    from dtrain_cli.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        override_config(compose_config("gpt_tiny", []), ["model=gpt_small"])
    (line,) = err.value.problems
    assert line.startswith(
        "model=gpt_small: cannot change on resume (the checkpoint's model is gpt_tiny); "
        "fixed on resume: model.*, data.*"
    ), line


# issue 18.12: validate-cluster's flags are range-checked before anything runs.
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--timeout", "-1"], "--timeout=-1: must be > 0 seconds"),
        (["--timeout", "0"], "--timeout=0: must be > 0 seconds"),
        (["--timeout", "nan"], "--timeout=nan: must be > 0 seconds"),
        (["--nnodes", "0"], "--nnodes=0: must be >= 1"),
        (["--nproc-per-node", "0"], "--nproc-per-node=0: must be >= 1"),
        (["--nnodes", "2", "--node-rank", "2"], "--node-rank=2: must be in [0, 2)"),
    ],
)
def test_validate_cluster_ranges(args, expected):
    result = runner.invoke(app, ["validate-cluster", "--no-live", *args])
    assert result.exit_code == 2, result.output
    (line,) = errors(result)
    assert expected in line and "ok" not in result.output.replace(expected, "")


# issue 18.17: -h on every command, completion of recipes and keys, counts in words.
COMMANDS = ["launch", "plan", "resume", "recipes", "checkpoints", "export", "sbatch", "agent"]


@pytest.mark.parametrize("command", [[], *([c] for c in [*COMMANDS, "validate-cluster"])])
def test_dash_h_is_help_everywhere(command):
    short = runner.invoke(app, [*command, "-h"], terminal_width=200)
    assert short.exit_code == 0, short.output
    assert short.output == runner.invoke(app, [*command, "--help"], terminal_width=200).output


def _complete(words: str) -> list[str]:
    cword = len(words.split()) - (0 if words.endswith(" ") else 1)
    env = {"_DTRAIN_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
    return runner.invoke(app, [], prog_name="dtrain", env=env).output.split()


def test_completion_offers_recipes_options_and_keys():
    assert _complete("dtrain plan recipe=gpt_") == [
        "recipe=gpt_1b",
        "recipe=gpt_small",
        "recipe=gpt_tiny",
    ]
    assert _complete("dtrain launch precision=") == [
        "precision=bf16",
        "precision=fp16",
        "precision=fp32",
    ]
    assert _complete("dtrain plan train.st") == ["train.steps="]
    assert _complete("dtrain sbatch +optim.warm") == ["+optim.warmup_steps="]
    assert "train.compile=true" in _complete("dtrain plan train.compile=")


def test_counts_are_in_words():
    args = ["plan", "recipe=gpt_tiny", "train.steps=2", "optim.warmup_steps=1"]
    result = runner.invoke(app, [*args, "checkpoint.every_steps=1"], terminal_width=200)
    out = result.output
    assert "1 = 1 node(s) x 1 process " in out and "1 processes" not in out
    assert "warmup  " in out and " 1 step " in out and "1 steps" not in out
    cuda = runner.invoke(app, ["plan", "recipe=gpt_tiny", "run.device=cuda"]).output
    if "0 are visible" in cuda:  # this machine has no GPU
        assert "1 process per node needs 1 GPU but 0 are visible" in cuda


# issue 18.16: grad_accum's error says how (the documented errors: tests/unit/test_docs.py).
@pytest.mark.parametrize("recipe", ["gpt_tiny", "gpt_small", "cnn_bn"])
def test_grad_accum_error_says_to_unset_the_global_batch(recipe):
    result = plan(f"recipe={recipe}", "+train.grad_accum=4")
    assert result.exit_code == 2
    (line,) = errors(result)
    assert "~train.global_batch_size" in line
    fixed = plan(f"recipe={recipe}", "~train.global_batch_size", "train.grad_accum=4")
    assert fixed.exit_code == 0, fixed.output
    assert " x 4 x 1 " in fixed.output


def test_interpolation_of_the_wrong_shape_for_a_list_field():
    result = plan("recipe=cnn_bn", "model.channels=${oc.env:HOME}")
    assert result.exit_code == 2
    (line,) = errors(result)
    assert "model.channels=${oc.env:HOME}: the interpolation gives" in line and "not a list" in line


def test_the_removed_timeout_key_names_its_replacement(tmp_path, monkeypatch):
    """launcher.collective_timeout_s is gone: debug.collective_timeout_s is the one
    collective timeout; one line, exit 2, in an override or a recipe of the user's."""
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    r = runner.invoke(app, ["plan", "recipe=gpt_tiny", "launcher.collective_timeout_s=5"])
    assert r.exit_code == 2, r.output
    assert r.output.strip() == (
        "error: launcher.collective_timeout_s: removed: debug.collective_timeout_s is the one "
        "collective timeout (the process group waits 15 s longer; debug.hang_watchdog=false "
        "leaves it to the process group)"
    )
    (tmp_path / "old.yaml").write_text(
        "defaults:\n  - base\n  - _self_\nlauncher:\n  collective_timeout_s: 5\n"
    )
    r = runner.invoke(app, ["plan", "recipe=old", "--config-dir", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert "launcher.collective_timeout_s: removed: debug.collective_timeout_s" in r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("command", [["advise"], ["simulate"], ["k8s", "cluster.image=x"]])
@pytest.mark.parametrize("script", ["train.py", "./train.py", "/abs/train.py"])
def test_a_script_given_to_a_trainer_command_is_pointed_to_dtrain_run(command, script):
    """``dtrain simulate dp=2 -- train.py --steps 3``: the script's path was read as an
    override ('no value; write train.py=VALUE', or 'not an override' for a path) and its
    arguments each as another mistake. One line names the commands that run it."""
    result = CliRunner().invoke(app, [*command, "dp=2", "--", script, "--steps", "3"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [
        f"error: {script!r}: a script of your own runs with dtrain run [OVERRIDES] -- "
        f"{script} (dtrain plan and dtrain sbatch take it too); this command runs dtrain's "
        "own trainer"
    ], result.output


def test_plan_json_carries_the_step_line_estimate():
    """A loader gets the figures the table's last line prints (step time, throughput, MFU,
    peak memory against the device), from the same estimate."""
    args = ["plan", "recipe=gpt_small", "dp=2", "pp=2", "hardware=h100_80g", "precision=bf16"]
    table = runner.invoke(app, args, terminal_width=400)
    doc = json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)
    est = doc["step_estimate"]
    assert est["hardware"] == "h100_80g" and est["fits"] is True
    line = " ".join(table.stdout.split())
    assert f"step {est['step_ms']:,.1f} ms, {est['tokens_per_s']:,.0f} tokens/s" in line
    assert f"MFU {est['mfu']:.0%}, bubble {est['bubble']:.0%}" in line
    assert 0 < est["peak_memory_bytes"] < est["device_memory_bytes"]


def test_plan_of_a_script_has_no_step_estimate(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    result = runner.invoke(app, ["plan", "dp=2", "--format", "json", "--", str(script)])
    assert result.exit_code == 0, result.output
    assert "step_estimate" not in json.loads(result.stdout)
