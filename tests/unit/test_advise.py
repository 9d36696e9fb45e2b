"""``dtrain advise``: the seed's rules on synthetic cases, bad input, --json and --apply
(the launch of what --apply prints: tests/launch/test_advise.py)."""

from __future__ import annotations

import json
import shlex

import pytest
from typer.testing import CliRunner

from dtrain_cli.cli.app import app
from dtrain_cli.config.compose import compose_config
from dtrain_cli.errors import ConfigError
from dtrain_cli.plan.advise import advise
from dtrain_cli.plan.steptime import placement

runner = CliRunner()

# ~22B parameters (48 layers, width 6144): 16 bytes/parameter of state is ~325 GiB, so one
# 80 GiB device cannot hold it replicated.
BIG = ["model.n_layer=48", "model.n_embd=6144", "model.n_head=48", "model.vocab_size=32000"]


def _advice(recipe: str, *overrides: str, **kw):
    return advise(compose_config(recipe, list(overrides), validate=False), **kw)


def test_small_model_on_8_devices_gets_pure_data_parallel():
    a = _advice("gpt_small", "hardware=a100_80g", "train.global_batch_size=256")
    best = a.ranked[0].layout
    assert a.world_size == 8
    assert (best.dp, best.tp, best.pp) == (8, 1, 1)
    assert best.activation_checkpointing == "none"  # nothing to save memory for
    assert "data parallel only" in a.ranked[0].why


def test_model_too_big_for_one_device_gets_fsdp_or_tp_before_pp():
    a = _advice("gpt_small", "hardware=a100_80g", "train.global_batch_size=64", *BIG)
    replicated = [v for v in a.rejected if v.layout.strategy == "ddp" and v.layout.dp == 8]
    assert replicated and all(v.kind == "memory" for v in replicated)  # ddp does not fit
    best = a.ranked[0].layout
    assert best.pp == 1 and (best.strategy == "fsdp" or best.tp > 1)
    pp_only = [v for v in a.ranked if v.layout.pp > 1]
    assert pp_only and a.ranked.index(pp_only[0]) > 0


def test_tp_never_crosses_nodes_unless_asked():
    args = ("gpt_small", "hardware=a100_80g", "parallel.nnodes=2", "train.global_batch_size=64")
    a = _advice(*args, "model.n_head=16", "model.n_embd=1024")
    assert a.world_size == 16
    assert all(v.layout.tp <= 8 for v in a.ranked)
    crossing = [v for v in a.rejected if v.layout.tp == 16]
    assert crossing and all(v.kind in ("cross-node tp", "plan") for v in crossing)
    assert any(v.kind == "cross-node tp" for v in crossing)
    forced = _advice(*args, "model.n_head=16", "model.n_embd=1024", allow_cross_node_tp=True)
    assert any(v.layout.tp == 16 for v in forced.ranked)


def test_layouts_that_do_not_fit_are_never_ranked():
    a = _advice("gpt_small", "hardware=a100_80g", "train.global_batch_size=64", *BIG)
    assert all(v.estimate.memory.total <= v.estimate.memory.capacity for v in a.ranked)
    assert any(v.kind == "memory" for v in a.rejected)
    # the same layout with checkpointing fits where without it it does not
    lays = {(v.layout.dp, v.layout.strategy, v.layout.micro_batch_size): v for v in a.ranked}
    assert any(k[2] >= 4 for k in lays)


def test_links_follow_the_mesh():
    assert placement(8, 8) == "intra" and placement(16, 8) == "inter"
    assert placement(3, 8) == "inter"  # 3 does not tile an 8-device node
    a = _advice("gpt_small", "hardware=h100_80g", "parallel.nnodes=2", "train.global_batch_size=64")
    for v in a.ranked:
        links = {x.axis: x.where for x in v.estimate.links}
        if v.layout.tp > 1:
            assert links["tp"] == "intra"
        if v.layout.dp > 1:
            assert links["dp"] == ("intra" if v.layout.dp * v.layout.tp <= 8 else "inter")


def test_checkpointing_lowers_memory_and_costs_time():
    a = _advice("gpt_small", "hardware=a100_80g", "train.global_batch_size=256")
    by = {
        v.layout.activation_checkpointing: v.estimate
        for v in a.ranked
        if (v.layout.dp, v.layout.strategy, v.layout.micro_batch_size) == (8, "ddp", 32)
    }
    assert by["full"].memory.activations < by["selective"].memory.activations
    assert by["selective"].memory.activations < by["none"].memory.activations
    assert by["none"].step_s < by["selective"].step_s < by["full"].step_s


def test_no_global_batch_is_an_error():
    with pytest.raises(ConfigError, match=r"train\.global_batch_size"):
        _advice("gpt_small", "hardware=cpu", "train.global_batch_size=null")


# -- the command: bad input, --json, --apply ----------------------------------------------------
def _cli(*args: str):
    return runner.invoke(app, ["advise", *args])


def test_the_node_count_nothing_fits_suggests_is_one_where_a_layout_fits():
    """It said 'about 5x the devices (parallel.nnodes=5)' from the bytes alone: 40 devices
    divide no global batch of 32, and the replicated part does not shrink; 8 fits."""
    big = ["recipe=gpt_small", "hardware=h100_80g", "model.n_layer=96", "model.n_embd=12288"]
    big.append("model.n_head=96")
    r = _cli(*big)
    assert r.exit_code == 2 and "try about 8x the devices (parallel.nnodes=8)" in r.output
    assert _cli(*big, "parallel.nnodes=8", "--top", "1").exit_code == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["hardware=b200"], "hardware=b200: no such option"),
        (
            ["hardware=cpu", "hardware.memory_gib=0.001", "hardware.reserved_gib=0"],
            "no layout fits 2 x cpu: the smallest",
        ),
        (["hardware=cpu", "world=5", "train.global_batch_size=7"], "global_batch_size=7"),
        (["hardware=cpu", "world=zero"], "world must be a whole number"),
        # exit 0 before: an empty ranking and a 30,000-character line; all but the last
        (["hardware=cpu", "--top", "0"], "--top=0: must be at least 1"),
        (["hardware=cpu", "--top", "-1"], "--top=-1: must be at least 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    r = _cli("recipe=gpt_tiny", *args)
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:")
    assert message in " ".join(r.output.split())
    assert "Traceback" not in r.output


def test_not_fitting_says_by_how_much_and_what_would_fit():
    r = _cli(
        "recipe=gpt_tiny", "hardware=cpu", "hardware.memory_gib=0.001", "hardware.reserved_gib=0"
    )
    text = " ".join(r.output.split())
    assert "short" in text and "GiB" in text and "parallel.nnodes=" in text


def test_json_lists_ranked_and_rejected_with_columns():
    r = _cli("recipe=gpt_small", "hardware=cpu", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["world_size"] == 2 and out["ranked"]
    first = out["ranked"][0]
    for key in ("memory_bytes", "links", "bubble", "step_s", "tokens_per_s", "mfu", "why"):
        assert key in first
    m = first["memory_bytes"]
    assert m["total"] == sum(
        m[k] for k in ("params", "grads", "optimizer", "activations", "temporary")
    )
    assert all(r["rejected"] for r in out["rejected"])
    # --top limits the ranked ones (the docs' example asks for 5; it gave all 147)
    top = json.loads(_cli("recipe=gpt_small", "hardware=cpu", "--top", "5", "--json").output)
    assert top["ranked"] == out["ranked"][:5] and top["rejected"] == out["rejected"]


def test_table_shows_top_layouts_and_rejections():
    r = runner.invoke(
        app, ["advise", "recipe=gpt_small", "hardware=cpu", "--top", "3"], env={"COLUMNS": "200"}
    )
    assert r.exit_code == 0, r.output
    assert "2 x cpu" in r.output and "rejected:" in r.output
    assert "fastest" in r.output


def test_schedules_hold_activations_and_idle_as_the_theory_says():
    a = _advice("gpt_small", "hardware=cpu", "train.global_batch_size=32")
    every = {v.layout: v for v in [*a.ranked, *a.rejected] if v.estimate is not None}

    def pick(schedule: str, micro: int):
        return next(
            v.estimate
            for lay, v in every.items()
            if lay.pp == 2
            and lay.schedule == schedule
            and lay.micro_batch_size == micro
            and lay.activation_checkpointing == "none"
        )

    gpipe, one_f = pick("gpipe", 4), pick("1f1b", 4)  # 8 micro-batches on 2 stages
    assert gpipe.memory.activations > 3 * one_f.memory.activations  # m=8 held vs <= pp=2
    assert gpipe.bubble == one_f.bubble == pytest.approx(1 / 9)
    busy = one_f.step_s - one_f.bubble_s - one_f.optimizer_s  # the optimizer runs after the flush
    assert one_f.bubble_s == pytest.approx(busy * (1 / 9) / (8 / 9))


def _numbers(advice, top: int) -> list[str]:
    from dtrain_cli.plan.advise_render import _cells

    return [c for i, v in enumerate(advice.ranked[:top], 1) for c in _cells(i, v)[2:] if c != "-"]


def test_an_80_column_terminal_or_a_pipe_never_splits_a_number():
    """Issue 24 #14: at 80 columns the table becomes paragraphs that wrap between values;
    piped, the table keeps its natural width; the rejected rows say how many they stand
    for."""
    import io

    from rich.console import Console

    from dtrain_cli.plan.advise_render import render_advice

    a = _advice("gpt_small", "hardware=cpu")
    buf = io.StringIO()
    narrow = Console(width=80, file=buf)
    narrow.print(render_advice(a, 5, narrow, 80))
    text = buf.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    for number in _numbers(a, 5):
        assert number.split(" ")[0] in text, number  # "4,999.2" of "4,999.2 ms" whole
    r = runner.invoke(app, ["advise", "recipe=gpt_small", "hardware=cpu"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    rows = [line for line in r.output.splitlines() if line.startswith("│ 1 ")]
    assert len(rows) == 2  # one row of the table, one of "why": nothing wrapped
    assert all(n in rows[0] for n in _numbers(a, 1)), rows[0]
    rejected = next(line for line in r.output.splitlines() if "dp1xpp2 1f1b mb32" in line)
    assert rejected.split("│")[1].strip() == str(len(a.rejected)) == "3"


def _stand_in_simulation(monkeypatch, tmp_path, failing: set[int]) -> list:
    """A stand-in for the simulated process (unit tests start none); the calls numbered in
    ``failing`` (1 = the first layout) fail."""
    import dtrain_cli.simulate.run as sim_run

    monkeypatch.chdir(tmp_path)
    calls = []

    def fake_run_ranks(run_dir, ranks, steps, compute, jobs=0, **kw):
        calls.append((ranks, steps, jobs))
        (run_dir / "simulate").mkdir(parents=True, exist_ok=True)
        if len(calls) in failing:
            return [{"rank": 0, "ok": False, "error": "ValueError: does not divide"}]
        b = 2**20
        return [
            {
                "rank": 0, "ok": True, "coords": {"pp": 0, "dp": 0, "tp": 0}, "compute": compute,
                "params_count": 1, "wall_s": 0.1, "params_bytes": b, "grads_bytes": b,
                "optimizer_bytes": 2 * b, "activation_bytes": b, "collectives": [],
            }
        ]  # fmt: skip

    monkeypatch.setattr(sim_run, "run_ranks", fake_run_ranks)
    return calls


def test_simulate_checks_the_top_three(tmp_path, monkeypatch):
    """--simulate runs rank 0 of each of the first 3 layouts and says how each went."""
    calls = _stand_in_simulation(monkeypatch, tmp_path, failing={2})
    r = _cli("recipe=gpt_tiny", "hardware=cpu", "data=synthetic", "--simulate", "--json")
    assert r.exit_code == 0, r.output
    checked = json.loads(r.output)["simulated"]
    assert len(checked) == 3 and calls == [([0], 1, 1)] * 3
    assert [c["ok"] for c in checked] == [True, False, True]
    assert [c["status"] for c in checked] == ["ran", "failed", "ran"]
    assert "ran; measured/plan within" in checked[0]["result"]
    assert "failed: ValueError: does not divide" in checked[1]["result"]
    ranked = json.loads(r.output)["ranked"]
    assert [c["layout"] for c in checked] == [v["layout"] for v in ranked[:3]]


def test_simulate_says_which_layouts_it_cannot_run(tmp_path, monkeypatch):
    """A layout the simulator cannot run (a parameter server's worker on fake tensors: it
    reads its servers' replies) is "not simulated", with the reason, not a failure of the
    layout."""
    from dtrain_cli.cli.advise_simulate import render
    from dtrain_cli.cli.simulate_cmd import NotSimulated, check_layout

    monkeypatch.chdir(tmp_path)
    with pytest.raises(NotSimulated, match="--compute fake: a parameter server's worker"):
        check_layout(["recipe=gpt_tiny", "dp=2", "sync.mode=param_server"], [], "0", "fake")
    row = {"layout": "dp8 zero1", "ok": False, "status": "not simulated", "result": "why"}
    table = render([row])
    assert list(table.columns[1].cells) == ["NOT SIMULATED: why"]


def test_apply_with_simulate_prints_the_first_layout_that_ran(tmp_path, monkeypatch):
    """--apply --simulate printed #1 without simulating anything; it now applies the first
    ranked layout whose simulated rank ran, and says on stderr why #1 was passed over."""
    args = ["recipe=gpt_tiny", "hardware=cpu", "data=synthetic"]
    ranked = json.loads(_cli(*args, "--json").output)["ranked"]
    calls = _stand_in_simulation(monkeypatch, tmp_path, failing={1})
    r = runner.invoke(app, ["advise", *args, "--simulate", "--apply"])
    assert r.exit_code == 0, r.output
    assert len(calls) == 3
    assert f"note: {ranked[0]['layout']} not applied: failed" in r.stderr
    a = _advice("gpt_tiny", "hardware=cpu", "data=synthetic")
    second = a.ranked[1].layout.overrides(a.nnodes)
    assert r.stdout.split() == [*args, *second] != [*args, *a.ranked[0].layout.overrides(1)]


def test_apply_with_simulate_when_nothing_ran_is_one_error(tmp_path, monkeypatch):
    _stand_in_simulation(monkeypatch, tmp_path, failing={1, 2, 3})
    r = _cli("recipe=gpt_tiny", "hardware=cpu", "data=synthetic", "--simulate", "--apply")
    assert r.exit_code == 2
    assert "error: --apply --simulate: none of the top 3 layouts ran in simulation" in r.output


def test_apply_of_a_recipe_of_your_own_names_its_folder(tmp_path):
    """`xargs dtrain launch < file` of --apply's output found no recipe of one's own (its
    --config-dir was left out), and nnodes=2 came back beside parallel.nnodes=2."""
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "mine.yaml").write_text(
        "defaults:\n  - base\n  - _self_\ntrain:\n  steps: 3\n  global_batch_size: 16\n"
    )
    r = _cli("recipe=mine", "--config-dir", str(tmp_path), "hardware=cpu", "nnodes=2", "--apply")
    assert r.exit_code == 0, r.output
    words = r.stdout.split()
    assert words[0] == "recipe=mine" and words[-2:] == ["--config-dir", str(tmp_path)]
    assert "nnodes=2" not in words and "parallel.nnodes=2" in words
    planned = runner.invoke(app, ["plan", *words])
    assert planned.exit_code == 0, planned.output


def test_apply_and_json_together_are_refused():
    r = _cli("recipe=gpt_tiny", "hardware=cpu", "--apply", "--json")
    assert r.exit_code == 2
    assert "--apply and --json each print the whole answer" in " ".join(r.output.split())


def test_ddp_buckets_are_never_more_than_the_parameter_tensors():
    """comm.bucket_mb=0.01 was estimated at 3.3x the step (bytes / bucket size all-reduces);
    DDP never splits a tensor, so a tensor a bucket is the most (measured: +12%)."""
    from dtrain_cli.cli.common import compose_and_plan
    from dtrain_cli.models import model_spec
    from dtrain_cli.plan.steptime import estimate_step

    def step_ms(bucket_mb: str) -> float:
        cfg, plan = compose_and_plan(["recipe=gpt_tiny", "dp=2", f"comm.bucket_mb={bucket_mb}"], [])
        return 1000 * estimate_step(cfg, model_spec(cfg), plan, cfg.hardware).step_s

    assert step_ms("0.01") == step_ms("0.0001")  # a bucket a tensor either way
    assert step_ms("25") < step_ms("0.01") < 1.6 * step_ms("25")


def test_layers_that_do_not_divide_the_stages_are_split_as_evenly_as_they_allow():
    """92 layers on pp=4 with 2 virtual stages (Megatron-Core's 119B) were refused by the
    plan, so the advisor costed that model without interleaving (1F1B's bubble, 16% of the
    step); a 4-layer model on 3 devices had no pipeline at all. Each rank now gets its even
    share, the layout carries the split, and --apply gives it."""
    from dtrain_cli.plan.layout import balanced_split

    assert balanced_split(92, 4, 2, v_shaped=False) == [12, 12, 12, 12, 11, 11, 11, 11]
    assert balanced_split(92, 4, 2, v_shaped=True) == [12, 12, 12, 12, 11, 11, 11, 11]
    assert balanced_split(30, 4, 1, v_shaped=False) == [8, 8, 7, 7]
    assert balanced_split(23, 2, 2, v_shaped=True) == [6, 6, 5, 6]  # V: rank 0 6+6, rank 1 6+5
    assert balanced_split(24, 4, 2, v_shaped=False) is None  # even: the plan's own split
    assert balanced_split(4, 3, 2, v_shaped=False) is None  # 6 stages, 4 layers: none
    r = _cli("recipe=gpt_tiny", "hardware=cpu", "world=3", "train.global_batch_size=7", "--apply")
    assert r.exit_code == 0, r.output
    applied = shlex.split(r.output.strip().splitlines()[-1])
    assert "parallel.pp=3" in applied and "pipeline.layers_per_stage=[2,1,1]" in applied
    plan = CliRunner().invoke(app, ["plan", "recipe=gpt_tiny", "hardware=cpu", *applied])
    assert plan.exit_code == 0, plan.output  # the advisor's layout is one the plan accepts
