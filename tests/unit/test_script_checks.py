"""A script that would misbehave on the ranks dtrain starts is named in the plan's
warnings (dtrain_cli/plan/script_checks.py): one that starts its own ranks with
torch.multiprocessing.spawn (under dp=2 each rank spawned two more on one rendezvous
address and the run failed with a lost peer), takes its rank from --local_rank, or from
SLURM's per-task variables; on a CPU plan, one that asks for NCCL or CUDA whatever the
machine (said only when the ranks failed, before)."""

from __future__ import annotations

import pytest

from dtrain_cli.plan.plan import ScriptPlan
from dtrain_cli.plan.script_checks import (
    cuda_line,
    device_warnings,
    nccl_backend_line,
    own_spawn_line,
    script_warnings,
    spawn_warning,
)

MAIN = "def main(rank, world):\n    pass\n\n"


def _script(tmp_path, source: str) -> tuple[str, ScriptPlan]:
    """``source`` as train.py, and the plan of ``dtrain run -- train.py``."""
    script = tmp_path / "train.py"
    script.write_text(source)
    plan = ScriptPlan(path="train.py", module=None, args=[], file=str(script), workdir=".")
    return str(script), plan


SPAWNING = [
    "import torch.multiprocessing as mp\n" + MAIN + "mp.spawn(main, args=(2,), nprocs=2)\n",
    "import torch.multiprocessing\n" + MAIN + "torch.multiprocessing.spawn(main, (2,), 2)\n",
    "from torch import multiprocessing as tmp\n" + MAIN + "tmp.start_processes(main, nprocs=2)\n",
    "from torch.multiprocessing import spawn as go\n" + MAIN + "go(main, nprocs=2)\n",
    "import torch.multiprocessing as mp\n" + MAIN + "if __name__ == '__main__':\n"
    "    mp.spawn(main, nprocs=2, join=True)\n",
]
NOT_SPAWNING = [
    MAIN + "main(0, 1)\n",
    "import multiprocessing as mp\n" + MAIN + "mp.Process(target=main).start()\n",
    "def spawn(f, nprocs):\n    f(0, 1)\n" + MAIN + "spawn(main, nprocs=2)\n",
    "import os\nos.spawnl(os.P_WAIT, '/bin/true')\n",
    "import torch.multiprocessing as mp\nmp.set_start_method('spawn')\n",
    # a helper process in a torchrun-style script: its rank comes from the environment
    "import os, multiprocessing as mp\nimport torch.distributed as dist\n"
    "dist.init_process_group('gloo', rank=int(os.environ['RANK']), world_size=2)\n"
    "mp.Process(target=print).start()\n",
]
# PyTorch's "Writing Distributed Applications": Process per rank, the rank handed over
INIT = "    dist.init_process_group('gloo', rank=rank, world_size=size)\n"
PROCESSES = [
    "import torch.multiprocessing as mp\nimport torch.distributed as dist\n"
    "def init_process(rank, size):\n" + INIT + "for rank in range(2):\n"
    "    p = mp.Process(target=init_process, args=(rank, 2))\n    p.start()\n",
    "from multiprocessing import Process\nfrom torch import distributed as dist\n"
    "def init_process(rank, size):\n" + INIT + "ps = [Process(target=init_process, "
    "args=(r, 2)) for r in range(2)]\n",
]


@pytest.mark.parametrize("source", PROCESSES)
def test_a_script_that_starts_a_process_per_rank_is_found(source, tmp_path):
    script, plan = _script(tmp_path, source)
    line = next(n for n, text in enumerate(source.splitlines(), 1) if "Process(" in text)
    assert own_spawn_line(script) == (line, "multiprocessing.Process")
    said = f"script train.py line {line} starts its own processes (multiprocessing.Process)"
    assert spawn_warning(plan, 2).startswith(said)


@pytest.mark.parametrize("source", SPAWNING)
def test_a_script_that_spawns_its_ranks_is_found(source, tmp_path):
    script, plan = _script(tmp_path, source)
    line, how = own_spawn_line(script)
    calls = [n for n, text in enumerate(source.splitlines(), 1) if "(main, " in text]
    assert line == calls[-1] and how.startswith("mp.")
    warning = spawn_warning(plan, 2)
    assert warning.startswith(f"script train.py line {line} starts its own processes")
    assert "dtrain run -- train.py" in warning
    assert spawn_warning(plan, 1) is None  # one rank: the script's own spawn is the layout


@pytest.mark.parametrize("source", NOT_SPAWNING)
def test_other_scripts_are_left_alone(source, tmp_path):
    script, _ = _script(tmp_path, source)
    assert own_spawn_line(script) is None


@pytest.mark.parametrize(
    ("source", "said", "named"),
    [
        ("spawn", "line 5 starts its own processes (mp.spawn)", "starts its own processes"),
        ("local_rank", "line 3 takes --local_rank", "takes --local_rank"),
        ("slurm", "line 2 reads SLURM_PROCID", "reads SLURM_PROCID"),
    ],
)
def test_the_plan_of_such_a_script_warns_on_two_ranks_only(
    source, said, named, tmp_path, monkeypatch
):
    from typer.testing import CliRunner

    from dtrain_cli.cli.app import app

    text = {"spawn": SPAWNING[0], "local_rank": TAKES_LOCAL_RANK[0], "slurm": SLURM_RANK[0]}[source]
    (tmp_path / "train.py").write_text(text)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["plan", "dp=2", "--", "train.py"])
    assert result.exit_code == 0, result.output
    assert f"warning: script train.py {said}" in result.output
    one = CliRunner().invoke(app, ["plan", "--", "train.py"])
    assert one.exit_code == 0 and named not in one.output


ARGS = "import argparse\np = argparse.ArgumentParser()\n"
TAKES_LOCAL_RANK = [
    ARGS + 'p.add_argument("--local_rank", type=int, default=-1)\n',
    ARGS + "p.add_argument('--local-rank', '--local_rank', type=int, default=0)\n",
]
READS_THE_ENVIRONMENT = [
    ARGS + 'import os\np.add_argument("--local_rank", type=int, '
    'default=int(os.environ.get("LOCAL_RANK", -1)))\n',
    "import os\nlocal_rank = int(os.environ['LOCAL_RANK'])\n",
    ARGS + 'p.add_argument("--rank", type=int, default=0)\n',
]


@pytest.mark.parametrize("source", TAKES_LOCAL_RANK)
def test_a_script_that_takes_its_rank_from_local_rank_alone_is_named(source, tmp_path):
    """torch.distributed.launch passed --local_rank; torchrun and dtrain do not, so every
    rank of such a script kept the default (-1: 'not distributed', each rank alone)."""
    from dtrain_cli.plan.script_checks import local_rank_flag_line, local_rank_warning

    script, plan = _script(tmp_path, source)
    flag = "--local-rank" if "'--local-rank'" in source else "--local_rank"  # as it spells it
    assert local_rank_flag_line(script) == (3, flag)
    warning = local_rank_warning(plan, 2)
    assert warning.startswith(f"script train.py line 3 takes {flag}, which")
    assert "read int(os.environ['LOCAL_RANK'])" in warning
    assert local_rank_warning(plan, 1) is None


@pytest.mark.parametrize("source", READS_THE_ENVIRONMENT)
def test_a_script_that_reads_local_rank_from_the_environment_is_left_alone(source, tmp_path):
    from dtrain_cli.plan.script_checks import local_rank_flag_line

    script, _ = _script(tmp_path, source)
    assert local_rank_flag_line(script) is None


def test_an_edited_script_is_read_again(tmp_path):
    """The script's syntax tree is kept per file and version: an edit is seen."""
    import os

    from dtrain_cli.plan.script_checks import local_rank_flag_line

    script = tmp_path / "train.py"
    script.write_text(TAKES_LOCAL_RANK[0])
    assert local_rank_flag_line(script) == (3, "--local_rank")
    script.write_text(READS_THE_ENVIRONMENT[1] + "\n")
    os.utime(script, ns=(1, 1))  # another version even within the clock's resolution
    assert local_rank_flag_line(script) is None


SLURM_RANK = [
    "import os\nrank = int(os.environ['SLURM_PROCID'])\nn = int(os.environ['SLURM_NTASKS'])\n",
    "import os\nlocal = os.getenv('SLURM_LOCALID', '0')\n",
]
SLURM_WITH_TORCHRUN = [
    # the usual fallback (DeiT's, MAE's init_distributed_mode): torchrun's first
    "import os\nif 'RANK' in os.environ:\n    rank = int(os.environ['RANK'])\n"
    "elif 'SLURM_PROCID' in os.environ:\n    rank = int(os.environ['SLURM_PROCID'])\n",
    "import os\nprint(os.environ.get('SLURM_JOB_ID'))\n",  # the job, not the task
]


@pytest.mark.parametrize("source", SLURM_RANK)
def test_a_script_that_takes_its_rank_from_slurm_alone_is_named(source, tmp_path):
    """dtrain (as torchrun under srun) runs one SLURM task per node: SLURM_PROCID is the
    node's index there, and on a machine without SLURM it is not set."""
    from dtrain_cli.plan.script_checks import slurm_rank_line, slurm_rank_warning

    script, plan = _script(tmp_path, source)
    line, key = slurm_rank_line(script)
    assert line == 2 and key in source.splitlines()[1]
    warning = slurm_rank_warning(plan, 2)
    assert warning.startswith(f"script train.py line 2 reads {key}: dtrain starts its ranks")
    assert warning.endswith("read RANK, LOCAL_RANK and WORLD_SIZE (docs/own-script.md)")
    assert slurm_rank_warning(plan, 1) is None


@pytest.mark.parametrize("source", SLURM_WITH_TORCHRUN)
def test_a_script_that_reads_torchruns_rank_first_is_left_alone(source, tmp_path):
    from dtrain_cli.plan.script_checks import slurm_rank_line

    script, _ = _script(tmp_path, source)
    assert slurm_rank_line(script) is None


DIST = "import os, torch\nimport torch.distributed as dist\n"
# (source, the nccl line, the CUDA line and how): pytorch/examples' ddp-tutorial-series
# multigpu_torchrun.py (set_device, then backend="nccl"), nanoGPT's train.py (backend a name
# set once; its device checked with 'cuda' in device), a plain .cuda(), an f-string device
WRITTEN_FOR_GPUS = [
    (
        DIST + "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"
        "dist.init_process_group(backend='nccl')\n",
        4,
        (3, "torch.cuda.set_device"),
    ),
    (
        DIST + "backend = 'nccl'\ndevice = 'cuda'\ndist.init_process_group(backend=backend)\n"
        "device_type = 'cuda' if 'cuda' in device else 'cpu'\n",
        5,
        None,
    ),
    (
        DIST + "dist.init_process_group('NCCL')\nmodel = torch.nn.Linear(2, 2).cuda()\n",
        3,
        (4, ".cuda()"),
    ),
    (
        DIST + "x = torch.ones(2).to(f\"cuda:{os.environ['LOCAL_RANK']}\")\n",
        None,
        (3, "to(f\"cuda:{os.environ['LOCAL_RANK']}\")"),
    ),
]
# what runs on both: the backend and the device chosen at run time
CHOOSES_AT_RUN_TIME = [
    DIST + "dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo')\n"
    "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n",
    DIST + "backend = 'gloo'\nif torch.cuda.is_available():\n    backend = 'nccl'\n"
    "    torch.cuda.set_device(0)\ndist.init_process_group(backend)\n",
    DIST + "use = torch.accelerator.is_available()\nmodel = torch.nn.Linear(2, 2)\n"
    "if use:\n    model.cuda()\ndist.init_process_group()\n",
]


@pytest.mark.parametrize("source, nccl, cuda", WRITTEN_FOR_GPUS)
def test_a_script_written_for_gpus_is_named_on_a_cpu_plan(source, nccl, cuda, tmp_path):
    script, plan = _script(tmp_path, source)
    found = nccl_backend_line(script)
    assert (found and found[0], cuda_line(script)) == (nccl, cuda)
    said = device_warnings(plan, "cpu")
    assert len(said) == (nccl is not None) + (cuda is not None)
    if nccl is not None:
        assert said[0].startswith(f"script train.py line {nccl} asks for backend='nccl'")
    if cuda is not None:
        assert said[-1].startswith(f"script train.py line {cuda[0]} puts work on CUDA")
    assert device_warnings(plan, "cuda") == []


@pytest.mark.parametrize("source", CHOOSES_AT_RUN_TIME)
def test_a_script_that_picks_its_backend_and_device_is_left_alone(source, tmp_path):
    _, plan = _script(tmp_path, source)
    assert device_warnings(plan, "cpu") == []


def test_the_plan_says_it_before_the_ranks_start(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from dtrain_cli.cli.app import app

    (tmp_path / "train.py").write_text(WRITTEN_FOR_GPUS[0][0])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("dtrain_cli.plan.build.visible_gpu_count", lambda: 0)
    result = CliRunner().invoke(app, ["plan", "dp=2", "--", "train.py"])
    assert result.exit_code == 0, result.output
    assert "warning: script train.py line 4 asks for backend='nccl'" in result.output
    assert "warning: script train.py line 3 puts work on CUDA (torch.cuda.set_device)" in (
        result.output
    )


# pytorch/examples' ImageNet script, in short: distributed only with --dist-url env:// (or a
# world size), spawning only with --multiprocessing-distributed, NCCL a flag's default
IMAGENET = (
    "import argparse\nimport torch.distributed as dist\nimport torch.multiprocessing as mp\n"
    "p = argparse.ArgumentParser()\n"
    "p.add_argument('--world-size', default=-1, type=int)\n"
    "p.add_argument('--dist-url', default='tcp://224.66.41.62:23456', type=str)\n"
    "p.add_argument('--dist-backend', default='nccl', type=str)\n"
    "p.add_argument('--multiprocessing-distributed', action='store_true')\n"
    "def main_worker(gpu, n, args):\n"
    "    dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url)\n"
    "args = p.parse_args()\n"
    "if args.multiprocessing_distributed:\n"
    "    mp.spawn(main_worker, nprocs=2, args=(2, args))\n"
    "else:\n"
    "    main_worker(None, 1, args)\n"
)


@pytest.mark.parametrize(
    "args, said",
    [
        (
            [],
            [
                "line 6 takes --dist-url (default tcp://224.66.41.62:23456), which the "
                "arguments do not give",
                "line 10 asks for backend='nccl', which needs CUDA GPUs, and this plan runs on "
                "the CPU (gloo): add --dist-backend gloo after the script",
            ],
        ),
        (["--dist-url", "env://", "--dist-backend", "gloo"], []),
        (["--dist-url=env://", "--dist-backend=gloo"], []),
        (
            ["--dist-url", "env://", "--dist-backend", "gloo", "--multiprocessing-distributed"],
            [
                "line 13 starts its own processes (mp.spawn) with --multiprocessing-distributed:"
                " each of the 2 ranks dtrain starts would start them again, on one rendezvous "
                "address; drop --multiprocessing-distributed"
            ],
        ),
    ],
)
def test_a_script_distributed_by_its_flags_is_told_which_to_give(args, said, tmp_path):
    """ImageNet's script under ``dtrain run dp=2``: without ``--dist-url env://`` every rank
    trained alone (said only at the end), and its ``mp.spawn`` was named although it waits
    for ``--multiprocessing-distributed``."""
    _, plan = _script(tmp_path, IMAGENET)
    plan.args = args
    warnings = script_warnings(plan, 2, "cpu")
    assert len(warnings) == len(said), warnings
    for warning, text in zip(warnings, said, strict=True):
        assert warning.startswith(f"script train.py {text}"), warning
    assert script_warnings(plan, 1, "cuda") == []
