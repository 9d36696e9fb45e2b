"""The suggestions in config errors (dtrain_cli/config/suggest.py)."""

from __future__ import annotations

import pytest

from dtrain_cli.config.compose import compose_config
from dtrain_cli.config.overrides import SHORTHANDS, schema_fields
from dtrain_cli.config.search import list_recipes
from dtrain_cli.config.suggest import did_you_mean, did_you_mean_key, not_allowed
from dtrain_cli.errors import ConfigError

KNOWN = [*schema_fields(), *SHORTHANDS]


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("train.stepz", " (did you mean 'train.steps'?)"),
        ("+train.stepz", " (did you mean 'train.steps'?)"),  # an add names the same key
        # the wrong section: the spelling's match, and the key whose words it shares
        (
            "train.checkpoint_every",
            " (did you mean 'train.eval_every' or 'checkpoint.every_steps'?)",
        ),
        # the right section: its own words are no reason to name a sibling key
        ("checkpoint.keepp", " (did you mean 'checkpoint.keep_last'?)"),
        # a key of another section by its exact name: that one, not the nearest spelling
        # here (it said 'parallel.tp')
        ("parallel.steps", " (did you mean 'train.steps'?)"),
        ("optim.micro_batch_size", " (did you mean 'train.micro_batch_size'?)"),
        # what other trainers call a key: its name here, not the nearest spelling (it said
        # 'optim.min_lr', 'train.max_skips', 'optim.min_lr' and nothing for seed)
        ("optim.lr", " (did you mean 'optim.base_lr'?)"),
        ("train.learning_rate", " (did you mean 'optim.base_lr'?)"),
        ("train.max_steps", " (did you mean 'train.steps'?)"),
        ("optim.max_grad_norm", " (did you mean 'optim.grad_clip'?)"),
        ("optim.betas", " (did you mean 'optim.beta1' or 'optim.beta2'?)"),
        (
            "train.batch_size",
            " (did you mean 'train.micro_batch_size' or 'train.global_batch_size'?)",
        ),
        ("seed", " (did you mean 'train.seed'?)"),
        ("nodes", " (did you mean 'parallel.nnodes'?)"),  # it said 'nnodes': a shorthand
        ("gpus_per_node", " (did you mean 'cluster.gpus_per_node'?)"),
        ("name", " (did you mean 'run.name'?)"),  # five keys end in name: the spelling's
        ("zzz.qqq", ""),
    ],
)
def test_an_unknown_key_names_the_closest(key, hint):
    assert did_you_mean_key(key, KNOWN) == hint


@pytest.mark.parametrize("key", ["", "~", ".", "a..b", "+", "~bar", "....x"])
def test_odd_keys_get_no_suggestion_and_no_error(key):
    assert isinstance(did_you_mean_key(key, KNOWN), str)


def test_not_allowed_names_the_choices_and_the_closest():
    assert not_allowed("optim.name", "adamm", ("adamw", "sgd")) == (
        "optim.name=adamm: not allowed (did you mean 'adamw'?); choose one of adamw, sgd"
    )
    assert not_allowed("x", 3, (1, 2)) == "x=3: not allowed; choose one of 1, 2"


@pytest.mark.parametrize(
    ("override", "hint"),
    [
        ("sync=diloco", "allowed: default (or the key sync.mode=diloco?)"),
        # a typo of an option is that, not a value of the key (it said "or the key
        # parallel.strategy=fdsp?", a value no strategy has)
        ("parallel=fdsp", "no such option (did you mean 'fsdp'?); allowed: ddp, fsdp, hsdp, zero1"),
        ("pipeline=zbv", "(or the key pipeline.schedule=zbv?)"),
        ("precision=bf61", "allowed: bf16, fp16, fp32"),  # not a precision.name either
        ("cluster=mysite", "allowed: example_gpu, example_k8s, local"),  # cluster.name: a label
    ],
)
def test_a_group_given_a_value_of_its_selecting_key_names_that_key(override, hint):
    with pytest.raises(ConfigError) as info:
        compose_config("gpt_tiny", [override])
    (problem,) = info.value.problems
    assert problem.endswith(hint), problem


def test_every_strategy_is_a_parallel_option():
    """parallel=hsdp, as parallel=fsdp: every registered strategy has its config option."""
    from dtrain_cli.strategies import names

    for name in names():
        assert compose_config("gpt_tiny", [f"parallel={name}"]).parallel.strategy == name


def test_a_recipe_given_as_a_path_is_named_with_its_folder(tmp_path):
    """recipe=conf/recipes/mine.yaml: a name and a --config-dir, not an unexplained
    'unknown recipe'; a path to a built-in recipe gets its name (did you mean)."""
    from typer.testing import CliRunner

    from dtrain_cli.cli.app import app

    (tmp_path / "conf" / "recipes").mkdir(parents=True)
    mine = tmp_path / "conf" / "recipes" / "mine.yaml"
    mine.write_text("defaults:\n  - base\n  - _self_\n")
    loose = tmp_path / "exp.yaml"
    loose.write_text("defaults:\n  - base\n  - _self_\n")
    cases = {
        str(
            mine
        ): f"(a recipe is named, its folder given: recipe=mine --config-dir {tmp_path / 'conf'})",
        str(loose): f"(a recipe is named, its folder given: recipe=exp --config-dir {tmp_path})",
        "recipes/gpt_tiny.yaml": "(did you mean 'gpt_tiny'?)",
        str(tmp_path / "nope.yaml"): "unknown recipe",
    }
    for recipe, says in cases.items():
        result = CliRunner().invoke(app, ["plan", f"recipe={recipe}"])
        assert result.exit_code == 2 and says in result.stderr, result.stderr
    assert (
        "(a recipe" not in CliRunner().invoke(app, ["plan", f"recipe={tmp_path}/nope.yaml"]).stderr
    )


def test_a_missing_option_in_ones_own_recipe_names_ones_own_options(tmp_path):
    """A recipe of --config-dir asking for model=gpt_wdie was told 'did you mean gpt_tiny',
    the built-in options only (gpt_wide, beside it, missing), and not which file asked."""
    (tmp_path / "recipes").mkdir()
    (tmp_path / "model").mkdir()
    recipe = tmp_path / "recipes" / "missing.yaml"
    recipe.write_text("defaults:\n  - base\n  - override model: gpt_wdie\n  - _self_\n")
    (tmp_path / "model" / "gpt_wide.yaml").write_text("defaults:\n  - gpt_tiny\n  - _self_\n")
    with pytest.raises(ConfigError) as info:
        compose_config("missing", [], [tmp_path])
    (problem,) = info.value.problems
    assert problem.startswith(f"model=gpt_wdie (a defaults list, composing {recipe}): no such")
    assert "(did you mean 'gpt_wide'?)" in problem and "gpt_tiny, gpt_wide, hf" in problem


def test_every_mistake_in_ones_own_recipe_is_told_with_the_file(tmp_path):
    """Hydra stopped at the first (and named no file); the command line's mistakes were all
    told together. Nested and dotted keys alike; a valid recipe's keys are not named."""
    (tmp_path / "recipes").mkdir()
    nested = tmp_path / "recipes" / "typo.yaml"
    nested.write_text(
        "defaults:\n  - base\n  - _self_\ntrain:\n  stepz: 5\n  steps: 7\noptim:\n"
        "  lr_scaling: cube\ncluster:\n  env: {NCCL_DEBUG: WARN}\nmodel:\n  n_layer: 2\n"
    )
    dotted = tmp_path / "recipes" / "dotted.yaml"
    dotted.write_text("defaults:\n  - base\n  - _self_\ntrain.stepz: 5\noptim.lr_scaling: cube\n")
    for recipe in (nested, dotted):
        with pytest.raises(ConfigError) as info:
            compose_config(recipe.stem, [], [tmp_path])
        assert info.value.problems == [
            "unknown key 'train.stepz' (did you mean 'train.steps'?); see `dtrain plan "
            f"--show-config` for all keys (in recipe {recipe})",
            "optim.lr_scaling=cube: not allowed; choose one of none, linear, sqrt (in recipe "
            f"{recipe})",
        ]


def test_a_recipe_that_includes_a_built_in_recipe_is_told_to_start_from_a_copy(tmp_path):
    """`defaults: [llama_tiny_hf, ...]` in one's own recipe was "Could not load
    'llama_tiny_hf'", with no word why (a new user's find)."""
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "ft.yaml").write_text("defaults: [llama_tiny_hf, _self_]\n")
    with pytest.raises(ConfigError) as info:
        compose_config("ft", [], [tmp_path])
    (problem,) = info.value.problems
    assert problem.startswith(
        "In 'ft': Could not load 'llama_tiny_hf'. 'llama_tiny_hf' is a recipe"
    )
    assert problem.endswith(f"start yours from a copy of {list_recipes()['llama_tiny_hf']}")


def test_a_choice_in_other_case_is_named():
    assert did_you_mean("BF16", ["bf16", "fp16", "fp32"]) == " (did you mean 'bf16'?)"
    with pytest.raises(ConfigError) as info:
        compose_config("gpt_tiny", ["precision=BF16"])
    assert "precision=BF16: no such option (did you mean 'bf16'?)" in info.value.problems[0]


def test_an_interpolated_choice_is_no_mistake_and_hydras_error_is_still_told(tmp_path):
    """`optim.decay: ${oc.env:DECAY,cosine}` was called not allowed, and it hid the recipe's
    real error (a group option that does not exist) (a reviewer's find)."""
    (tmp_path / "recipes").mkdir()
    recipe = tmp_path / "recipes" / "interp.yaml"
    recipe.write_text(
        "defaults:\n  - base\n  - override parallel: fdsp\n  - _self_\n"
        "optim:\n  decay: ${oc.env:DECAY,cosine}\n"
    )
    with pytest.raises(ConfigError) as info:
        compose_config("interp", [], [tmp_path])
    (problem,) = info.value.problems
    assert problem.startswith(f"parallel=fdsp (a defaults list, composing {recipe}): no such")
