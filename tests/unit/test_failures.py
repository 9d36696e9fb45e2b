"""The launcher's failure report names the first failure in time (launch/failures.py), from
the agent's per-worker results and the workers' notes. Torch-free, fast."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dtrain_cli.launch.failures import Failed, describe, failure_hint, from_agent

RESET = "RuntimeError: [gloo/transport/tcp/pair.cc:534] Read error: Connection reset by peer"


def agent_failure(pid: int, exitcode: int, timestamp: int, message: str = "") -> SimpleNamespace:
    """What torch's ProcessFailure holds: an error file's data for a Python exception,
    torch's own message for a signal."""
    data = {}
    if message:
        data = {"message": {"message": message, "extraInfo": {"py_callstack": "Traceback ..."}}}
    else:
        message = f"Signal {-exitcode} received by PID {pid}"
    return SimpleNamespace(
        pid=pid, exitcode=exitcode, timestamp=timestamp, message=message, error_file_data=data
    )


LOST = f"; rank 0 then lost its peer ({RESET})"


def test_a_killed_rank_is_named_not_the_rank_that_lost_it():
    """torch reports the first dead process it finds: often the rank that lost its peer."""
    failures = {0: agent_failure(100, 1, 1000, RESET)}
    note = {"pid": 100, "rank": 0, "step": 2, "time": 1000.4, "error": RESET}
    drill = {"pid": 101, "rank": 1, "step": 2, "time": 1000.1, "signal": "SIGKILL"}
    code, text = describe(from_agent(failures, {100: note, 101: drill}, [0, 1]))
    assert text == "rank 1 was killed by SIGKILL after step 2" + LOST and code == 1
    # no drill (the OOM killer): the rank that left no error of its own is named
    _, text = describe(from_agent(failures, {100: note}, [0, 1]))
    assert text == (
        "rank 1 ended without an error of its own (killed by a signal?) after step 2" + LOST
    )
    # the agent saw the killed rank itself: its exit code names the signal
    failures[1] = agent_failure(101, -9, 1000)
    _, text = describe(from_agent(failures, {100: note}, [0, 1]))
    assert text == "rank 1 was killed by SIGKILL after step 2" + LOST


def test_the_earlier_own_error_is_the_cause_and_where_it_was_raised_shown():
    failures = {0: agent_failure(100, 1, 1001, RESET)}
    notes = {
        100: {"pid": 100, "rank": 0, "step": 0, "time": 1001.9, "error": RESET},
        101: {"pid": 101, "rank": 1, "step": 0, "time": 1001.2, "error": "KeyError: 'w'"},
    }
    code, text = describe(from_agent(failures, notes, [0, 1]))
    assert code == 1
    assert text == "rank 1 failed in step 1 (exit code 1): KeyError: 'w'" + LOST + (
        "\n  traceback in logs/rank_1.log"
    )
    failures = {1: agent_failure(101, 3, 1001, "KeyError: 'w'")}
    code, text = describe(from_agent(failures, notes, [0, 1]))
    assert code == 3 and text.startswith(
        "rank 1 failed in step 1 (exit code 3): KeyError: 'w'" + LOST
    )


STACK = (
    """Traceback (most recent call last):
  File "/work/dtrain_cli/runtime/worker.py", line 99, in main
    trainer.train()
"""
    + "".join(
        f'  File "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line {n}, in f\n'
        "    return forward_call(*args, **kwargs)\n"
        for n in range(1700, 1725)
    )
    + """  File "/work/my_models/net.py", line 42, in forward
    h = self.stem(x) @ self.w
  File "/venv/lib/python3.11/site-packages/torch/nn/functional.py", line 9, in linear
    return torch._C._nn.linear(x, w)
RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x16 and 32x64)
"""
)
ERROR = "RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x16 and 32x64)"


def test_the_same_error_on_every_rank_is_one_short_report_whichever_arrives_first():
    """Issue 24 #9: both ranks raise the same error; torch reports one of them (with its
    58-line traceback), the other leaves only its note, and either may come first. The
    report is the same every time: the lowest rank, one line, where it was raised."""
    from dtrain_cli.rundir.notes import frame_label

    where = frame_label("/work/my_models/net.py", 42, "forward")  # as the note writes it
    assert where == "work/my_models/net.py:42 in forward"
    reports = set()
    for reported, first in ((0, 0), (0, 1), (1, 0), (1, 1)):
        fail = agent_failure(100 + reported, 1, 1000, ERROR)
        fail.error_file_data["message"]["extraInfo"]["py_callstack"] = STACK
        notes = {
            100 + r: {
                "pid": 100 + r,
                "rank": r,
                "step": 4,
                "time": 1000.1 if r == first else 1000.3,
                "error": ERROR,
                "where": where,
            }
            for r in (0, 1)
        }
        reports.add(describe(from_agent({reported: fail}, notes, [0, 1])))
    assert reports == {
        (
            1,
            f"rank 0 failed after step 4 (exit code 1): {ERROR}; rank 1 too\n"
            f"  at {where}; traceback in logs/rank_0.log",
        )
    }


def test_a_script_that_ends_itself_is_not_reported_as_an_error():
    """Colleague's d: ``print("hello"); sys.exit(3)`` on both ranks: the last line the script
    printed is quoted as such, not shown as if it were the error."""
    failed = [
        Failed(rank=r, exitcode=3, headline="hello", detail="hello", time=1000.0 + r, exited=True)
        for r in (1, 0)
    ]
    code, text = describe(failed, steps_known=False)
    assert (code, text) == (3, 'rank 0 exited with code 3 (its last line: "hello"); rank 1 too')
    silent = Failed(rank=1, exitcode=3, time=1000.0, exited=True)
    assert describe([silent], steps_known=False) == (3, "rank 1 exited with code 3")
    # sys.exit(4 + rank): 'rank 1 too' hid that rank 1 exited with 5
    failed = [
        Failed(rank=r, exitcode=4 + r, headline="hi", detail="hi", time=1000.0 + r, exited=True)
        for r in (0, 1)
    ]
    assert describe(failed, steps_known=False)[1] == (
        'rank 0 exited with code 4 (its last line: "hi"); rank 1 also exited with code 5'
    )


def test_a_rank_that_stopped_answering_is_named():
    timeout = "RuntimeError: [gloo] Timed out waiting 300000ms for recv operation to complete"
    failures = {0: agent_failure(100, 1, 1000, timeout)}
    notes = {100: {"pid": 100, "rank": 0, "step": 7, "time": 1000.1, "error": timeout}}
    _, text = describe(from_agent(failures, notes, [0, 1]))
    assert (
        text
        == f"rank 1 stopped answering (frozen?) after step 7; rank 0 then lost its peer ({timeout})"
    )


def test_a_scripts_exception_is_named_though_its_stdout_landed_after_the_traceback(tmp_path):
    """stdout and stderr reach a rank's log through two pipes: a line printed before the
    raise can be written after the traceback (it was, on a loaded machine, and the report
    named that line instead of the exception)."""
    from dtrain_cli.launch.script import failure_tail
    from dtrain_cli.rundir.layout import RunDir

    log = RunDir(tmp_path).rank_log(1)
    log.parent.mkdir(parents=True)
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "probe.py", line 55, in <module>\n'
        '    raise ValueError("boom from rank 1")\n'
        "ValueError: boom from rank 1\n"
        "rank 1 about to fail\n"
    )
    headline, _, detail = failure_tail(tmp_path, 1).partition("\n")
    assert headline == "ValueError: boom from rank 1"
    assert detail.splitlines()[0].startswith("Traceback") and "about to fail" not in detail


def test_a_cuda_error_on_a_machine_without_cuda_says_what_runs_on_both():
    """torch.cuda.set_device in a script written for GPUs, on a CPU wheel, ended in
    "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'" alone."""
    from dtrain_cli.launch.failures import failure_hint

    cpu_wheel = "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'"
    failures = {0: agent_failure(100, 1, 1000, cpu_wheel)}
    _, text = describe(from_agent(failures, {}, [0]), steps_known=False)
    assert text.startswith(f"rank 0 failed (exit code 1): {cpu_wheel}; the code uses CUDA, ")
    assert "torch.device('cuda' if torch.cuda.is_available() else 'cpu')" in text
    assert "CPU wheel" in failure_hint("AssertionError: Torch not compiled with CUDA enabled")
    no_gpu = "RuntimeError: Found no NVIDIA driver on your system."
    assert "this machine has no GPU" in failure_hint(no_gpu)
    ordinal = "torch.AcceleratorError: CUDA error: invalid device ordinal"
    assert "parallel.nproc_per_node" in failure_hint(ordinal)
    assert failure_hint("KeyError: 'w'") is None
    ddp_ids = (
        "ValueError: DistributedDataParallel device_ids and output_device arguments only work "
        "with single-device/multiple-device GPU modules or CPU modules, but got device_ids [0]"
    )
    assert "if torch.cuda.is_available() else None" in failure_hint(ddp_ids)


IN_USE = (
    "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
    "network address. port: 12355, useIpv6: false, code: -98, name: EADDRINUSE, message: "
    "address already in use"
)


def test_a_port_already_in_use_is_the_ranks_own_failure_with_what_holds_it():
    """The DDP tutorial (mp.spawn, MASTER_PORT=12355) under dp=2: rank 0's spawned ranks
    could not host their store. It was reported as rank 0 having lost its peer to a rank 1
    that "ended without an error of its own"."""
    from dtrain_cli.rundir.notes import is_peer_loss

    assert not is_peer_loss(IN_USE) and is_peer_loss(RESET)
    ended = Failed(rank=0, exitcode=1, headline=IN_USE, time=1000.0, exited=True)
    silent = Failed(rank=1, exitcode=None, time=1001.0)
    code, text = describe([ended, silent], steps_known=False)
    assert code == 1
    assert text.startswith(f'rank 0 exited with code 1 (its last line: "{IN_USE}"); another')
    assert "the script sets its own MASTER_PORT on more than one rank" in text
    assert "starts its own ranks on each of them (run it as one process)" in text
    # a script hosting its own TCPStore at MASTER_PORT hit the launcher's store there
    assert "so a TCPStore of the script's there connects on every rank (is_master=False)" in text
    failures = {0: agent_failure(100, 1, 1000, IN_USE)}
    _, text = describe(from_agent(failures, {}, [0]), steps_known=False)
    assert text.startswith(f"rank 0 failed (exit code 1): {IN_USE}; another process on this")


def test_the_same_error_with_each_ranks_own_numbers_is_one_report():
    """nanoGPT's DDP(model, device_ids=[local_rank]) on CPU parameters fails on every rank
    with its own device id; the report named rank 1, then 'rank 0 also failed (...)' with
    the whole message again. The same error told apart only by a rank's numbers is one."""
    msg = (
        "ValueError: DistributedDataParallel device_ids and output_device arguments only "
        "work with single-device/multiple-device GPU modules or CPU modules, but got "
        "device_ids [{r}], output_device None, and module parameters {{device(type='cpu')}}."
    )
    failed = [Failed(rank=r, exitcode=1, headline=msg.format(r=r), time=1000.0 - r) for r in (0, 1)]
    code, text = describe(failed, steps_known=False)  # a script's run, as nanoGPT's
    hint = failure_hint(msg.format(r=0))
    assert hint and "device_ids" in hint
    assert code == 1
    assert text == f"rank 0 failed (exit code 1): {msg.format(r=0)}; {hint}; rank 1 too"
    other = Failed(rank=1, exitcode=1, headline="KeyError: 'LOCAL_RANK'", time=999.0)
    _, text = describe([failed[0], other], steps_known=False)
    assert text.endswith("; rank 0 also failed (" + msg.format(r=0) + ")")


def test_nodes_that_never_meet_are_one_line_not_torchs_traceback():
    """A node 0 whose other nodes never came, and a node that found no store at the
    endpoint, ended in torch's RendezvousTimeoutError / RendezvousConnectionError trace."""
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousConnectionError,
        RendezvousStateError,
        RendezvousTimeoutError,
    )

    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.launch.rendezvous_failure import rendezvous_failure

    cfg = compose_config("gpt_tiny", ["launcher.rdzv_timeout_s=5"])
    cfg.launcher.rdzv_endpoint = "node0:29500"

    def config(is_host: bool | None, nodes: tuple[int, int] = (2, 2)) -> SimpleNamespace:
        hosting = {} if is_host is None else {"is_host": is_host}
        return SimpleNamespace(
            run_id="exp1", min_nodes=nodes[0], max_nodes=nodes[1], rdzv_configs=hosting
        )

    said = rendezvous_failure(RendezvousTimeoutError(), config(True), cfg)
    assert said.startswith(
        "the rendezvous at node0:29500 (id exp1) did not gather --nnodes 2 within "
        "launcher.rdzv_timeout_s=5: start every node with the same --rdzv-endpoint"
    )
    elastic = rendezvous_failure(RendezvousTimeoutError(), config(True, (1, 4)), cfg)
    assert "did not gather --nnodes 1:4 within" in elastic
    lost = RendezvousConnectionError("The connection to the C10d store has failed.")
    lost.__cause__ = RuntimeError("client socket has timed out after 60s while connecting")
    said = rendezvous_failure(lost, config(False), cfg)
    assert said.startswith("this node could not reach the rendezvous store at node0:29500")
    assert "(client socket has timed out after 60s while connecting)" in said
    assert "start node 0 (--node-rank 0) first" in said
    # the same error once the run trained: node 0 was there, and ended (it said to start
    # node 0 first, which had been training)
    said = rendezvous_failure(lost, config(False), cfg, trained=True)
    assert said.startswith("lost the rendezvous store at node0:29500 (id exp1): node 0, which")
    unsaid = rendezvous_failure(lost, config(None), cfg, trained=True)  # maybe the host itself
    assert not unsaid.startswith("lost the rendezvous store")
    assert said.endswith("run the launch command again on every node to continue from the "
                         "newest checkpoint")  # fmt: skip
    lost.__cause__ = RuntimeError("The server socket has failed to listen (errno: 98 - EADDRINUSE)")
    said = rendezvous_failure(lost, config(None), cfg)
    assert said.startswith("this node could not host the rendezvous store at node0:29500")
    assert "another node started as --node-rank 0" in said
    broken = RendezvousStateError("The rendezvous state is corrupt.")
    said = rendezvous_failure(broken, config(True), cfg)
    assert said == (
        "the rendezvous at node0:29500 (id exp1) failed: RendezvousStateError: "
        "The rendezvous state is corrupt."
    )


def test_a_restart_after_a_real_kill_names_the_rank_that_left_no_note(tmp_path, monkeypatch):
    """A real SIGKILL writes no note: the restarted group said 'rank(s) 0 lost a peer
    (another rank was killed?)', the survivor the subject; the rank without a note is
    named, as the launcher's report names a silent rank."""
    from dtrain_cli.rundir.notes import attempt_cause, write_note

    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    lost = RuntimeError("[../third_party/gloo/transport/tcp/pair.cc:534] Connection reset by peer")
    write_note(tmp_path, 0, 30, lost)
    assert attempt_cause(tmp_path, 0, 2) == (
        "rank 1 ended without an error of its own after step 30 (killed by a signal?); "
        "rank(s) 0 then lost a peer"
    )
    assert (
        attempt_cause(tmp_path, 0)
        == "rank(s) 0 lost a peer after step 30 (another rank was killed?)"
    )
    write_note(tmp_path, 1, 30, None, signal="SIGKILL")  # a drill says what it sends itself
    assert attempt_cause(tmp_path, 0, 2) == "rank 1 was killed by SIGKILL after step 30"


def test_every_failed_process_adds_only_ranks_dead_before_the_poll(tmp_path, monkeypatch):
    """The poll reports one failure, then ends the rest (SIGTERM, SIGKILL 30 s later): a
    rank that had died by itself before it is added (and noted, killed by a signal); one
    ended by the poll's clean-up is not, whatever its code (a reviewer's find: a rank
    ignoring SIGTERM was blamed as 'killed by SIGKILL')."""
    import json
    import signal

    from torch.distributed.elastic.multiprocessing import api

    from dtrain_cli.launch.every_failure import every_failed_process

    procs = [SimpleNamespace(pid=100 + r, exitcode=None) for r in range(4)]
    procs[0].exitcode, procs[1].exitcode = 1, -signal.SIGKILL  # dead when the poll began

    def poll(self):  # torch's: rank 0 reported; the clean-up ends ranks 2 and 3
        procs[2].exitcode, procs[3].exitcode = -signal.SIGKILL, -signal.SIGTERM
        failure = api.ProcessFailure(local_rank=0, pid=100, exitcode=1, error_file="none")
        return api.RunProcsResult(failures={0: failure})

    monkeypatch.setattr(api.MultiprocessContext, "_poll", poll)
    ctx = SimpleNamespace(
        _pc=SimpleNamespace(processes=procs),
        error_files={r: "none" for r in range(4)},
        envs={r: {"RANK": str(4 + r), "TORCHELASTIC_RESTART_COUNT": "1"} for r in range(4)},
    )
    with every_failed_process(tmp_path):
        result = api.MultiprocessContext._poll(ctx)
    assert sorted(result.failures) == [0, 1]
    assert result.failures[1].exitcode == -signal.SIGKILL
    (note,) = [json.loads(p.read_text()) for p in (tmp_path / "logs" / "failures").iterdir()]
    assert (note["rank"], note["pid"], note["signal"], note["attempt"]) == (5, 101, "SIGKILL", 1)
    assert api.MultiprocessContext._poll is poll  # put back after the agent


def test_a_node_whose_ranks_all_lost_their_peer_says_another_node_ended_first():
    """Node 1's launcher killed: node 0's rank only lost its peer, and was reported as
    'rank 0 failed after step 13 (exit code 1)' with dtrain's own frame as the cause (a new
    user's find). A node sees only its own ranks (no silent rank to name)."""
    lost = Failed(rank=0, exitcode=1, headline=RESET, time=1000.0, step=13, detail="  at x.py:3")
    code, text = describe([lost], multi_node=True)
    assert code == 1
    assert text == (
        f"rank 0 lost its peer after step 13 ({RESET}): a rank of another node ended first; "
        "that node's report and logs say why\n  at x.py:3"
    )
    # one node: no other node to blame (a reviewer's find: a script whose ranks all hit
    # 'Connection refused' from a service was told so)
    _, alone = describe([lost])
    assert alone.startswith("rank 0 failed after step 13 (exit code 1)") and "another" not in alone


@pytest.mark.parametrize(
    ("code", "started", "said"),
    [
        (130, False, "the run stopped before its workers started"),  # Ctrl-C at start-up
        (1, True, "the run failed before its first step"),
    ],
)
def test_a_removed_run_dir_says_how_the_start_ended(tmp_path, capsys, code, started, said):
    """Ctrl-C 0.3 s into `dtrain run` said 'the run failed before its first step': the user
    stopped it, and a script has no step dtrain sees."""
    from dtrain_cli.cli.launch_cmd import report_failure

    run_dir = tmp_path / "runs" / "r1"
    (run_dir / "logs").mkdir(parents=True)
    result = SimpleNamespace(ok=False, exit_code=code, message="x", workers_started=started)
    report_failure(result, run_dir=run_dir, fresh=True, fresh_root=False)
    assert capsys.readouterr().err.splitlines()[-1] == f"removed {run_dir}: {said}"
    assert not run_dir.exists()


def test_a_preemption_is_reported_as_no_error(tmp_path, capsys):
    """Exit 75 (a checkpoint saved, to be requeued) printed 'error: preempted: ...'."""
    from dtrain_cli.cli.launch_cmd import report_failure

    said = "preempted: checkpoint saved at step 10; `dtrain resume --ckpt runs/r1` continues"
    result = SimpleNamespace(ok=False, exit_code=75, message=said, workers_started=True)
    report_failure(result, run_dir=tmp_path, fresh=True, fresh_root=False)
    assert capsys.readouterr().err.splitlines()[0] == said
    assert tmp_path.is_dir()  # a preempted run is never removed


def test_an_error_file_a_full_disk_left_empty_is_dropped(tmp_path):
    """torch's ProcessFailure re-raises an error file's JSON error: a rank that failed on a
    full disk left a 0-byte file and the launcher ended in a 180-line traceback."""
    from dtrain_cli.launch.every_failure import drop_unreadable_error_files

    empty, good, running = tmp_path / "0.json", tmp_path / "1.json", tmp_path / "2.json"
    empty.write_text("")
    good.write_text('{"message": {"message": "boom"}}')
    running.write_text("")  # still being written by a live worker: left alone
    files = {0: str(empty), 1: str(good), 2: str(running), 3: str(tmp_path / "none.json")}
    assert drop_unreadable_error_files(files, {0, 1, 3}) == [str(empty)]
    assert not empty.exists() and good.exists() and running.exists()


def test_a_checkpoints_folder_that_cannot_be_written_is_said_before_the_start(
    tmp_path, monkeypatch
):
    """A read-only checkpoints/ was found at the first save: every step up to it trained
    and was lost (a user's find)."""
    from dtrain_cli.cli import launch_cmd
    from dtrain_cli.cli.common import compose_and_plan

    _, plan = compose_and_plan(["recipe=gpt_tiny"], [])
    (tmp_path / "checkpoints").mkdir()
    assert launch_cmd.unwritable_checkpoints(tmp_path, plan) is None
    monkeypatch.setattr(launch_cmd.os, "access", lambda path, mode: False)  # a read-only mount
    assert launch_cmd.unwritable_checkpoints(tmp_path, plan) == (
        f"{tmp_path / 'checkpoints'}: cannot be written (read-only, or not this user's); the "
        "run's checkpoints go there: make it writable, or resume a copy of the run elsewhere"
    )
    _, none = compose_and_plan(
        ["recipe=gpt_tiny", "checkpoint.every_steps=0", "checkpoint.at_end=false"], []
    )
    assert launch_cmd.unwritable_checkpoints(tmp_path, none) is None  # nothing to save


def test_a_script_killed_by_the_preemption_signal_is_told_what_the_signal_is():
    """A script without a SIGUSR1 handler, under SLURM's --signal before the time limit:
    'rank 0 was killed by SIGUSR1' and nothing said what that was (a new user's find)."""
    failures = {0: agent_failure(100, -10, 1000)}
    _, text = describe(from_agent(failures, {}, [0]), steps_known=False)
    assert text == (
        "rank 0 was killed by SIGUSR1: the preemption signal (cluster.signal; SLURM sends it "
        "before the time limit), which a script handles by saving its checkpoint and exiting "
        "75 (docs/own-script.md#preemption)"
    )
