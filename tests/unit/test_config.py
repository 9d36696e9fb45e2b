"""Composition of every recipe and group option, and every bad input the issue names."""

from __future__ import annotations

import itertools

import pytest

from dtrain_cli.config.compose import (
    compose_config,
    config_from_yaml,
    config_to_yaml,
    expand_shorthands,
)
from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.config.search import builtin_configs_dir, list_recipes, recipe_description
from dtrain_cli.errors import ConfigError
from dtrain_cli.plan.build import Resources, build_plan

CPU = Resources(num_gpus=0, num_cpus=2)
GROUPS = [
    "model",
    "data",
    "optim",
    "precision",
    "parallel",
    "checkpoint",
    "train",
    "logging",
    "launcher",
]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (builtin_configs_dir() / group).glob("*.yaml"))


def test_every_recipe_documents_its_command():
    recipes = list_recipes()
    assert {"gpt_tiny", "gpt_small"} <= set(recipes)
    for name, path in recipes.items():
        first = path.read_text().splitlines()[0]
        command = "run" if name == "script" else "launch"  # a script recipe runs a script
        assert first.startswith(f"# dtrain {command} recipe={name}"), path
        assert recipe_description(path)


def test_a_recipe_description_is_its_first_whole_sentence(tmp_path):
    """A sentence that runs on over two comment lines is read to its end (gpt_1b's stopped
    at '... context 2048) in'); an 'e.g.' or a '0.8M' does not end it."""
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(
        "# @package _global_\n"
        "# dtrain launch recipe=mine dp=2\n"
        "# e.g.  dtrain launch recipe=mine dp=4\n"
        "#\n"
        "# A 0.8M-parameter model (e.g. for tests) on a\n"
        "# dataset of my own. More about it here.\n"
        "model: {}\n"
    )
    expected = "A 0.8M-parameter model (e.g. for tests) on a dataset of my own."
    assert recipe_description(recipe) == expected
    recipe.write_text("# dtrain launch recipe=mine\n# No full stop at all\nmodel: {}\n")
    assert recipe_description(recipe) == "No full stop at all"
    recipe.write_text("model: {}\n")
    assert recipe_description(recipe) == ""


@pytest.mark.parametrize(
    ("recipe", "group"), list(itertools.product(["gpt_tiny", "gpt_small", "cnn_bn"], GROUPS))
)
def test_every_group_option_composes(recipe: str, group: str, tmp_path):
    for option in options(group):
        extra = [f"data.path={tmp_path}"] if option in ("text", "tokens", "hf") else []
        extra += ["data._target_=tests.own_data.Pairs"] if option == "custom" else []
        cfg = compose_config(recipe, [f"{group}={option}", *extra])
        assert isinstance(cfg, DtrainConfig)
        assert cfg.run.recipe == recipe


def test_recipe_values_and_overrides_apply():
    cfg = compose_config(
        "gpt_small",
        [
            "dp=2",
            "optim.base_lr=3e-4",
            "precision=bf16",
            "lr_scaling=sqrt",
            "+train.grad_accum=2",
            "~train.global_batch_size",
        ],
    )
    assert cfg.model.n_layer == 8 and cfg.model.n_embd == 384
    assert cfg.parallel.dp == 2
    assert cfg.optim.base_lr == 3e-4 and cfg.optim.lr_scaling == "sqrt"
    assert cfg.precision.name == "bf16"
    assert cfg.train.grad_accum == 2 and cfg.train.global_batch_size is None


def test_shorthands_expand_to_full_keys():
    assert expand_shorthands(["dp=4", "tp=2", "pp=2", "lr_scaling=linear", "model=gpt_small"]) == [
        "parallel.dp=4",
        "parallel.tp=2",
        "parallel.pp=2",
        "optim.lr_scaling=linear",
        "model=gpt_small",
    ]


def test_config_yaml_round_trip(tmp_path):
    cfg = compose_config("gpt_tiny", ["dp=2", "train.steps=7", "optim.warmup_steps=2"])
    path = tmp_path / "config.yaml"
    path.write_text(config_to_yaml(cfg))
    assert config_from_yaml(path) == cfg


DEFAULTS = "defaults:\n  - base\n  - _self_\n"


def test_user_config_dir_adds_recipes_and_options(tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "gpt_wide.yaml").write_text(
        "name: gpt_wide\nn_layer: 2\nn_head: 2\nn_embd: 64\nblock_size: 32\n"
    )
    (tmp_path / "recipes" / "mine.yaml").write_text(
        "# dtrain launch recipe=mine --config-dir DIR\n# my own recipe\n"
        "defaults:\n  - base\n  - override model: gpt_wide\n  - _self_\ntrain:\n  steps: 3\n"
    )
    cfg = compose_config("mine", [], [tmp_path])
    assert cfg.model.name == "gpt_wide" and cfg.train.steps == 3
    monkeypatch.setenv("DTRAIN_CONFIG_PATH", str(tmp_path))
    assert "mine" in list_recipes()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        # no defaults list (the shape of a printed --show-config saved as a recipe): a bare
        # AssertionError traceback, also where dtrain's own hint for a recipe path led
        ("train:\n  steps: 5\n", "not built on dtrain's base config; begin it with "
         "'defaults: [base, _self_]'"),
        # an interpolation in the file: omegaconf's traceback (the command line's was a line)
        (f"{DEFAULTS}train:\n  steps: ${{optim.nope}}\n",
         "train.steps: Interpolation key 'optim.nope' not found (in recipe "),
        # YAML that does not parse: 'while parsing a flow sequence', no file, no line
        (f"{DEFAULTS}train:\n  steps: [1\n", "mine.yaml line 6, column 1: while parsing a "
         "flow sequence expected ',' or ']', but got '<stream end>' (YAML)"),
        # a run's config.yaml copied as it is: an AssertionError traceback (a user's find)
        ("model:\n  kind: gpt\nrun:\n  name: a\ntrain:\n  steps: 5\n",
         "not built on dtrain's base config; begin it with 'defaults: [base, _self_]' (a "
         "run's config.yaml too"),
        # one value for a list: "ValidationError raised while composing config:", no more
        (f"{DEFAULTS}debug:\n  profile_steps: 3\n", "debug.profile_steps (in "),
        (f"{DEFAULTS}debug:\n  profile_steps: 3\n", "one value where a list is wanted"),
        # a section given an option's name
        (f"{DEFAULTS}parallel: fsdp\n", "parallel is a section of keys; choose its option in "
         "the defaults list (- override parallel: fsdp) or as parallel=fsdp"),
        # a Latin-1 comment: a UnicodeDecodeError traceback
        (b"# caf\xe9\ntrain:\n  steps: 5\n", "mine.yaml: not UTF-8 text (byte 5); save it"),
    ],
    ids=["no-defaults", "interpolation", "yaml", "config-yaml", "list-key", "list-what",
         "section", "latin-1"],
)  # fmt: skip
def test_a_broken_recipe_file_is_one_line_naming_it(text, said, tmp_path):
    (tmp_path / "recipes").mkdir()
    path = tmp_path / "recipes" / "mine.yaml"
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    with pytest.raises(ConfigError) as info:
        compose_config("mine", [], [tmp_path])
    (line,) = info.value.problems
    assert said in line and "\n" not in line, line


@pytest.mark.parametrize("where", ["recipes", "."])
def test_a_user_file_named_base_is_refused_not_composed_forever(where, tmp_path):
    """A team's recipes/base.yaml (defaults: [base, _self_]) took the place of dtrain's base
    in every composition, built-in recipes too: 'maximum recursion depth exceeded'."""
    (tmp_path / where).mkdir(exist_ok=True)
    (tmp_path / where / "base.yaml").write_text(f"{DEFAULTS}train:\n  steps: 7\n")
    with pytest.raises(ConfigError) as info:
        compose_config("gpt_tiny", [], [tmp_path])
    (line,) = info.value.problems
    assert line.endswith("base.yaml: 'base' is dtrain's own config (every recipe's defaults "
                         "begin with base); rename it, e.g. team_base.yaml")  # fmt: skip


def problems(recipe: str, overrides: list[str], resources: Resources = CPU) -> list[str]:
    with pytest.raises(ConfigError) as info:
        build_plan(compose_config(recipe, overrides), resources)
    return info.value.problems


BAD = [
    # (overrides, text every message must contain)
    (["optim.bogus_lr=1"], ["unknown key 'optim.bogus_lr'", "did you mean 'optim.base_lr'"]),
    (["optim.lrr=1"], ["unknown key 'optim.lrr'"]),
    # a key put in the wrong section: the spelling's match and the one sharing its words
    (
        ["train.checkpoint_every=3"],
        ["did you mean 'train.eval_every' or 'checkpoint.every_steps'?"],
    ),
    (["train.steps=abc"], ["train.steps", "'abc'", "integer"]),
    (["parallel.nproc_per_node=3", "dp=2"], ["dp*tp*pp", "3"]),
    (
        ["train.global_batch_size=10", "dp=4", "train.micro_batch_size=2"],
        ["train.global_batch_size=10", "multiple of 8"],
    ),
    (["train.steps=0"], ["train.steps=0", ">= 1"]),
    (["train.steps=-5"], ["train.steps=-5"]),
    (["optim.base_lr=0"], ["optim.base_lr=0", "> 0"]),
    (["optim.base_lr=-1e-3"], ["optim.base_lr"]),
    (["precision.name=fp8"], ["precision.name=fp8", "fp32, bf16, fp16"]),
    (["precision=fp16"], ["precision=fp16", "CUDA", "bf16"]),
    # planned for a GPU cluster from a laptop: where such a plan is made
    (
        ["precision=fp16", "hardware=h100_80g"],
        [
            "(for hardware=h100_80g's GPUs: dtrain sbatch or dtrain k8s plans its job, dtrain "
            "simulate runs a rank of it here)"
        ],
    ),
    (["optim.lr_scaling=cubic"], ["optim.lr_scaling=cubic", "none, linear, sqrt"]),
    (["optim.name=lamb"], ["optim.name=lamb", "adamw, sgd"]),
    # a near miss of a choice names the closest one, for fixed choices and registered ones
    (["train.on_nan=skp"], ["train.on_nan=skp: not allowed (did you mean 'skip'?); choose"]),
    (["parallel.strategy=fsdpp"], ["strategy=fsdpp: not allowed (did you mean 'fsdp'?)"]),
    (["sync.mode=diloko"], ["sync.mode=diloko: not allowed (did you mean 'diloco'?)"]),
]


@pytest.mark.parametrize(("overrides", "expected"), BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_input_is_named(overrides, expected):
    text = "\n".join(problems("gpt_tiny", overrides))
    for fragment in expected:
        assert fragment in text, text


def test_precision_group_typo_lists_options():
    with pytest.raises(ConfigError) as info:
        compose_config("gpt_tiny", ["precision=bf61"])
    msg = info.value.problems[0]
    assert "precision=bf61" in msg and "bf16" in msg and "fp32" in msg


def test_unknown_key_suggests_the_closest():
    with pytest.raises(ConfigError) as info:
        compose_config("gpt_tiny", ["train.stepz=3"])
    assert "did you mean 'train.steps'" in info.value.problems[0]


def test_unknown_recipe_lists_available():
    with pytest.raises(ConfigError) as info:
        compose_config("gpt_smal", [])
    msg = info.value.problems[0]
    assert "unknown recipe 'gpt_smal'" in msg and "did you mean 'gpt_small'" in msg


def test_n_head_and_n_layer_must_divide_tp_and_pp():
    text = "\n".join(problems("gpt_tiny", ["tp=3", "pp=3", "model.n_head=4", "model.n_layer=4"]))
    assert "model.n_head=4: not divisible by tp=3" in text
    assert "model.n_layer=4: not divisible by pp=3" in text


def test_all_errors_are_reported_together():
    found = problems(
        "gpt_tiny", ["train.steps=0", "optim.base_lr=-1", "precision.name=fp8", "optim.decay=exp"]
    )
    assert len(found) >= 4
    assert all("\n" not in p for p in found)


def test_fp16_is_fine_where_cuda_is():
    plan = build_plan(
        compose_config("gpt_tiny", ["precision=fp16"]), Resources(num_gpus=8, num_cpus=64)
    )
    assert plan.device == "cuda" and plan.backend == "nccl" and plan.precision.loss_scaling


def test_powersgd_resume_at_another_dp_is_refused_with_the_way_out():
    from dtrain_cli.config.resume_changes import unsafe_resume_changes

    old = compose_config("gpt_tiny", ["dp=2", "comm.compression=powersgd"])
    same = compose_config("gpt_tiny", ["dp=2", "comm.compression=powersgd", "train.steps=50"])
    other = compose_config("gpt_tiny", ["dp=4", "comm.compression=powersgd"])
    dropped = compose_config("gpt_tiny", ["dp=4"])
    assert unsafe_resume_changes(old, same) == []
    assert unsafe_resume_changes(old, dropped) == []
    (line,) = unsafe_resume_changes(old, other)
    assert line.startswith("parallel.dp=4: PowerSGD's error feedback is each rank's own")
    assert "resume at dp=2, or drop it with comm.compression=none" in line


@pytest.mark.parametrize("mode", ["diloco", "local_sgd"])
def test_replicas_that_step_alone_resume_at_their_dp_and_mode_only(mode):
    """Each replica's optimizer state is its own entry of the checkpoint: another dp or
    another sync mode is one line naming the checkpoint's."""
    from dtrain_cli.plan.resume import resume_problems

    old = compose_config("gpt_tiny", ["dp=2", f"sync.mode={mode}"])
    assert resume_problems(old, compose_config("gpt_tiny", ["dp=2", f"sync.mode={mode}"])) == []
    (line,) = resume_problems(old, compose_config("gpt_tiny", ["dp=4", f"sync.mode={mode}"]))
    assert line.startswith(f"parallel.dp=4: sync.mode={mode} checkpoints each replica's own")
    assert line.endswith("resume at dp=2")
    (line,) = resume_problems(old, compose_config("gpt_tiny", ["dp=2"]))
    assert line.startswith("sync.mode=sync: the checkpoint (sync.mode=" + mode)
    (line,) = resume_problems(compose_config("gpt_tiny", ["dp=2"]), old)
    assert line.endswith("resume with sync.mode=sync")


def test_a_parameter_server_run_resumes_with_its_servers_and_staleness():
    """The servers' optimizer state is sharded over them, and with staleness each worker
    keeps its own: a switch to sync trained on with fresh AdamW moments (silently), more
    servers or another side of staleness 0 failed in start-up with DCP's missing keys."""
    from dtrain_cli.plan.resume import resume_problems

    def ps(*extra: str):
        return compose_config("gpt_tiny", ["dp=2", "sync.mode=param_server", *extra])

    old, stale = ps(), ps("sync.max_staleness=2")
    assert resume_problems(old, ps()) == [] == resume_problems(stale, ps("sync.max_staleness=3"))
    (line,) = resume_problems(old, compose_config("gpt_tiny", ["dp=2"]))
    assert line.startswith("sync.mode=sync: the checkpoint (sync.mode=param_server) keeps its")
    assert line.endswith("resume with sync.mode=param_server")
    (line,) = resume_problems(compose_config("gpt_tiny", ["dp=2"]), old)
    assert line.endswith("resume with sync.mode=sync")
    (line,) = resume_problems(old, ps("sync.servers=2"))
    assert line == (
        "sync.servers=2: the checkpoint's optimizer state is sharded over 1 server(s); resume "
        "with sync.servers=1"
    )
    (line,) = resume_problems(old, ps("sync.max_staleness=2"))
    assert line.startswith("sync.max_staleness=2: the checkpoint (max_staleness=0) keeps one")
    (line,) = resume_problems(stale, ps("sync.max_staleness=2", "dp=1"))
    assert line.startswith("parallel.dp=1: sync.mode=param_server checkpoints each replica's")


@pytest.mark.parametrize("mode", ["diloco", "local_sgd"])
def test_replicas_that_step_alone_refuse_elastic_membership(mode):
    from dtrain_cli.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        build_plan(
            compose_config("gpt_tiny", ["dp=2", f"sync.mode={mode}", "parallel.nnodes=1:2"]), CPU
        )
    assert any(
        p.startswith(f"parallel.nnodes=1:2: sync.mode={mode} checkpoints each replica's own")
        for p in info.value.problems
    )


def test_a_group_chosen_over_a_recipe_s_own_values_is_said():
    """optim=sgd over gpt_tiny ran SGD at AdamW's lr 0.001 and warmup 10 (the recipe's own
    values stay over the option's) without a word; given on the command line, said no more."""
    from dtrain_cli.cli.common import compose_and_plan

    _, plan = compose_and_plan(["recipe=gpt_tiny", "optim=sgd"], [])
    said = [w for w in plan.warnings if w.startswith("optim=sgd:")]
    assert said == [
        "optim=sgd: recipe gpt_tiny sets optim.base_lr=0.001, optim.base_batch_size=16, "
        "optim.warmup_steps=10 itself, which stay over sgd's own values; give them on the "
        "command line to change them"
    ]
    args = ["recipe=gpt_tiny", "optim=sgd", "optim.base_lr=0.1", "optim.warmup_steps=0"]
    _, plan = compose_and_plan([*args, "optim.base_batch_size=16"], [])
    assert not any(w.startswith("optim=sgd:") for w in plan.warnings)
