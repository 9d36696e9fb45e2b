"""``dtrain plan`` on screen: the Plan as rich tables."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Group
from rich.table import Table

from dtrain_cli.plan.layout import plural
from dtrain_cli.plan.plan import Plan
from dtrain_cli.rundir import env
from dtrain_cli.rundir.layout import RunDir

MAX_RANK_ROWS = 16


def bytes_text(n: int) -> str:
    """``1.5 KiB``, ``337.8 MiB``, ``20.5 GiB``: the unit that keeps the number short."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _kv(title: str, rows: list[tuple[str, object]]) -> Table:
    t = Table(title=title, show_header=False, title_justify="left", min_width=50)
    t.add_column(style="bold")
    t.add_column()
    for k, v in rows:
        t.add_row(k, str(v))
    return t


def render_plan(plan: Plan, recipe_named: bool = True) -> Group:
    """Every section of the plan as a table, then the ranks, then the warnings.
    ``recipe_named`` False: the command line named no recipe (the header says whose values
    apply; a warning names them). A script's plan shows only what applies to a script."""
    parts: list = [_layout(plan, recipe_named)]
    if plan.script is None:
        parts += [_batch(plan), _schedule(plan), _checkpoints(plan), _estimates(plan)]
    else:
        parts.append(_script_values(plan))
    if plan.pipeline is not None:
        parts.append(_pipeline_table(plan))
    if plan.elastic is not None:
        parts.append(_elastic_table(plan))
    if plan.sync is not None:
        from dtrain_cli.plan.sync import sync_rows

        parts.append(_kv("sync", sync_rows(plan.sync)))
    parts.append(_ranks(plan))
    parts += [f"[yellow]warning:[/] {w}" for w in plan.warnings]
    return Group(*parts)


def _layout(plan: Plan, recipe_named: bool) -> Table:
    e = plan.estimates
    recipe = plan.recipe if recipe_named else f"none ({plan.recipe}'s values)"
    what = (
        ("recipe", recipe)
        if plan.script
        else ("recipe / model", f"{recipe} / {plan.model} ({e.num_params:,} parameters)")
    )
    return _kv(
        "layout",
        [
            what,
            (
                "world size",
                f"{plan.world_size} = {plan.nnodes} node(s) x "
                + plural(plan.nproc_per_node, "process", "processes"),
            ),
            ("mesh", plan.mesh.label()),
            *([] if plan.script else [("strategy", plan.strategy)]),  # a script's own
            ("device / backend", f"{plan.device} / {plan.backend}"),
            ("threads per process", plan.threads_per_proc),
            ("start method / restarts", f"{plan.start_method} / {plan.max_restarts}"),
        ],
    )


def _batch(plan: Plan) -> Table:
    b = plan.batch
    if b.unit == "tokens":
        totals = [
            ("global batch", f"{b.global_batch_size} sequences of {b.seq_len} tokens"),
            ("tokens per step", f"{b.tokens_per_step:,}"),
            ("steps / tokens in all", f"{plan.steps:,} / {plan.steps * b.tokens_per_step:,}"),
        ]
    else:
        totals = [
            ("global batch", f"{b.global_batch_size} samples"),
            ("steps / samples in all", f"{plan.steps:,} / {plan.steps * b.global_batch_size:,}"),
        ]
    micro = ("micro batch x accum x dp", f"{b.micro_batch_size} x {b.grad_accum} x {b.dp}")
    return _kv("batch", [micro, *totals])


def _schedule(plan: Plan) -> Table:
    lr, prec = plan.lr, plan.precision
    return _kv(
        "learning rate",
        [
            ("base lr @ base batch", f"{lr.base_lr:g} @ {lr.base_batch_size}"),
            ("scaling -> peak lr", f"{lr.scaling} -> {lr.peak_lr:.4g}"),
            ("warmup", plural(lr.warmup_steps, "step")),
            (
                "decay",
                f"{lr.decay} to {lr.min_lr:g} over "
                + plural(max(0, lr.steps - lr.warmup_steps), "step"),
            ),
            (
                "precision",
                f"{prec.name} (autocast {prec.autocast_dtype or 'off'}, "
                f"loss scaling {'on' if prec.loss_scaling else 'off'})",
            ),
        ],
    )


def _checkpoints(plan: Plan) -> Table:
    ck = plan.checkpoint
    saves = ", ".join(map(str, ck.steps[:8])) + (" ..." if len(ck.steps) > 8 else "")
    return _kv(
        "checkpoints",
        [
            (
                "every",
                f"{plural(ck.every_steps, 'step') if ck.every_steps else '- steps'}, "
                f"{f'{ck.every_minutes:g} minute(s)' if ck.every_minutes else '- minutes'}",
            ),
            ("keep last / async", f"{ck.keep_last} / {ck.async_save}"),
            ("saves at steps", saves or "none"),
        ],
    )


def _estimates(plan: Plan) -> Table:
    e = plan.estimates
    sharded = f" (sharded over dp={plan.dims.dp_shard})" if _shards_params(plan) else ""
    recompute = f", checkpointing {e.activation_checkpointing})" if e.bytes_recompute else ")"
    rows = [
        (
            "parameters (largest stage)" if plan.pipeline else "parameters",
            f"{e.params_per_rank:,} of {e.num_params:,}",
        ),
        ("parameter bytes held" + sharded, bytes_text(e.bytes_params)),
        ("gradients", bytes_text(e.bytes_grads)),
        ("optimizer state", bytes_text(e.bytes_optimizer)),
        (
            (
                "activations (per micro batch, largest stage"
                if plan.pipeline
                else "activations (per micro batch"
            )
            + recompute,
            bytes_text(e.bytes_activations)
            if e.activations_estimated
            else "not estimated (the model's forward failed on one sample: see the warnings)"
            if plan.batch.unit == "tokens"
            else "not estimated (the model's inputs come from your dataset)",
        ),
    ]
    if e.bytes_recompute:
        rows.append(("recompute (one block, backward)", bytes_text(e.bytes_recompute)))
    if e.bytes_gathered:
        rows.append(("one unit gathered (transient)", bytes_text(e.bytes_gathered)))
    unit = "token" if plan.batch.unit == "tokens" else "sample"
    rows += [
        (  # the peak, with every micro-batch a pipeline keeps in flight: the step line
            "total (one micro batch in flight)",
            bytes_text(e.bytes_total) + ("" if e.activations_estimated else " + activations"),
        ),
        (f"FLOPs per {unit} (fwd+bwd)", f"{e.flops_per_token:,}"),
    ]
    if plan.batch.dp > 1:  # what comm.compression and the strategy change
        rows.append(("dp bytes sent per step", bytes_text(e.comm_bytes_per_step)))
    return _kv("estimates per rank", rows)


def _script_values(plan: Plan) -> Table:
    """A script's run: the plan's values it may read (``dtrain_cli.script_env``); the
    trainer's own sections (parameters, memory, step time) do not apply to it."""
    b, lr, ck = plan.batch, plan.lr, plan.checkpoint
    saves = ", ".join(map(str, ck.steps[:8])) + (" ..." if len(ck.steps) > 8 else "")
    return _kv(
        "for your script, if it reads them (dtrain_cli.script_env)",
        [
            ("micro batch x accum x dp", f"{b.micro_batch_size} x {b.grad_accum} x {b.dp}"),
            ("global batch / steps", f"{b.global_batch_size} / {plan.steps:,}"),
            (
                "lr_at(step)",
                f"{lr.peak_lr:.4g} peak, warmup {plural(lr.warmup_steps, 'step')}, {lr.decay} "
                f"to {lr.min_lr:g}",
            ),
            ("should_checkpoint(step)", f"at steps {saves}" if saves else "never"),
        ],
    )


def _ranks(plan: Plan) -> Table:
    ranks = Table(title="rank -> mesh coordinates", title_justify="left")
    ranks.add_column("rank")
    for name in plan.mesh.dim_names:
        ranks.add_column(name)
    for row in plan.rank_table()[:MAX_RANK_ROWS]:
        if row.get("role") == "server":  # param_server: outside the mesh
            cells = [f"server, shard {row['shard']}", *("" for _ in plan.mesh.dim_names[1:])]
            ranks.add_row(str(row["rank"]), *cells)
        else:
            ranks.add_row(*(str(row[k]) for k in ("rank", *plan.mesh.dim_names)))
    if plan.world_size > MAX_RANK_ROWS:
        ranks.add_row("...", *("" for _ in plan.mesh.dim_names))
    return ranks


def render_script(plan: Plan, rdzv_endpoint: str, rdzv_timeout_s: int) -> Table:
    """``dtrain plan ... -- train.py``: what every rank runs and what it is given."""
    import shlex

    sc = plan.script
    assert sc is not None
    n, local = plan.world_size, plan.nproc_per_node
    return _kv(
        "script (run on every rank as __main__, as torchrun would)",
        [
            ("command", shlex.join([sc.python or sys.executable, *sc.argv()])),
            ("file", sc.file),
            ("working directory", sc.workdir),
            ("processes", f"{n} = {plan.nnodes} node(s) x {local}, start {plan.start_method}"),
            (
                "env (each rank)",
                f"RANK=0..{n - 1} LOCAL_RANK=0..{local - 1} WORLD_SIZE={n} "
                f"LOCAL_WORLD_SIZE={local} GROUP_RANK=<node> ROLE_RANK ROLE_WORLD_SIZE={n} "
                f"MASTER_ADDR MASTER_PORT {env.RESTART_COUNT} "
                f"TORCHELASTIC_MAX_RESTARTS={plan.max_restarts} TORCHELASTIC_RUN_ID "
                f"OMP_NUM_THREADS={plan.threads_per_proc} {env.RUN_DIR} {env.PLAN} {env.CONFIG}",
            ),
            ("rendezvous", f"c10d at {rdzv_endpoint}, timeout {rdzv_timeout_s} s"),
            ("restarts", f"{plan.max_restarts} (the whole group restarts when a rank fails)"),
            (
                "logs",
                f"{RunDir(Path('RUN_DIR')).rank_log(0).with_name('rank_<k>.log')} "
                "(every rank's stdout and stderr)",
            ),
        ],
    )


def _pipeline_table(plan: Plan) -> Table:
    pipe = plan.pipeline
    assert pipe is not None
    title = (
        f"pipeline: {pipe.schedule}, {plural(pipe.num_stages, 'stage')} "
        f"({pipe.virtual_stages} per rank), "
        f"{plural(pipe.microbatches, 'micro-batch', 'micro-batches')} x "
        f"{pipe.calls_per_step} call(s) per step, "
        f"bubble {pipe.bubble:.1%} (theory)"
    )
    t = Table(title=title, title_justify="left")
    for col in ("stage", "pp rank", "layers", "embed/head", "parameters", "activations"):
        t.add_column(col)
    for st in pipe.stages:
        ends = "+".join(n for n, on in (("embed", st.embeddings), ("head", st.head)) if on)
        t.add_row(
            str(st.stage),
            str(st.pp_rank),
            f"{st.layers[0]}-{st.layers[1] - 1}",
            ends or "-",
            f"{st.params:,}",
            bytes_text(st.activation_bytes),
        )
    return t


def _elastic_table(plan: Plan) -> Table:
    """``parallel.nnodes=MIN:MAX``: each node count, its layout or why it is refused."""
    el = plan.elastic
    assert el is not None
    t = Table(
        title=f"elastic membership: {el.min_nnodes}-{el.max_nnodes} nodes "
        f"(global batch {plan.batch.global_batch_size}, LR schedule unchanged)",
        title_justify="left",
    )
    for col in ("nodes", "world", "mesh", "micro x accum x dp", "status"):
        t.add_column(col)
    rows = {s.nnodes: s for s in el.sizes}
    reasons = {r["nnodes"]: r["reason"] for r in el.refused}
    for n in range(el.min_nnodes, el.max_nnodes + 1):
        if n in rows:
            s, b = rows[n], rows[n].batch
            shape = " x ".join(
                f"{d}={v}" for d, v in zip(plan.mesh.dim_names, s.mesh_shape, strict=True)
            )
            layout = f"{b.micro_batch_size} x {b.grad_accum} x {b.dp}"
            t.add_row(str(n), str(s.world_size), shape, layout, "ok")
        else:
            t.add_row(str(n), "-", "-", "-", f"refused: {reasons.get(n, '')}")
    return t


def _shards_params(plan: Plan) -> bool:
    from dtrain_cli.strategies import strategy_for

    return strategy_for(plan.strategy).shards_params and plan.dims.dp_enabled
