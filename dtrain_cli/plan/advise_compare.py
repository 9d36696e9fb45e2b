"""``dtrain advise`` against a layout you already have (or one a paper published): the
layout given in the overrides is costed like every candidate and the advisor's first
choice is explained against it.

    dtrain advise recipe=gpt_1b parallel.nnodes=96 dp=48 tp=8 pp=2 pipeline.schedule=1f1b

prints, under the ranking, e.g. ``given dp48xtp8xpp2 fsdp 1f1b mb1: #1 (dp192xtp2 fsdp mb1)
is estimated 12% faster: less tp comm (15% -> 1%), less bubble (9% -> 0%)``, or that the
given layout is #1, or within a few percent of it. Pure, torch-free.
"""

from __future__ import annotations

from dtrain_cli.config.schema import DtrainConfig
from dtrain_cli.errors import ConfigError
from dtrain_cli.plan.advice import Advice, Layout, Verdict
from dtrain_cli.plan.build import Resources, build_plan
from dtrain_cli.plan.layout import virtual_stages
from dtrain_cli.strategies import names as strategy_names

LAYOUT_KEYS = (
    "dp",
    "tp",
    "pp",
    "parallel",
    "parallel.dp",
    "parallel.tp",
    "parallel.pp",
    "parallel.strategy",
    "parallel.activation_checkpointing",
    "train.micro_batch_size",
    "pipeline.schedule",
    "pipeline.virtual_stages",
)
"""Overrides that name a layout: any of them makes the config's layout the reference."""
CLOSE = 0.10
"""Within this fraction of #1 the given layout is as good as the estimate can tell."""


def names_a_layout(overrides: list[str]) -> bool:
    return any(ov.partition("=")[0].lstrip("+~") in LAYOUT_KEYS for ov in overrides)


def layout_of(cfg: DtrainConfig) -> Layout:
    """The config's own layout, its micro-batch as the plan derives it when unset."""
    par, pipe = cfg.parallel, cfg.pipeline
    micro = cfg.train.micro_batch_size
    if micro is None:
        try:
            g = max(cfg.hardware.devices_per_node, 1)
            micro = build_plan(cfg, Resources(num_gpus=g, num_cpus=g)).batch.micro_batch_size
        except ConfigError:
            micro = 1
    pp = par.pp > 1
    return Layout(
        dp=par.dp,
        tp=par.tp,
        pp=par.pp,
        strategy=par.strategy if par.dp > 1 else strategy_names()[0],  # the advisor's own
        micro_batch_size=micro,
        activation_checkpointing=par.activation_checkpointing,
        schedule=pipe.schedule if pp else None,
        virtual_stages=virtual_stages(cfg) if pp else 1,
    )


def _cost_shares(v: Verdict) -> dict[str, float]:
    return {k: s for k, s in v.estimate.shares().items() if k != "compute"}


def _differences(best: Verdict, given: Verdict) -> str:
    """The costs that differ most between the two, as the given layout's share -> #1's."""
    mine, theirs = _cost_shares(given), _cost_shares(best)
    keys = sorted(set(mine) | set(theirs), key=lambda k: -abs(mine.get(k, 0) - theirs.get(k, 0)))
    parts = []
    for k in keys[:3]:
        a, b = mine.get(k, 0.0), theirs.get(k, 0.0)
        if abs(a - b) >= 0.01:
            parts.append(f"{'less' if b < a else 'more'} {k} ({a:.0%} -> {b:.0%})")
    eff_a, eff_b = given.estimate.efficiency, best.estimate.efficiency
    if abs(eff_a - eff_b) >= 0.01:
        parts.append(f"compute at {eff_b:.0%} of peak instead of {eff_a:.0%} (micro-batch, width)")
    return ", ".join(parts) or "the same costs, slightly smaller"


def compare_reference(advice: Advice, given: Verdict) -> str:
    """One line: where the given layout stands against the advisor's first choice."""
    best = advice.ranked[0]
    lay = given.layout
    head = f"given {lay.label()}"
    world = lay.dp * lay.tp * lay.pp
    if world != advice.world_size:
        return f"{head}: uses {world} devices, the advice is for {advice.world_size}"
    if given.estimate is None:
        return f"{head}: not costed: {given.rejected}"
    gain = best.estimate.tokens_per_s / given.estimate.tokens_per_s - 1
    why = _differences(best, given)
    if best.layout == lay:
        return f"{head}: is #1"
    rank = next((i for i, v in enumerate(advice.ranked, 1) if v.layout == lay), None)
    if rank:
        where = f"#{rank}"
    elif given.rejected:
        where = f"rejected: {given.rejected}"
    else:
        where = "outside the searched layouts"
    if given.rejected is None and gain <= CLOSE:
        return (
            f"{head} ({where}): #1 ({best.layout.label()}) is estimated within {max(gain, 0):.0%}"
            f" of it, as close as the estimate can tell ({why})"
        )
    if gain <= 0:
        return f"{head} ({where}): estimated {-gain:.0%} faster than #1 ({best.layout.label()})"
    return f"{head} ({where}): #1 ({best.layout.label()}) is estimated {gain:.0%} faster: {why}"
