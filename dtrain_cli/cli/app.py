"""The ``dtrain`` command. Imports no torch: ``dtrain --help`` and ``dtrain plan`` stay fast.

dtrain recipes
dtrain plan   recipe=gpt_small dp=2
dtrain advise recipe=gpt_small hardware=h100_80g parallel.nnodes=8
dtrain launch recipe=gpt_small dp=2
dtrain run    dp=2 -- train.py --epochs 3
dtrain k8s    recipe=gpt_small parallel.nnodes=2 cluster.image=IMAGE --dry-run
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading

import typer

from dtrain_cli import __version__
from dtrain_cli.cli.advise_cmd import advise
from dtrain_cli.cli.agent_cmd import agent
from dtrain_cli.cli.checkpoints_cmd import checkpoints
from dtrain_cli.cli.compare_cmd import compare
from dtrain_cli.cli.env_cmd import env
from dtrain_cli.cli.export_cmd import export
from dtrain_cli.cli.k8s_cmd import k8s_app
from dtrain_cli.cli.launch_cmd import launch
from dtrain_cli.cli.plan_cmd import plan
from dtrain_cli.cli.pool_cmd import pool
from dtrain_cli.cli.recipes_cmd import recipes
from dtrain_cli.cli.report_cmd import report
from dtrain_cli.cli.resume_cmd import resume
from dtrain_cli.cli.run_cmd import RUN_SETTINGS, run
from dtrain_cli.cli.sbatch_cmd import sbatch
from dtrain_cli.cli.simulate_cmd import simulate
from dtrain_cli.cli.validate_cmd import validate_cluster
from dtrain_cli.rundir.protocol import EXIT_INTERRUPTED

OVERRIDE_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}

app = typer.Typer(
    name="dtrain",
    help="Declarative distributed PyTorch training: a YAML recipe in, a resumable run out."
    "\n\nGuides: README.md (the quick start), then docs/ (one guide per task).",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},  # every command inherits it
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
app.command(context_settings=OVERRIDE_SETTINGS)(launch)
app.command(
    context_settings=RUN_SETTINGS,
    options_metavar="[OPTIONS] [OVERRIDES] [--] SCRIPT.py|-m MODULE [ARGS]",
)(run)
app.command(context_settings=OVERRIDE_SETTINGS)(plan)
app.command(context_settings=OVERRIDE_SETTINGS)(advise)
app.command(context_settings=OVERRIDE_SETTINGS)(simulate)
app.command(context_settings=OVERRIDE_SETTINGS)(resume)
app.command()(recipes)
app.command()(checkpoints)
app.command()(export)
app.command(context_settings=OVERRIDE_SETTINGS)(sbatch)
app.add_typer(k8s_app, name="k8s")
app.command(name="validate-cluster")(validate_cluster)
app.command()(agent)
app.command()(report)
app.command()(compare)
app.command()(env)
app.command()(pool)


def _one_line_summaries(typer_app: typer.Typer) -> None:
    """Each command's line in a ``--help`` list is its docstring's first paragraph on one
    line: in rich markup mode Typer keeps the docstring's own line breaks there, which
    broke a summary mid-sentence ("(+ a JSON model" / "config), or ...")."""
    for info in typer_app.registered_commands:
        doc = (info.help or getattr(info.callback, "__doc__", None) or "").strip()
        if "``" in doc:  # reST's literal marks, printed as they are: the house's one backtick
            doc = info.help = doc.replace("``", "`")
        if info.short_help is None and doc:
            info.short_help = " ".join(doc.split("\n\n", 1)[0].split())
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _one_line_summaries(group.typer_instance)


_one_line_summaries(app)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"dtrain {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Show the version and exit."
    ),
) -> None:
    """dtrain: config -> plan -> distributed run."""


def main() -> None:
    """The ``dtrain`` command. A command that imported torch (launch, run, resume, agent:
    the elastic agent) leaves without the interpreter's teardown of torch's modules, which
    takes most of a second on 2 cores after the run is done: the threads are joined and
    the exit handlers run as at a normal exit, then the process ends with the same code.
    A command stopped by Ctrl-C (130) leaves that way too: CPython remembers a
    KeyboardInterrupt raised while C code ran Python (``import torch`` does) even after
    dtrain caught it, and its own exit would then end the process by SIGINT, not 130."""
    try:
        app()
        code: object = 0
    except SystemExit as exc:  # how click ends every command
        code = exc.code
    if "torch" not in sys.modules and code != EXIT_INTERRUPTED:
        raise SystemExit(code)
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    if code is not None and not isinstance(code, int):  # sys.exit("message")
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing left to say
            stream.flush()
    os._exit(code or 0)
