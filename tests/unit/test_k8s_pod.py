"""What a pod does before training: the run dir from the mounted ConfigMap
(``dtrain agent --init-from``), and SIGTERM taken as the preemption signal in a pod."""

from __future__ import annotations

from dtrain_cli.launch.k8s.pod import init_run_dir
from dtrain_cli.runtime.components.preemption import watched_signals


def configmap(tmp_path, plan: str = "plan: 1\n"):
    source = tmp_path / "etc-dtrain"
    source.mkdir(exist_ok=True)
    (source / "config.yaml").write_text("config: 1\n")
    (source / "plan.yaml").write_text(plan)
    return source


def test_the_first_pod_writes_the_files_and_a_restart_finds_them(tmp_path):
    source, run_dir = configmap(tmp_path), tmp_path / "runs" / "exp"
    assert init_run_dir(run_dir, source) == []
    assert (run_dir / "plan.yaml").read_text() == "plan: 1\n"
    assert (run_dir / "logs").is_dir()
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml", "logs", "plan.yaml"]
    assert init_run_dir(run_dir, source) == []  # the next pod, or a restart: the same files


def test_a_run_dir_of_another_run_is_refused(tmp_path):
    run_dir = tmp_path / "runs" / "exp"
    assert init_run_dir(run_dir, configmap(tmp_path)) == []
    (problem,) = init_run_dir(run_dir, configmap(tmp_path, plan="plan: 2\n"))
    assert problem.startswith(f"{run_dir / 'plan.yaml'} differs from ")
    assert "holds another run; choose another run.name" in problem
    assert (run_dir / "plan.yaml").read_text() == "plan: 1\n"  # left as it was


def test_a_missing_configmap_file_is_one_line(tmp_path):
    (problem,) = init_run_dir(tmp_path / "runs" / "exp", tmp_path / "nothing")
    assert problem.startswith(f"--init-from {tmp_path / 'nothing'}: cannot read config.yaml")
    assert not (tmp_path / "runs").exists()


def test_sigterm_is_a_preemption_in_a_pod_as_under_slurm(monkeypatch):
    for key in ("SLURM_JOB_ID", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(key, raising=False)
    assert watched_signals("USR1", True) == ["USR1"]  # a laptop: SIGTERM keeps its meaning
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")  # the kubelet sets it
    assert watched_signals("USR1", True) == ["USR1", "TERM"]
    assert watched_signals("USR1", False) == ["USR1"]  # cluster.checkpoint_on_sigterm=false


def test_a_preempted_pod_names_who_continues_the_run(monkeypatch, tmp_path):
    """A pod said 'the run continues from it (requeued SLURM job, or dtrain resume ...)'."""
    import pytest

    from dtrain_cli.launch.local import preempted_result

    marker = {"step": 6}
    said = {}
    for where, var in (("pod", "KUBERNETES_SERVICE_HOST"), ("slurm", "SLURM_JOB_ID"), ("", "")):
        with pytest.MonkeyPatch.context() as env:
            env.delenv("KUBERNETES_SERVICE_HOST", raising=False)
            env.delenv("SLURM_JOB_ID", raising=False)
            if var:
                env.setenv(var, "x")
            said[where] = preempted_result(marker, tmp_path).message
    head = f"preempted: checkpoint saved at step 6; `dtrain resume --ckpt {tmp_path}` continues"
    assert said[""] == f"{head} from it"
    assert said["pod"] == f"{head} from it (the JobSet's restarted pods do so by themselves)"
    assert said["slurm"] == f"{head} from it (a requeued SLURM job does so by itself)"


def test_a_preempted_multi_node_run_is_continued_by_its_launch_command(monkeypatch, tmp_path):
    """It told two local "nodes" to run `dtrain resume`, which refuses a multi-node run."""
    from dtrain_cli.launch.local import preempted_result

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    said = preempted_result({"step": 15}, tmp_path, nnodes=2).message
    assert said == (
        "preempted: checkpoint saved at step 15; the same launch command on every node "
        "continues from it"
    )
