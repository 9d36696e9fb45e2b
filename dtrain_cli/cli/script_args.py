"""Where a command line's overrides end and your script begins. Torch-free.

    dtrain run dp=4 launcher.max_restarts=2 -- train.py --epochs 3
    dtrain run train.py --epochs 3            # no --: the first .py file starts the script
    dtrain run dp=2 -m mypkg.train --lr 1e-3  # -m starts a module, as python -m

Everything from the script on is the script's own (``--lr=3`` too) and reaches its
``sys.argv`` untouched.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dtrain_cli.config.schema import DtrainConfig


def _is_override(token: str) -> bool:
    return "=" in token or token.startswith(("~", "+"))


def split_script(
    tokens: Sequence[str], bare_is_script: bool = False, value_options: Sequence[str] = ()
) -> tuple[list[str], list[str] | None]:
    """(dtrain's tokens, the script's tokens or None). The script starts at ``--``
    (dropped), ``-m``, the first ``*.py`` token, or the first token that is neither an
    override nor an option nor an option's value (``value_options``) and either names a
    file or comes with ``bare_is_script``. Click drops a leading ``--``, so a script file
    without ``.py`` (``dtrain plan -- exit3``) is known by being a file; ``dtrain run``
    takes any such token as its script (it says when the file is not there)."""
    tokens = list(tokens)
    skip = False
    for i, tok in enumerate(tokens):
        if skip:
            skip = False
            continue
        if tok in value_options:
            skip = True
            continue
        if tok == "--":
            return tokens[:i], tokens[i + 1 :]
        if tok == "-m" or (tok.endswith(".py") and "=" not in tok):
            return tokens[:i], tokens[i:]
        bare = not tok.startswith("-") and not _is_override(tok)
        if bare and (bare_is_script or os.path.isfile(tok)):
            return tokens[:i], tokens[i:]
    return tokens, None


def script_problems(script: list[str] | None) -> list[str]:
    if script is not None and not script:
        return ["nothing after --: name the script (dtrain run -- train.py ARGS)"]
    if script and script[0] == "-m" and len(script) < 2:
        return ["-m: name the module to run, e.g. dtrain run -m mypkg.train"]
    return []


def apply_script(cfg: DtrainConfig, script: list[str] | None) -> None:
    """The command line's script replaces a recipe's (``script.path/module/args``)."""
    if not script:
        return
    sc = cfg.script
    if script[0] == "-m":
        sc.path, sc.module, sc.args = None, script[1], list(script[2:])
    else:
        sc.path, sc.module, sc.args = script[0], None, list(script[1:])


DP_KEYS = ("dp", "parallel.dp", "parallel.nproc_per_node", "nproc_per_node")


def one_process_per_device(cfg: DtrainConfig, overrides: Sequence[str], num_gpus: int) -> None:
    """``dtrain run train.py`` with GPUs and no layout asked for: one process per GPU (as
    ``torchrun --nproc-per-node gpu``); on CPU one process unless ``dp=`` says.
    ``nproc_per_node=N`` without ``dp=``: N on each node, as torchrun's ``--nproc-per-node``
    (the script's ranks are ``N x nnodes``)."""
    par = cfg.parallel
    keys = {ov.lstrip("+~").split("=")[0] for ov in overrides}
    if par.nproc_per_node and not keys & {"dp", "parallel.dp"} and (par.tp, par.pp) == (1, 1):
        par.dp = par.nproc_per_node * max(par.nnodes, 1)
        return
    asked = bool(keys & set(DP_KEYS))
    if asked or num_gpus <= 0 or (par.dp, par.tp, par.pp) != (1, 1, 1) or par.nproc_per_node:
        return
    par.dp = num_gpus * max(par.nnodes, 1)
