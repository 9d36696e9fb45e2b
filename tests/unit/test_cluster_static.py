"""validate-cluster's static checks on made-up environments, multi-node flags, signals.
Pure and fast: no processes, no torch. The launch's flag errors (a launch starts its fork
server first): tests/launch/test_cluster_static.py."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dtrain_cli.cli.app import app
from dtrain_cli.config.compose import compose_config
from dtrain_cli.launch.cluster_env import Facts, Request, static_checks
from dtrain_cli.launch.host_facts import expand_nodelist
from dtrain_cli.launch.multinode import NodeArgs, apply_node_args, parse_endpoint, parse_nnodes
from dtrain_cli.runtime.components.preemption import (
    PreemptionWatcher,
    signal_number,
    watched_signals,
)

runner = CliRunner()
HOSTS = {"node1": ["10.0.0.1"], "node2": ["10.0.0.2"], "localhost": ["127.0.0.1"]}


def facts(env: dict[str, str] | None = None, **kw) -> Facts:
    base = dict(
        env=env or {},
        torch_version="2.13.0+cpu",
        num_cpus=8,
        which=lambda name: f"/usr/bin/{name}",
        resolve=lambda host: HOSTS.get(host, ["127.0.0.1"] if host.startswith("127.") else []),
        local_addresses={"10.0.0.1", "127.0.0.1"},
        port_free=lambda port: True,
        writable=lambda path: None,
    )
    base.update(kw)
    return Facts(**base)


def by_status(checks, status: str) -> dict[str, str]:
    return {c.name: c.detail for c in checks if c.status == status}


def test_healthy_single_node_passes():
    checks = static_checks(Request(nproc_per_node=2), facts())
    assert by_status(checks, "fail") == {} and by_status(checks, "warn") == {}
    names = {c.name for c in checks}
    assert {"torch / CUDA / NCCL", "devices", "rendezvous host", "run directory"} <= names


def test_master_addr_unresolvable_fails_with_fix():
    checks = static_checks(Request(), facts({"MASTER_ADDR": "no-such-host.invalid"}))
    fails = {c.name: c for c in checks if c.status == "fail"}
    assert "does not resolve" in fails["MASTER_ADDR"].detail
    assert "no-such-host.invalid" in fails["MASTER_ADDR"].detail and fails["MASTER_ADDR"].fix


def test_world_size_inconsistent_with_slurm_ntasks():
    env = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_NNODES": "2", "WORLD_SIZE": "3"}
    req = Request(nnodes=2, nproc_per_node=2, rdzv_endpoint="node1:29500")
    fails = by_status(static_checks(req, facts(env)), "fail")
    assert "WORLD_SIZE=3 but SLURM_NTASKS=2" in fails["SLURM_NTASKS"]
    assert "WORLD_SIZE=3 but 2 node(s) x 2 process(es) = 4" in fails["WORLD_SIZE"]
    # consistent: one launcher task per node x 2 processes
    env["WORLD_SIZE"] = "4"
    assert by_status(static_checks(req, facts(env)), "fail") == {}


def test_slurm_nodelist_and_nnodes():
    env = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[1-2]"}
    req = Request(nnodes=2, rdzv_endpoint="node1:29500")
    passed = by_status(static_checks(req, facts(env)), "pass")
    assert passed["SLURM_JOB_NODELIST"] == "node[1-2] -> node1, node2"
    fails = by_status(static_checks(Request(nnodes=3, rdzv_endpoint="node1:1"), facts(env)), "fail")
    assert "SLURM_NNODES=2 but --nnodes 3" in fails["SLURM_NNODES"]
    env["SLURM_JOB_NODELIST"] = "node[1-2],ghost7"
    env["SLURM_NNODES"] = "3"
    fails = by_status(static_checks(Request(nnodes=3, rdzv_endpoint="node1:1"), facts(env)), "fail")
    assert "not resolvable: ghost7" in fails["SLURM_JOB_NODELIST"]


def test_scontrol_missing_in_a_slurm_job_fails():
    f = facts({"SLURM_JOB_ID": "7"}, which=lambda name: None)
    fails = by_status(static_checks(Request(), f), "fail")
    assert "scontrol" in fails


def test_loopback_rendezvous_with_two_nodes_fails_unless_single_host():
    req = Request(nnodes=2, rdzv_endpoint="127.0.0.1:29500")
    fails = by_status(static_checks(req, facts()), "fail")
    assert "loopback" in fails["rendezvous host"] and "hang" in fails["rendezvous host"]
    # the way out where it is meant (two "nodes" on one machine, as clusters.md shows)
    (host,) = [c for c in static_checks(req, facts()) if c.name == "rendezvous host"]
    assert host.fix.endswith('if every node runs on this machine (two "nodes" in two shells), '
                             "add --single-host")  # fmt: skip
    req.single_host = True
    assert "rendezvous host" in by_status(static_checks(req, facts()), "warn")
    # a SLURM test cluster whose fake nodes all map to this machine: fine
    env = {"SLURM_JOB_ID": "1", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2]"}
    f = facts(env, resolve=lambda host: ["127.0.0.1"])
    assert by_status(static_checks(Request(nnodes=2, rdzv_endpoint="n1:29500"), f), "fail") == {}


def test_port_taken_and_unresolvable_rendezvous_host():
    req = Request(rdzv_endpoint="node1:29500", node_rank=0)
    fails = by_status(static_checks(req, facts(port_free=lambda port: False)), "fail")
    assert "port 29500 is already in use" in fails["rendezvous port"]
    assert "node 0 too" not in fails["rendezvous port"]  # one node: nothing else to suspect
    req.nnodes = 2
    fails = by_status(static_checks(req, facts(port_free=lambda port: False)), "fail")
    assert "(another node of this run started here as node 0 too?)" in fails["rendezvous port"]
    # another node does not bind node 0's port
    req.node_rank = 1
    assert by_status(static_checks(req, facts(port_free=lambda port: False)), "fail") == {}
    fails = by_status(static_checks(Request(rdzv_endpoint="nowhere:1"), facts()), "fail")
    assert "nowhere does not resolve" in fails["rendezvous host"]
    fails = by_status(static_checks(Request(rdzv_endpoint="node1"), facts()), "fail")
    assert "not host:port" in fails["rendezvous endpoint"]


def test_devices_and_run_dir():
    fails = by_status(static_checks(Request(nproc_per_node=8, backend="nccl"), facts()), "fail")
    assert "8 processes per node but 0 GPUs visible" in fails["devices"]
    assert "backend nccl needs CUDA GPUs" in fails["torch / CUDA / NCCL"]
    warns = by_status(static_checks(Request(nproc_per_node=16), facts()), "warn")
    assert "oversubscribed" in warns["devices"]
    f = facts(writable=lambda path: "Permission denied")
    fails = by_status(static_checks(Request(run_dir=Path("/ro")), f), "fail")
    assert fails["run directory"] == "/ro: not writable (Permission denied)"


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("gpu[01-02,05],cpu7", ["gpu01", "gpu02", "gpu05", "cpu7"]),
        ("a[9-10]-ib", ["a9-ib", "a10-ib"]),
    ],
)
def test_expand_nodelist(text, hosts):
    assert expand_nodelist(text) == hosts


def test_nnodes_and_endpoint_parsing():
    assert parse_nnodes("2") == ((2, 2), []) and parse_nnodes("3:3") == ((3, 3), [])
    assert parse_nnodes("1:4") == ((1, 4), [])  # elastic: the plan checks the range
    assert "not a node count" in parse_nnodes("two")[1][0]
    assert parse_endpoint("host0:29500") == ("host0", 29500)
    assert parse_endpoint("[::1]:5") == ("::1", 5)
    assert parse_endpoint("host0") is None and parse_endpoint("h:99999") is None


def test_multinode_flags_need_a_shared_name_and_a_fixed_endpoint():
    cfg = compose_config("gpt_tiny", ["parallel.nnodes=2", "dp=2"])
    problems = apply_node_args(cfg, NodeArgs(2, 0, None, None))
    # no endpoint given: the node count is named, not a '--rdzv-endpoint=localhost:0'
    assert any(p.startswith("nnodes=2: 2 nodes need a fixed host:port") for p in problems)
    assert any("pass the same --rdzv-id" in p for p in problems)
    cfg = compose_config("gpt_tiny", ["parallel.nnodes=2", "dp=2"])
    assert apply_node_args(cfg, NodeArgs(2, 1, "10.0.0.1:29500", "exp1")) == []
    assert cfg.run.name == "exp1" and cfg.launcher.rdzv_endpoint == "10.0.0.1:29500"
    assert "--node-rank=2: must be in [0, 2)" in apply_node_args(cfg, NodeArgs(2, 2))[0]


def test_signal_names_and_watcher_sets_only_a_flag():
    assert signal_number("USR1") == signal.SIGUSR1 == signal_number("SIGUSR1")
    with pytest.raises(ValueError, match="use one of USR1"):
        signal_number("BOGUS")
    w = PreemptionWatcher()
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        w.install(["USR2"])
        assert w.installed and not w.requested()
        signal.raise_signal(signal.SIGUSR2)
        assert w.requested() and w.signum == signal.SIGUSR2
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_sigterm_is_watched_only_inside_slurm(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert watched_signals("USR1", True) == ["USR1"]
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    assert watched_signals("USR1", True) == ["USR1", "TERM"]
    assert watched_signals("USR1", False) == ["USR1"]


def test_validate_cluster_leaves_no_folder_behind(tmp_path, monkeypatch):
    """Colleague's g: the run-dir check makes runs/ (and parents) to probe it, then
    removes what it made; a folder that was there stays."""
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for args in ([], ["--run-dir", "a/b/runs"]):
        result = runner.invoke(
            app, ["validate-cluster", "--no-live", *args], env={"COLUMNS": "200"}
        )
        assert result.exit_code == 0, result.output
        assert "runs writable" in result.output
        assert list(tmp_path.iterdir()) == []
    (tmp_path / "runs").mkdir()
    assert runner.invoke(app, ["validate-cluster", "--no-live"]).exit_code == 0
    assert (tmp_path / "runs").is_dir()


def test_one_node_with_an_rdzv_id_names_its_run_dir_after_it(tmp_path):
    """Colleague's h: as on several nodes, --rdzv-id names the run (config.yaml's rdzv_id
    and the folder agree); a run.name given wins."""
    from dtrain_cli.launch.rundir import new_run_dir

    cfg = compose_config("gpt_tiny", [f"run.root={tmp_path}"])
    assert apply_node_args(cfg, NodeArgs(rdzv_id="exp1")) == []
    assert cfg.launcher.rdzv_id == "exp1" and new_run_dir(cfg) == tmp_path / "exp1"
    named = compose_config("gpt_tiny", ["run.name=mine"])
    assert apply_node_args(named, NodeArgs(rdzv_id="exp1")) == []
    assert named.run.name == "mine" and named.launcher.rdzv_id == "exp1"
    plain = compose_config("gpt_tiny")
    assert apply_node_args(plain, NodeArgs()) == [] and plain.run.name is None


def test_a_node_whose_config_differs_is_told_which_key(tmp_path):
    """Two nodes of one run given different script arguments: the second said only that
    the configs differ; it names the first key that does, with both values."""
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.launch.multinode import join_run_dir
    from dtrain_cli.plan.build import build_plan

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")

    def node(out: str):
        cfg = compose_config("script", [f"run.root={tmp_path}", "run.name=two"])
        cfg.script.path, cfg.script.args = str(script), ["--out", out]
        cfg.launcher.rdzv_id = "two"
        return cfg, build_plan(cfg)

    first = join_run_dir(*node("o0.json"))
    assert join_run_dir(*node("o0.json"), wait_s=1) == first  # the same: joins
    with pytest.raises(ValueError) as err:
        join_run_dir(*node("o1.json"), wait_s=1)
    said = str(err.value)
    assert "(script.args: ['--out', 'o0.json'] there, ['--out', 'o1.json'] here)" in said
    assert said.endswith("every node must run the same recipe, overrides and script arguments")


def test_a_node_joining_its_run_again_after_it_ended_or_elsewhere(tmp_path):
    """A finished multi-node run run again 'resumed' at its last step, trained nothing and
    emptied its summary.json (exit 0); node 0 restarted on another port was refused as a
    different config; --nnodes 4 against a run of 2 was told to choose another run name (a
    new user's finds)."""
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.launch.multinode import join_run_dir
    from dtrain_cli.plan.build import Resources, build_plan

    def node(port: int, nnodes: int = 2):
        cfg = compose_config("gpt_tiny", [f"run.root={tmp_path}", "run.name=two", "dp=2",
                                          f"parallel.nnodes={nnodes}"])  # fmt: skip
        cfg.launcher.rdzv_id, cfg.launcher.rdzv_endpoint = "two", f"127.0.0.1:{port}"
        return cfg, build_plan(cfg, Resources(num_gpus=0, num_cpus=2))

    first = join_run_dir(*node(29500))
    assert join_run_dir(*node(29611), wait_s=1) == first  # restarted on another port
    with pytest.raises(ValueError) as err:
        join_run_dir(*node(29500, nnodes=1), wait_s=1)
    assert str(err.value).startswith("--nnodes 1: this run was started with --nnodes 2")
    (first / "summary.json").write_text("{}")
    with pytest.raises(FileExistsError) as done:
        join_run_dir(*node(29500), wait_s=1)
    assert str(done.value) == (
        f"{first} already holds a run, which finished; choose another --rdzv-id (or run.name)"
    )


def test_a_node_waits_for_node_0s_store_and_says_why_it_gave_up():
    """Before torch's store client (which prints C++ stack frames at each retry), a node
    other than 0 waits for something to listen at the endpoint itself."""
    import socket

    from dtrain_cli.launch.multinode import wait_for_store

    said: list[str] = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert wait_for_store(f"127.0.0.1:{port}", 5, said.append) is None
    why = wait_for_store(f"127.0.0.1:{port}", 0.3, said.append, poll_s=0.1)
    assert why == "nothing answered there within 0.3 s (Connection refused)"
    assert said == []  # 'waiting for node 0's ...' only after 5 s


@pytest.mark.parametrize(
    ("scheduler", "waits"), [({}, 120), ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, 900)]
)
def test_a_node_waits_for_node_0_as_long_as_its_scheduler_may_take(scheduler, waits, monkeypatch):
    """Started by hand, a node other than 0 waits 120 s for node 0's store; in a pod (or a
    SLURM job) node 0 may come minutes later (its image pulled, pending on a busy cluster):
    it waits the whole launcher.rdzv_timeout_s (900), as the docs say (a platform
    engineer's find: the worker pods gave up after 120 s and failed the JobSet)."""
    from dtrain_cli.config.compose import compose_config
    from dtrain_cli.launch import local, multinode

    for key in ("SLURM_JOB_ID", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(key, raising=False)
    for key, value in scheduler.items():
        monkeypatch.setenv(key, value)
    asked: list[float] = []
    monkeypatch.setattr(multinode, "wait_for_store", lambda _e, t, _s: asked.append(t) or "no")
    cfg = compose_config("gpt_tiny", ["launcher.rdzv_endpoint=node0:29500"], validate=False)
    assert "could not reach the rendezvous store at node0:29500" in local._store_unreached(cfg)
    assert asked == [waits]


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ("1X", "--sizes: '1X' is not a size"),
        ("0", "--sizes: '0' is below one float (4 B)"),  # measured a 4 B row, exit 0
        ("1K,-5", "--sizes: '-5' is below one float (4 B)"),
    ],
)
def test_validate_cluster_refuses_sizes_it_cannot_measure(sizes, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["validate-cluster", "--sizes", sizes])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), result.output
    assert list(tmp_path.iterdir()) == []


def test_plan_of_several_nodes_says_what_each_launch_still_needs(tmp_path, monkeypatch):
    """``dtrain plan nnodes=2`` printed the plan without a word, and the same overrides
    under ``dtrain run`` or ``launch`` were refused: the plan names both as warnings."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["plan", "recipe=gpt_tiny", "dp=2", "nnodes=2"])
    assert result.exit_code == 0, result.output
    warned = [line for line in result.stderr.splitlines() if line.startswith("warning: nnodes")]
    assert warned == [
        "warning: nnodes=2: 2 nodes need a fixed host:port they all reach: node 0's address, "
        "the same on every node (e.g. --rdzv-endpoint node0:29500); dtrain sbatch and dtrain "
        "k8s set it for you",
        "warning: nnodes=2: every node must name the same run; pass the same --rdzv-id ID (or "
        "run.name=NAME) on every node; dtrain sbatch and dtrain k8s set it for you",
    ]
    named = CliRunner().invoke(app, ["plan", "recipe=gpt_tiny", "dp=2", "nnodes=2", "run.name=x"])
    assert "every node must name" not in named.stderr
    one = CliRunner().invoke(app, ["plan", "recipe=gpt_tiny", "dp=2"])
    assert "warning: nnodes" not in one.stderr


def test_a_port_in_time_wait_is_free_and_a_listening_one_is_not():
    """After a node restarts, its port's last connections wait in TIME_WAIT; c10d's store
    binds it (SO_REUSEADDR), but the check said 'already in use' for about a minute."""
    import socket
    import time

    from dtrain_cli.launch.host_facts import port_is_free

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # this side closes first: its end waits in TIME_WAIT
    time.sleep(0.05)
    client.close()
    server.close()
    assert port_is_free(port)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("", port))
    listener.listen()
    try:
        assert not port_is_free(port)
    finally:
        listener.close()
