"""What the plan says about a user's script before it runs on several ranks: read from its
syntax tree (``ast``, parsed once per file version), never by running it. A script that
starts its own ranks (``mp.spawn``, a ``multiprocessing.Process`` per rank), takes its
rank from ``--local_rank`` (the deprecated ``torch.distributed.launch``'s flag) or from
SLURM's per-task variables, joins a group only where ``--dist-url`` is given, or asks for
NCCL or CUDA on a CPU plan: each would misbehave on the ranks dtrain starts. Torch-free."""

from __future__ import annotations

import ast
import functools
import os
from collections.abc import Sequence
from pathlib import Path

from dtrain_cli.plan.plan import ScriptPlan

SPAWNERS = ("spawn", "start_processes")  # torch.multiprocessing's: mp.spawn(main, nprocs=N)


def _syntax_tree(file: str) -> ast.Module | None:
    """The script's syntax tree, parsed once for every check below (again once edited)."""
    try:
        st = os.stat(file)
    except OSError:
        return None
    return _parsed(file, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _parsed(file: str, mtime_ns: int, size: int) -> ast.Module | None:
    try:
        return ast.parse(Path(file).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None


def own_spawn_line(file: str) -> tuple[int, str] | None:
    """Where the script starts its own ranks, and how: ``torch.multiprocessing.spawn`` (or
    ``start_processes``), the shape of pytorch/examples' DDP tutorial; or a
    ``multiprocessing.Process`` in a script that hands ``init_process_group`` a rank not
    read from the environment (PyTorch's "Writing Distributed Applications"). None if
    neither."""
    if (tree := _syntax_tree(file)) is None:
        return None
    modules, functions = _multiprocessing_names(tree)
    processes = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and ast.unparse(func.value) in modules:
            if func.attr in SPAWNERS:
                return node.lineno, f"mp.{func.attr}"
            if func.attr == "Process":
                processes.append(node.lineno)
        elif isinstance(func, ast.Name) and func.id in functions:
            if functions[func.id] in SPAWNERS:
                return node.lineno, f"mp.{functions[func.id]}"
            processes.append(node.lineno)
    if processes and _ranks_its_own_group(tree):
        return min(processes), "multiprocessing.Process"
    return None


def _multiprocessing_names(tree: ast.Module) -> tuple[set[str], dict[str, str]]:
    """The names the script gives (torch.)multiprocessing, and the spawn or Process
    functions it imports from it (name -> what it is)."""
    mp = ("torch.multiprocessing", "multiprocessing")
    modules, functions = set(mp), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name in mp}
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            modules |= {a.asname or a.name for a in node.names if a.name == "multiprocessing"}
        elif isinstance(node, ast.ImportFrom) and node.module in mp:
            wanted = (*SPAWNERS, "Process") if node.module == mp[0] else ("Process",)
            functions |= {a.asname or a.name: a.name for a in node.names if a.name in wanted}
    return modules, functions


def _ranks_its_own_group(tree: ast.Module) -> bool:
    """Whether an ``init_process_group(..., rank=...)`` takes a rank not read from
    torchrun's environment (``RANK``, ``LOCAL_RANK``, ``os.environ``)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not ast.unparse(node.func).endswith(
            "init_process_group"
        ):
            continue
        for kw in node.keywords:
            if kw.arg == "rank" and not any(
                w in ast.unparse(kw.value) for w in ("RANK", "environ", "getenv")
            ):
                return True
    return False


def _arguments(tree: ast.Module) -> dict[str, tuple[str, dict[str, ast.expr]]]:
    """The script's ``add_argument("--dist-backend", default="nccl")`` flags: the name of
    the attribute argparse gives them (``dist_backend``) -> (the flag, its keywords)."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("add_argument"):
            keywords = {kw.arg: kw.value for kw in node.keywords if kw.arg}
            for flag in (a.value for a in node.args if isinstance(a, ast.Constant)):
                if str(flag).startswith("--"):
                    found[str(flag)[2:].replace("-", "_")] = (str(flag), keywords)
    return found


def _given(flag: str, args: Sequence[str]) -> bool:
    """``--dist-url env://`` or ``--dist-url=env://`` (either spelling of the dashes)."""
    spellings = {flag, "--" + flag[2:].replace("-", "_"), "--" + flag[2:].replace("_", "-")}
    return any(a.split("=")[0] in spellings for a in args)


def spawn_switch(file: str, line: int) -> str | None:
    """The flag that turns on the spawn at ``line``: an ``add_argument("--X",
    action="store_true")`` whose ``args.X`` is the test of an ``if`` around it
    (pytorch/examples' ImageNet script spawns only with ``--multiprocessing-distributed``)."""
    if (tree := _syntax_tree(file)) is None:
        return None
    switches = {
        attr: flag
        for attr, (flag, keywords) in _arguments(tree).items()
        if _constant(keywords.get("action")) == "store_true"
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and any(
            getattr(inner, "lineno", None) == line for body in node.body for inner in ast.walk(body)
        ):
            for name in ast.walk(node.test):
                if isinstance(name, ast.Attribute) and name.attr in switches:
                    return switches[name.attr]
    return None


def spawn_warning(script: ScriptPlan, world_size: int) -> str | None:
    """A script that spawns its own ranks, run on more than one: every rank spawns them
    again and their process groups collide on one address. Not where the spawn waits for a
    flag the arguments do not give."""
    if world_size <= 1 or (found := own_spawn_line(script.file)) is None:
        return None
    switch = spawn_switch(script.file, found[0])
    if switch is not None and not _given(switch, script.args):
        return None
    line, how = found
    name = script.path or script.module
    if switch is not None:
        return (
            f"script {name} line {line} starts its own processes ({how}) with {switch}: "
            f"each of the {world_size} ranks dtrain starts would start them again, on one "
            f"rendezvous address; drop {switch} (dtrain's ranks are the processes)"
        )
    return (
        f"script {name} line {line} starts its own processes ({how}): each of the "
        f"{world_size} ranks dtrain starts would start them again, on one rendezvous address; "
        f"run it as one process (dtrain run -- {name}), or let dtrain start the ranks: call "
        "its worker function once, with the rank from RANK (docs/own-script.md)"
    )


LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")


def local_rank_flag_line(file: str) -> tuple[int, str] | None:
    """The line of an ``add_argument("--local_rank", ...)`` in a script that never names
    ``LOCAL_RANK``, and the flag as the script spells it: the deprecated
    ``torch.distributed.launch`` passed that flag to each rank; torchrun and dtrain set
    ``LOCAL_RANK`` in the environment and pass no flag."""
    if (tree := _syntax_tree(file)) is None:
        return None
    found = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value == "LOCAL_RANK":
            return None  # read from the environment too (os.environ.get("LOCAL_RANK", ...))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            flags = [a.value for a in node.args if isinstance(a, ast.Constant)]
            ours = [f for f in flags if f in LOCAL_RANK_FLAGS]
            earliest = found is None or node.lineno < found[0]
            if node.func.attr == "add_argument" and ours and earliest:
                found = (node.lineno, str(ours[0]))
    return found


def local_rank_warning(script: ScriptPlan, world_size: int) -> str | None:
    """A script that takes its rank from ``--local_rank`` alone, run on more than one rank:
    every rank keeps the flag's default (often -1: "not distributed", each rank alone)."""
    if world_size <= 1 or (found := local_rank_flag_line(script.file)) is None:
        return None
    line, flag = found
    return (
        f"script {script.path or script.module} line {line} takes {flag}, which the "
        "deprecated torch.distributed.launch passed; torchrun and dtrain do not, so every "
        "rank keeps its default: read int(os.environ['LOCAL_RANK']) (docs/own-script.md)"
    )


SLURM_TASK_KEYS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS")
TORCHRUN_RANK_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


def slurm_rank_line(file: str) -> tuple[int, str] | None:
    """Where a script that never names torchrun's ``RANK``, ``LOCAL_RANK`` or
    ``WORLD_SIZE`` names SLURM's per-task variables (``rank =
    int(os.environ["SLURM_PROCID"])``, the shape of scripts started by ``srun python``), and
    which; None where it names neither or reads torchrun's too (the usual fallback)."""
    if (tree := _syntax_tree(file)) is None:
        return None
    found = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in TORCHRUN_RANK_KEYS:
                return None
            if node.value in SLURM_TASK_KEYS and (found is None or node.lineno < found[0]):
                found = (node.lineno, node.value)
    return found


def slurm_rank_warning(script: ScriptPlan, world_size: int) -> str | None:
    """A script that takes its rank from SLURM alone, run on more than one rank: dtrain (as
    torchrun under ``srun``) runs one agent per node, so SLURM's task is the node, not the
    rank; on this machine there is no SLURM task at all."""
    if world_size <= 1 or (found := slurm_rank_line(script.file)) is None:
        return None
    line, key = found
    return (
        f"script {script.path or script.module} line {line} reads {key}: dtrain starts its "
        "ranks itself (one SLURM task per node, none on a machine without SLURM), so SLURM's "
        "task variables do not name the rank: read RANK, LOCAL_RANK and WORLD_SIZE "
        "(docs/own-script.md)"
    )


def dist_url_flag(file: str) -> tuple[int, str] | None:
    """The line and default of an ``add_argument("--dist-url", default=...)`` whose default
    is not ``env://`` (pytorch/examples' ImageNet script: ``tcp://224.66.41.62:23456``,
    with ``--world-size -1``, "not distributed", unless ``--dist-url env://`` is given)."""
    if (tree := _syntax_tree(file)) is None or "dist_url" not in (flags := _arguments(tree)):
        return None
    default = flags["dist_url"][1].get("default")
    text = _constant(default)
    return None if text == "env://" or default is None else (default.lineno, str(text))


def dist_url_warning(script: ScriptPlan, world_size: int) -> str | None:
    """A script that joins a process group only where ``--dist-url`` (and the world size) is
    given, run on more than one rank without it: every rank trains alone."""
    given = _given("--dist-url", script.args)
    if world_size <= 1 or given or (found := dist_url_flag(script.file)) is None:
        return None
    return (
        f"script {script.path or script.module} line {found[0]} takes --dist-url (default "
        f"{found[1]}), which the arguments do not give: its ranks would not join one process "
        "group; add --dist-url env:// after the script (the world size and rank then come "
        "from the environment dtrain sets, as under torchrun)"
    )


def nccl_backend_line(file: str) -> tuple[int, str | None] | None:
    """The line of an ``init_process_group`` that asks for NCCL whatever the machine, and
    the flag that would change it: ``backend="nccl"``, a name only ever set to ``"nccl"``
    (nanoGPT's ``backend = 'nccl'``), or a flag's default (ImageNet's ``--dist-backend``).
    A backend chosen at run time (``"nccl" if torch.cuda.is_available() else "gloo"``) is
    not."""
    if (tree := _syntax_tree(file)) is None:
        return None
    flags = {
        attr: flag
        for attr, (flag, keywords) in _arguments(tree).items()
        if str(_constant(keywords.get("default"))).lower() == "nccl"
    }
    values: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    values.setdefault(target.id, set()).add(ast.unparse(node.value).lower())
    nccl = {"'nccl'", '"nccl"'}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not ast.unparse(node.func).endswith(
            "init_process_group"
        ):
            continue
        given = [kw.value for kw in node.keywords if kw.arg == "backend"] + node.args[:1]
        for arg in given:
            if str(_constant(arg)).lower() == "nccl":
                return node.lineno, None
            if isinstance(arg, ast.Name) and values.get(arg.id) and values[arg.id] <= nccl:
                return node.lineno, None
            if isinstance(arg, ast.Attribute) and arg.attr in flags:
                return node.lineno, flags[arg.attr]
    return None


def _constant(node: ast.expr | None) -> object:
    return node.value if isinstance(node, ast.Constant) else None


GPU_QUESTIONS = (
    "cuda.is_available",
    "cuda.device_count",
    "accelerator.is_available",
    "accelerator.current_accelerator",
    "accelerator.device_count",
)


def _checks_for_gpus(tree: ast.Module) -> bool:
    """Whether the script asks if there is a GPU (``torch.cuda.is_available()``,
    ``torch.accelerator``'s) or which device it got (``device.type == 'cuda'``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(GPU_QUESTIONS):
            return True
        if isinstance(node, ast.Compare) and any(
            _names_cuda(side) for side in (node.left, *node.comparators)
        ):
            return True
    return False


def _names_cuda(node: ast.expr) -> bool:
    """``"cuda"``, ``"cuda:0"`` or ``f"cuda:{local_rank}"``."""
    if isinstance(node, ast.JoinedStr) and node.values:
        node = node.values[0]
    return isinstance(node, ast.Constant) and str(node.value).startswith("cuda")


def cuda_line(file: str) -> tuple[int, str] | None:
    """Where a script that never asks ``torch.cuda.is_available()`` (or the device count)
    puts work on a GPU, and how: ``x.cuda()``, ``torch.cuda.set_device``,
    ``torch.device("cuda...")`` or ``.to("cuda...")``."""
    if (tree := _syntax_tree(file)) is None or _checks_for_gpus(tree):
        return None
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        first = node.args[0] if node.args else None
        if isinstance(node.func, ast.Attribute) and node.func.attr == "cuda":
            found.append((node.lineno, ".cuda()"))
        elif func.endswith("cuda.set_device"):
            found.append((node.lineno, "torch.cuda.set_device"))
        elif func.endswith(("torch.device", ".to")) and first is not None and _names_cuda(first):
            found.append((node.lineno, f"{func.split('.')[-1]}({ast.unparse(first)})"))
    return min(found, default=None)


def device_warnings(script: ScriptPlan, device: str) -> list[str]:
    """A script written for GPUs, planned where there are none: what the run would fail on,
    said before it starts (the worker's hints say it again if it does)."""
    if device != "cpu":
        return []
    name, warnings = script.path or script.module, []
    nccl = nccl_backend_line(script.file)
    if nccl is not None and not (nccl[1] and _given(nccl[1], script.args)):
        line, flag = nccl
        warnings.append(
            f"script {name} line {line} asks for backend='nccl', which needs CUDA GPUs, and "
            "this plan runs on the CPU (gloo): "
            + (
                f"add {flag} gloo after the script"
                if flag
                else "leave backend unset (torch picks gloo on CPU, nccl on CUDA)"
            )
        )
    if (found := cuda_line(script.file)) is not None:
        warnings.append(
            f"script {name} line {found[0]} puts work on CUDA ({found[1]}) and this plan runs "
            "on the CPU: pick the device with torch.device('cuda' if "
            "torch.cuda.is_available() else 'cpu')"
        )
    return warnings


def script_warnings(script: ScriptPlan, world_size: int, device: str) -> list[str]:
    """What the plan says about a script that would misbehave on ``world_size`` ranks of
    ``device``."""
    found = (
        spawn_warning(script, world_size),
        local_rank_warning(script, world_size),
        slurm_rank_warning(script, world_size),
        dist_url_warning(script, world_size),
    )
    return [w for w in found if w] + device_warnings(script, device)
