"""Your own model's bad inputs (examples/my_models/net.py through the seam), refused by
``dtrain plan`` before any worker starts: one line, exit 2, nothing written. The launches
under every layout: tests/launch/test_own_model.py."""

from __future__ import annotations

import os

import pytest

from tests.conftest import REPO

EXAMPLES = REPO / "examples"
ENV = {
    "PYTHONPATH": os.pathsep.join(
        [str(EXAMPLES), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]
    )
}
# 4 steps of 8 samples; dp=1 accumulates 2 micro-batches of 4 (as dp=2 runs one each).
OWN = [
    "recipe=my_experiment",
    "--config-dir",
    str(EXAMPLES / "conf"),
    "train.steps=4",
    "train.global_batch_size=8",
    "train.micro_batch_size=4",
    "logging.every=1",
    "train.eval_every=0",
    "logging.tensorboard=false",
    "debug.replica_check_at_end=true",  # param_digest
]


def plan_error(tmp_path, monkeypatch, *overrides: str) -> str:
    """``dtrain plan`` in-process (the CLI's own entry point; torch imported once for all
    cases, not once per case): exit 2, one line, no exception, nothing written."""
    from typer.testing import CliRunner

    from dtrain_cli.cli.app import app

    monkeypatch.chdir(tmp_path)
    for path in reversed(ENV["PYTHONPATH"].split(os.pathsep)):
        if path:
            monkeypatch.syspath_prepend(path)
    result = CliRunner().invoke(app, ["plan", *OWN, *overrides])
    assert result.exit_code == 2, f"expected exit 2:\n{result.output}"
    assert isinstance(result.exception, SystemExit), result.exception  # not a traceback
    assert not (tmp_path / "runs").exists()
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["model._target_=no_such_pkg.Net"], "no module 'no_such_pkg'"),
        (["model._target_=os.system"], "standard library"),
        (["model._target_=own_targets.not_a_module"], "returned dict, not a torch.nn.Module"),
        (["model._target_=my_models.net.Nope"], "has no attribute 'Nope'"),
        # it was the last line of torch's overload list: ' * (tuple of ints size, *, ...'
        (["model.width=abc"], "model.width='abc': Net takes a number here (its default: 64)"),
        (["model.width=-3"], "RuntimeError: Trying to create tensor with negative dimension"),
        (  # it was Python's 'Net.__init__() got an unexpected keyword argument'
            ["model.colour=3"],
            "model.colour: not an argument of Net; its arguments: in_dim, width, depth, out_dim",
        ),
        (["model.widht=3"], "model.widht: not an argument of Net (did you mean 'width'?)"),
        (["tp=2"], "has no tensor-parallel plan; give one over your blocks' Linear layers"),
        (  # in the model's own names, as tp's plan is
            ["pp=2"],
            "not an nn.Sequential; name its layer list and what runs before and after it, as "
            "its forward runs them: pipeline.layers=trunk 'pipeline.first=[stem]' "
            "'pipeline.last=[readout]'",
        ),
        (["pp=2", "pipeline.layers=body"], "pipeline.layers=body"),
        (  # accepted before, and failed in step 1: stage 0 fed the input to trunk[0]
            ["pp=2", "pipeline.layers=trunk"],
            "error: pipeline.layers=trunk: no pipeline stage runs Net's stem and readout, "
            "which hold parameters or buffers: name them as its forward runs them beside trunk, "
            "e.g. "
            "pipeline.first=[stem] pipeline.last=[readout]",
        ),
        (
            ["pp=2", "pipeline.layers=trunk", "pipeline.first=[stem]"],
            "Net's readout, which holds parameters or buffers: name it as its forward runs it "
            "beside trunk, e.g. pipeline.last=[readout]",
        ),
        (["tp=2", "parallel.tp_plan={trunk.*.up:diagonal}"], "unknown style"),
        # accepted before: the first failed in step 1 (a shape error in the next layer), the
        # others split nothing or failed in parallelize_module
        (
            ["tp=2", "parallel.tp_plan={trunk.*.up:colwise}"],
            "error: parallel.tp_plan: trunk.*.up column-wise and no layer row-wise: a "
            "column-wise layer's output stays split over the tp ranks",
        ),
        (
            ["tp=2", "parallel.tp_plan={trunk.*.upp:colwise,trunk.*.down:rowwise}"],
            "error: parallel.tp_plan: trunk.*.upp matches no module of my_models.net.Net (one "
            "pattern per level of the name), so nothing would be split there; its Linear and "
            "Embedding layers: stem, trunk.0.up, trunk.0.down, trunk.1.up, trunk.1.down,",
        ),
        (
            ["tp=2", "parallel.tp_plan={trunk.*:colwise,trunk.*.down:rowwise}"],
            "error: parallel.tp_plan: trunk.*:colwise names Unit modules; a colwise split takes "
            "nn.Linear and nn.Embedding layers only (inside: trunk.0.up, trunk.0.down,",
        ),
        (["train.loss=os.path.join"], "standard library"),
        (["train.loss=huber"], "train.loss=huber: not allowed"),
        (["model._targt_=x"], "model._targt_: did you mean model._target_? (arguments of"),
        (["data._targt_=x"], "data._targt_: did you mean data._target_? (arguments of"),
        (["parallel=fsdp", "dp=2", "parallel.fsdp_units=[Block]"], "no module of those classes"),
    ],
)
def test_bad_own_model_input_is_one_line_before_anything_starts(
    tmp_path, monkeypatch, overrides, expected
):
    assert expected in plan_error(tmp_path, monkeypatch, *overrides)


def test_a_model_without_a_recipe_is_named_after_it_and_the_plan_says_whose_values(
    tmp_path, monkeypatch
):
    """Issue 24 #7: no recipe named, model=custom: the run dir and the plan's header name
    the model, not gpt_tiny, and the plan lists gpt_tiny's values it trains with (those
    the command line did not set). With a recipe, the recipe names the run."""
    from typer.testing import CliRunner

    from dtrain_cli.cli.app import app
    from dtrain_cli.config.compose import compose_config, split_recipe
    from dtrain_cli.launch.rundir import new_run_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    args = [
        "model=custom",
        "model._target_=my_models.net.Net",
        "data=custom",
        "data._target_=my_models.net.Pairs",
        "train.loss=mse",
        "steps=4",
    ]
    result = CliRunner().invoke(app, ["plan", *args])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "none (gpt_tiny's values) / Net (" in text
    assert (
        "warning: no recipe named: model Net trains with recipe gpt_tiny's values "
        "(train.global_batch_size=16, optim.base_lr=0.001, optim.warmup_steps=10, "
        "logging.every=10); set them, or name a recipe (dtrain recipes)"
    ) in text
    assert new_run_dir(compose_config(*split_recipe(args))).name.startswith("Net-")
    own = compose_config(*split_recipe(["recipe=my_experiment"]), [EXAMPLES / "conf"])
    assert new_run_dir(own).name.startswith("my_experiment-")
    plain = compose_config(*split_recipe(["dp=2"]))  # gpt_tiny's own model: its name
    assert new_run_dir(plain).name.startswith("gpt_tiny-")


def test_train_loss_model_takes_the_forms_models_return_and_names_any_other():
    """Issue 24 #8: a scalar, {"loss": scalar, ...}, (scalar, ...), an object with .loss;
    anything else says what came back and what is accepted."""
    import torch

    from dtrain_cli.models.losses import MODEL_LOSS_FORMS, model_loss

    loss, logits = torch.tensor(2.5, dtype=torch.float16), torch.zeros(8, 5)
    for returned in (
        loss,
        {"loss": loss, "logits": logits},
        (loss, logits),
        [loss],
        type("Out", (), {"loss": loss})(),
    ):
        got = model_loss(returned)
        assert got.dtype == torch.float32 and got.item() == 2.5
    for returned, said in (
        ((logits, loss), "returned a tuple (tensor (8, 5), tensor ())"),
        ({"logits": logits}, "returned a dict {'logits': tensor (8, 5)}"),
        (logits, "returned a tensor of shape (8, 5)"),
        ({"loss": logits}, "returned a dict {'loss': tensor (8, 5)}"),
        (None, "returned a NoneType"),
    ):
        with pytest.raises(ValueError) as err:
            model_loss(returned)
        assert str(err.value) == (
            f"train.loss=model: forward(inputs, targets) {said}; accepted: {MODEL_LOSS_FORMS}"
        )


def test_a_loss_of_ones_own_that_is_not_one_number_says_so(monkeypatch):
    """It stopped in backward with torch's 'grad can be implicitly created only for scalar
    outputs'; a scalar passes through as it came."""
    import torch

    from dtrain_cli.models.losses import resolve_loss

    monkeypatch.syspath_prepend(str(REPO / "tests"))
    outputs, targets = torch.randn(2, 4, 7), torch.randint(0, 7, (2, 4))
    loss = resolve_loss("own_targets.per_position_loss", [str(REPO / "tests")])
    with pytest.raises(ValueError) as err:
        loss(outputs, targets)
    assert str(err.value) == (
        "train.loss=own_targets.per_position_loss: returned a tensor of shape (8,); "
        "accepted: a scalar tensor (reduce it, e.g. with .mean())"
    )
    mean = resolve_loss("torch.nn.functional.cross_entropy")
    assert mean(outputs.flatten(0, 1), targets.flatten()).dim() == 0


def test_the_plan_measures_an_own_token_model_and_names_what_it_cannot(monkeypatch):
    """Issue 24 #4: a custom model on token data: activations measured once on the meta
    device, equal to what autograd keeps on CPU; checkpointing saves. On data=custom the
    inputs are the dataset's: "not estimated", in the plan and the advisor."""
    import torch
    import torch.nn.functional as F
    from typer.testing import CliRunner

    from dtrain_cli.cli.app import app
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.plan.build import build_plan
    from dtrain_cli.runtime.parallel.activation_checkpoint import SavedTensorMeter

    monkeypatch.chdir(REPO / "tests")
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    from own_targets import TinyLM

    lm = ["model=custom", "model._target_=own_targets.TinyLM", "model.block_size=32"]
    lm += ["model.vocab_size=256", "train.global_batch_size=4", "train.micro_batch_size=4"]
    plan = build_plan(compose_config("gpt_tiny", lm))
    assert plan.estimates.activations_estimated
    model = TinyLM(block_size=32)
    x = torch.randint(0, 256, (4, 32))
    with SavedTensorMeter(model) as meter:
        F.cross_entropy(model(x).reshape(-1, 256), x.reshape(-1))
    assert plan.estimates.bytes_activations == pytest.approx(meter.bytes, rel=0.02)
    blocks = [*lm, "pipeline.layers=blocks"]  # the blocks the plan knows of
    none = build_plan(compose_config("gpt_tiny", blocks)).estimates.bytes_activations
    assert none == pytest.approx(meter.bytes, rel=0.02)
    ac = [*blocks, "parallel.activation_checkpointing=full"]
    assert build_plan(compose_config("gpt_tiny", ac)).estimates.bytes_activations < 0.7 * none
    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])  # my_models, for data=custom
    runner = CliRunner()
    # the CLI's console is made once per process: the width a test before set stays (rich
    # reads COLUMNS when it is made), so this one sets its own
    from dtrain_cli.cli import common

    monkeypatch.setattr(common.console, "_width", 200)
    shown = runner.invoke(app, ["plan", *OWN])
    assert shown.exit_code == 0, shown.output
    said = " ".join(shown.output.split())
    assert "not estimated (the model's inputs come from your dataset)" in said
    advised = runner.invoke(app, ["advise", *OWN, "hardware=cpu", "--json"])
    assert advised.exit_code == 0, advised.output
    assert __import__("json").loads(advised.output)["activations_estimated"] is False


@pytest.mark.parametrize("target", ["AttnLM", "ReadsAValue"])
def test_an_own_attention_model_is_planned_with_what_its_run_keeps(monkeypatch, target):
    """A model of one's own with SDPA and LayerNorm: the plan measures one sample's forward
    on fake CPU tensors, where SDPA keeps no s x s scores (the meta device's math kernel
    kept them), in fp32 and with bf16 parameters under autocast (LayerNorm computes and
    keeps fp32: half the fp32 bytes is not it), what autograd keeps on real CPU tensors. A
    model that cannot be built on fake tensors is measured on the meta device: still
    estimated, with the scores, its bf16 bytes the fp32 ones halved."""
    import torch
    import torch.nn.functional as F

    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.models import model_spec
    from dtrain_cli.runtime.parallel.activation_checkpoint import SavedTensorMeter

    monkeypatch.chdir(REPO / "tests")
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    import own_targets

    lm = [f"model._target_=own_targets.{target}", "model.block_size=32", "model.vocab_size=256"]
    spec = model_spec(compose_config("gpt_tiny", ["model=custom", *lm]))
    layers = spec.facts().num_layers

    def planned(bytes_per_value: int) -> float:
        block, outside = spec.activation_bytes(4, bytes_per_value, 1)
        return block * layers + outside

    def kept(dtype: torch.dtype) -> int:
        model = own_targets.AttnLM().to(dtype)
        x = torch.randint(0, 256, (4, 32))
        low = dtype != torch.float32
        with torch.autocast("cpu", torch.bfloat16, enabled=low), SavedTensorMeter(model) as meter:
            F.cross_entropy(model(x).float().reshape(-1, 256), x.reshape(-1))
        return meter.bytes

    fp32, bf16 = kept(torch.float32), kept(torch.bfloat16)
    assert bf16 > 0.55 * fp32  # LayerNorm's fp32: more than half
    if target == "AttnLM":
        # a scalar the loss keeps is measured per sample, so 4 x its bytes: 12 bytes over
        assert (planned(4), planned(2)) == pytest.approx((fp32, bf16), abs=16)
    else:  # on the meta device: the scores too, and bf16 halved
        assert spec.activations_estimated() and planned(4) > 1.1 * fp32
        assert planned(2) == pytest.approx(planned(4) / 2, rel=0.01)  # token ids not halved


def test_an_own_model_under_tensor_parallel_is_planned_by_its_tp_plan(monkeypatch):
    """parallel.tp_plan splits the MLP's linears (up column-wise, down row-wise): every tp
    rank holds the embeddings, the norms, the head and down's bias whole, as torch's
    parallelize_module leaves them (the plan divided every tensor by tp: 1.52x under what
    a rank holds, tests/launch/test_simulate.py measures it), and the dp traffic is of
    what a rank holds."""
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.models import model_spec
    from dtrain_cli.plan.build import build_plan

    monkeypatch.chdir(REPO / "tests")
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    lm = ["model=custom", "model._target_=own_targets.TinyLM", "model.block_size=32"]
    tp = ["dp=2", "tp=2", "parallel.tp_plan={blocks.*.up:colwise,blocks.*.down:rowwise}"]
    cfg = compose_config("gpt_tiny", [*lm, *tp])
    width, vocab, depth = 32, 256, 2  # TinyLM's defaults
    norm, up = 2 * width, 4 * width * width + 4 * width  # up: weight and bias split
    # whole: embedding, position, per block the norm and down's bias, the head and its bias
    whole = vocab * width + 32 * width + depth * (norm + width) + width * vocab + vocab
    split = depth * (up + 4 * width * width)  # and down's weight
    assert model_spec(cfg).facts().params_tp_replicated == whole
    plan = build_plan(cfg)
    assert plan.estimates.params_per_rank == whole + split // 2
    ddp = build_plan(compose_config("gpt_tiny", [*lm, "dp=2"])).estimates
    held = plan.estimates.params_per_rank / ddp.params_per_rank
    assert plan.estimates.comm_bytes_per_step == pytest.approx(ddp.comm_bytes_per_step * held)


def test_an_own_model_s_blocks_are_found_without_pipeline_layers(monkeypatch):
    """Without pipeline.layers the plan counts the blocks FSDP and activation checkpointing
    wrap (the largest nn.ModuleList): checkpointing is accepted and saves, and under tensor
    parallel a block's saved tensors are split as with the list named (the plan held them
    all whole, outside any block: tests/launch/test_simulate.py measured 0.73 of what a
    rank keeps). Pipeline stages still need the list named."""
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.models import model_spec
    from dtrain_cli.plan.build import build_plan

    monkeypatch.chdir(REPO / "tests")
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    lm = ["model=custom", "model._target_=own_targets.TinyLM", "model.block_size=32"]
    lm += ["train.global_batch_size=4", "train.micro_batch_size=4"]
    tp = ["tp=2", "parallel.tp_plan={blocks.*.up:colwise,blocks.*.down:rowwise}"]
    named = ["pipeline.layers=blocks"]

    def acts(*extra: str) -> int:
        return build_plan(compose_config("gpt_tiny", [*lm, *extra])).estimates.bytes_activations

    assert model_spec(compose_config("gpt_tiny", lm)).facts().num_layers == 2
    assert acts(*tp) == acts(*tp, *named) < acts()
    assert acts("parallel.activation_checkpointing=full") < 0.7 * acts()
    assert not model_spec(compose_config("gpt_tiny", [*lm, "pp=2"])).pipeline_splittable()


def test_the_blocks_counted_are_the_fsdp_units_named(monkeypatch):
    """Without pipeline.layers the plan counts what FSDP and activation checkpointing wrap:
    the classes parallel.fsdp_units names (four attention blocks of tests/own_targets
    .PairedLM), else the largest nn.ModuleList's children (its two pairs)."""
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.models import model_spec
    from dtrain_cli.plan.build import build_plan

    monkeypatch.chdir(REPO / "tests")
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    lm = ["model=custom", "model._target_=own_targets.PairedLM", "model.block_size=32"]
    lm += ["parallel.strategy=fsdp", "dp=2", "parallel.activation_checkpointing=full"]
    named = [*lm, "parallel.fsdp_units=[AttnBlock]"]
    facts = {
        n: model_spec(compose_config("gpt_tiny", o)).facts()
        for n, o in (("pairs", lm), ("named", named))
    }
    assert (facts["pairs"].num_layers, facts["named"].num_layers) == (2, 4)
    assert facts["named"].params_per_layer * 2 == facts["pairs"].params_per_layer

    def kept(overrides: list[str]) -> int:
        return build_plan(compose_config("gpt_tiny", overrides)).estimates.bytes_activations

    assert kept(named) > kept(lm)  # four checkpointed inputs kept, not two


def test_the_suggested_tp_plan_parses_as_written():
    """The hint suggested parallel.tp_plan={"blocks.*.fc1": colwise, ...}, which Hydra's
    override grammar refuses (quoted dict keys); what it suggests now is accepted."""
    import re

    from dtrain_cli.config.overrides import _parse
    from dtrain_cli.models.custom.spec import CustomSpec

    hint = CustomSpec.tp_hint(None)  # type: ignore[arg-type]  # no model: placeholders
    key, value = re.search(r"'(parallel\.tp_plan)=(\{.*\})'", hint).groups()
    parsed, problem = _parse(key, value, delete=False)
    assert problem is None and parsed == {"blocks.*.fc1": "colwise", "blocks.*.fc2": "rowwise"}
    # with a model, in its own names (docs/own-model.md's Net: trunk.*.up, trunk.*.down)


def test_the_tp_hint_names_the_model_s_own_layers_and_its_override_plans(tmp_path, monkeypatch):
    """tp=2 without a plan: the hint's override, copied as printed, makes a plan that
    builds (my_models.net.Net: trunk.*.up, trunk.*.down)."""
    import re

    from typer.testing import CliRunner

    from dtrain_cli.cli.app import app

    line = plan_error(tmp_path, monkeypatch, "tp=2")
    (override,) = re.findall(r"'(parallel\.tp_plan=\{.*\})'", line)
    assert override == "parallel.tp_plan={trunk.*.up:colwise,trunk.*.down:rowwise}"
    result = CliRunner().invoke(app, ["plan", *OWN, "tp=2", override])
    assert result.exit_code == 0, result.output


def test_parameters_of_the_model_itself_are_named_when_a_pipeline_would_drop_them(monkeypatch):
    """TinyLM adds its own ``pos`` parameter in its forward, which a pipeline stage replaces
    (first -> layers -> last): no stage would add it, and the run would train a different
    model. The plan says so; at pp=1 the same pipeline keys are only unread."""
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.errors import ConfigError
    from dtrain_cli.plan.build import build_plan

    monkeypatch.chdir(REPO / "tests")
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    lm = ["model=custom", "model._target_=own_targets.TinyLM", "model.block_size=32"]
    lm += ["model.vocab_size=256", "pipeline.layers=blocks", "pipeline.first=[embed]"]
    lm += ["pipeline.last=[head]"]
    with pytest.raises(ConfigError) as err:
        build_plan(compose_config("gpt_tiny", [*lm, "pp=2"]))
    assert err.value.problems == [
        "pipeline.layers=blocks: no pipeline stage runs TinyLM's own parameters or buffers "
        "(pos), used only by its forward, which a stage replaces: keep them in a module named "
        "in pipeline.first or pipeline.last"
    ]
    assert build_plan(compose_config("gpt_tiny", lm)).world_size == 1
    with pytest.raises(ConfigError) as err:  # no layer list named: the hint names them all
        build_plan(compose_config("gpt_tiny", [*lm[:4], "pp=2"]))
    assert err.value.problems[0].endswith(
        "pipeline.layers=blocks 'pipeline.first=[embed]' 'pipeline.last=[head]'; its own "
        "parameters or buffers (pos) would run on no stage"
    )


@pytest.mark.parametrize(
    ("target", "extra", "says"),
    [
        # trained at pp=2 without the buffer (the loss of a model without positions)
        (
            "BufferPosLM",
            ["pp=2"],
            "pipeline.layers=blocks: no pipeline stage runs BufferPosLM's own parameters or "
            "buffers (pos),",
        ),
        # each stage held a copy of the tied weight and trained it apart (or failed at start-up)
        (
            "TiedLM",
            ["pp=2"],
            "pipeline.layers=blocks: embed.weight and head.weight are one tied parameter, which "
            "two pipeline stages would each hold a copy of and train apart; untie them or use "
            "pp=1",
        ),
        (  # an nn.Sequential's stages: its children
            "tied_sequential",
            ["pp=2"],
            "parallel.pp=2: 0.weight and 3.weight are one tied parameter",
        ),
        # tensor parallel gave the embedding its own DTensor: trained untied, without a word
        (
            "TiedLM",
            ["tp=2", "parallel.tp_plan={embed:rowwise,blocks.*.up:colwise,blocks.*.down:rowwise}"],
            "parallel.tp_plan: splits embed.weight, which is tied to head.weight: tensor "
            "parallel would give each its own copy, trained apart; leave embed out of",
        ),
        # fully_shard refused it on every rank at start-up
        (
            "TiedLM",
            ["dp=2", "parallel.strategy=fsdp", "parallel.fsdp_units=[Embedding,Block]"],
            "parallel.fsdp_units=['Embedding', 'Block']: embed.weight (embed), head.weight (the "
            "root) are one tied parameter in two FSDP groups",
        ),
        # the norm after it got half the features: a shape error at step 1
        (
            "TinyLM",
            ["tp=2", "parallel.tp_plan={embed:colwise,blocks.*.up:colwise,blocks.*.down:rowwise}"],
            "parallel.tp_plan: embed:colwise splits an Embedding's features over the tp ranks",
        ),
        # passed the plan; every rank failed at start-up cutting windows of 32.5 tokens
        (
            "TinyLM",
            ["model.block_size=32.5"],
            "model.block_size=32.5: dtrain reads it as a whole number of tokens (the window "
            "length); give an integer of at least 1",
        ),
        # failed in backward at step 1 (dp=2: DDP's 'is not needed' at start-up)
        (
            "FrozenLM",
            ["dp=2"],
            "model._target_=own_targets.FrozenLM: no parameter requires grad (34,496 frozen): "
            "nothing would train; leave some trainable (requires_grad=True)",
        ),
        # every rank stopped at start-up in the sample stream: int // NoneType
        (
            "TinyLM",
            ["~model.block_size"],
            "model.block_size: not set; data.source=builtin cuts token windows of "
            "model.block_size tokens, given to TinyLM as its block_size argument: set "
            "model.block_size=N, or train on your own dataset with data=custom",
        ),
    ],
)
def test_a_model_the_layout_cannot_train_is_refused_by_the_plan(target, extra, says, monkeypatch):
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.errors import ConfigError
    from dtrain_cli.plan.build import build_plan

    monkeypatch.chdir(REPO / "tests")
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    lm = ["model=custom", f"model._target_=own_targets.{target}", "model.block_size=32"]
    if target != "tied_sequential":
        lm += ["pipeline.layers=blocks", "pipeline.first=[embed]", "pipeline.last=[head]"]
    with pytest.raises(ConfigError) as err:
        build_plan(compose_config("gpt_tiny", [*lm, *extra]))
    assert any(p.startswith(says) for p in err.value.problems), err.value.problems


def test_a_forward_that_fails_on_one_sample_is_said_in_one_line(monkeypatch, capfd):
    """The plan measures one sample's forward: one that raises was 100 lines of torch's
    fake-tensor log and "not estimated (the model's inputs come from your dataset)", exit 0,
    on token data (a new user's find). One warning names the exception."""
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.plan.build import build_plan

    monkeypatch.chdir(REPO / "tests")
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    lm = ["model=custom", "model._target_=own_targets.BreaksOnWidth", "model.block_size=32"]
    plan = build_plan(compose_config("gpt_tiny", lm))
    said = [w for w in plan.warnings if "forward and loss failed" in w]
    assert len(said) == 1 and "(RuntimeError: " in said[0] and "[1, 32, 256]" in said[0], said
    assert "on one sample of 32 tokens" in said[0] and not plan.estimates.activations_estimated
    out, err = capfd.readouterr()
    assert "fake_tensor" not in out + err and "Traceback" not in out + err


@pytest.mark.parametrize(
    "extra", [[], ["dp=2", "parallel.strategy=fsdp", "parallel.fsdp_units=[Block]"]]
)
def test_a_module_under_two_names_is_planned(monkeypatch, extra, tmp_path):
    """A block shared by the layers (ALBERT) and an alias of the head: the plan counted the
    tied parameters' owners by module name and failed with a KeyError (a review's find);
    the shared block is one FSDP unit, so its units are no tied split."""
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.plan.build import build_plan

    monkeypatch.chdir(REPO / "tests")
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    from dtrain_cli.models.custom import spec

    monkeypatch.setenv("DTRAIN_CACHE", str(tmp_path / "cache"))  # measured, not recorded
    monkeypatch.setattr(spec, "_RECORDS", {})
    lm = ["model=custom", "model._target_=own_targets.SharedBlockLM", "model.block_size=32"]
    plan = build_plan(compose_config("gpt_tiny", [*lm, *extra]))
    width, vocab = 32, 256
    block = 2 * width + 2 * (4 * width * width + 4 * width) - 3 * width  # norm, up, down
    assert plan.estimates.num_params == vocab * width + 32 * width + block + width * vocab + vocab


@pytest.mark.parametrize(
    ("split", "ok"),
    [
        # Megatron's vocabulary-parallel embedding, then its projection split as a Linear
        ("embed:rowwise,embed_proj:colwise", True),
        # accepted for a while by a name rule: a row-wise head of the embedding's width
        # does not read it (a review's find: step 1 failed on a shape)
        ("embed:colwise,head:rowwise", False),
    ],
)
def test_a_factorized_embedding_splits_as_its_vocabulary(monkeypatch, split, ok):
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.errors import ConfigError
    from dtrain_cli.plan.build import build_plan

    monkeypatch.chdir(REPO / "tests")
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    target = "FactorizedLM" if ok else "TinyLM"
    lm = ["model=custom", f"model._target_=own_targets.{target}", "model.block_size=32"]
    tp = f"parallel.tp_plan={{{split},blocks.*.up:colwise,blocks.*.down:rowwise}}"
    cfg = compose_config("gpt_tiny", [*lm, "tp=2", tp])
    if ok:
        assert build_plan(cfg).world_size == 2
    else:
        with pytest.raises(ConfigError) as err:
            build_plan(cfg)
        assert "embed:colwise splits an Embedding's features" in str(err.value)
