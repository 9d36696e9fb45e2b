"""``dtrain pool``: the warm worker pool that local launches start their workers from.

dtrain pool          # is one running, for this dtrain and Python?
dtrain pool stop     # end it now (it ends by itself after DTRAIN_WARM_POOL_IDLE_S idle)
"""

from __future__ import annotations

import typer

ACTIONS = ("status", "stop")


def pool(
    action: str = typer.Argument("status", help="status (default) or stop."),
) -> None:
    """Show or stop the warm worker pool: a process that keeps torch and the worker imported
    between local launches, so the next one starts sooner.

    Guide: docs/performance.md"""
    from dtrain_cli.launch import warm_pool

    if action not in ACTIONS:
        typer.echo(f"error: unknown action {action!r}; allowed: {', '.join(ACTIONS)}", err=True)
        raise typer.Exit(2)
    if action == "stop":
        stopped = warm_pool.stop_pool()
        typer.echo("warm pool stopped" if stopped else "no warm pool is running")
        return
    state = warm_pool.pool_status()
    if state is None:
        wanted = (
            ""
            if warm_pool.wanted()
            else " (and launches here start none: DTRAIN_WARM_POOL, or a scheduler's job)"
        )
        typer.echo(f"no warm pool is running{wanted}")
        return
    note = "current" if state.get("current") else "stale: the next launch replaces it"
    typer.echo(
        f"warm pool pid {state.get('pid')}: {state.get('servers')} launch(es) served now; {note}"
    )
