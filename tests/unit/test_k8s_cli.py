"""``dtrain k8s`` from the command line: the commands of docs/kubernetes.md, and every bad
input of issue 27 as one line, exit 2, no traceback, nothing written."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from dtrain_cli.cli.app import app
from dtrain_cli.rundir.layout import PLAN_FILE

runner = CliRunner()
IMAGE = "cluster.image=registry.example/team/train:1.0"
GOOD = ["k8s", "recipe=gpt_tiny", IMAGE, "run.name=ok-1"]


def test_dry_run_prints_the_configmap_and_the_jobset():
    result = runner.invoke(
        app,
        [
            "k8s",
            "recipe=gpt_small",
            "parallel.nnodes=4",
            "cluster.gpus_per_node=8",
            "cluster.pvc=train-runs",
            IMAGE,
            "--dry-run",
        ],
    )
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(result.stdout))
    assert [d["kind"] for d in docs] == ["ConfigMap", "JobSet"]
    name = docs[1]["metadata"]["name"]
    assert name.startswith("gpt-small-")  # recipe-timestamp, made a DNS label
    one = runner.invoke(app, [*GOOD, "--dry-run"])  # one node: an emptyDir works, but is lost
    assert one.exit_code == 0 and "warning: cluster.pvc is not set" in one.stderr


def test_out_writes_the_file_kubectl_applies(tmp_path):
    out = tmp_path / "job.yaml"
    result = runner.invoke(app, [*GOOD, "cluster.queue=team-a", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert f"wrote {out}: kubectl apply -f {out}" in result.stderr
    (_, jobset) = yaml.safe_load_all(out.read_text())
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"


def test_help_names_the_guide():
    result = runner.invoke(app, ["k8s", "--help"])
    assert result.exit_code == 0 and "docs/kubernetes.md" in result.stdout
    for command in ("status", "logs", "cancel"):
        assert command in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["recipe=gpt_tiny"], "cluster.image is not set: the container image with dtrain"),
        # a second mount at /etc/dtrain: the API server refuses the pod
        (
            [IMAGE, "cluster.run_root=/etc/dtrain"],
            "cluster.run_root='/etc/dtrain': a folder dtrain",
        ),
        # the claim over /usr/local hides the image's Python: the pod cannot start
        ([IMAGE, "cluster.run_root=/usr/local"], "or one the image's Python lives in"),
        # an image path is lower case: UPPER is no registry host
        (["cluster.image=UPPER/train:1"], "cluster.image='UPPER/train:1': not an image reference"),
        # a site's fields may not replace the run's own
        (
            [IMAGE, "cluster.pod_spec={volumes: []}"],
            "cluster.pod_spec: volumes is set by dtrain (volumes: the run dir, the ConfigMap",
        ),
        (  # the grace period has its own key
            [IMAGE, "cluster.pod_spec={terminationGracePeriodSeconds: 60}"],
            "terminationGracePeriodSeconds: cluster.grace_period_s",
        ),
        (
            [IMAGE, "cluster.container_spec={command: [sh]}"],
            "cluster.container_spec: command is set by dtrain",
        ),
        (
            [IMAGE, "cluster.k8s_kind=trainjob", "cluster.pod_spec={priorityClassName: high}"],
            "cluster.pod_spec: priorityClassName cannot be set on a TrainJob's pods",
        ),
        # the pods trained on the built-in corpus (dtrain plan refused it; k8s said nothing)
        (
            [IMAGE, "data.path=local.txt"],
            "data.path=local.txt: only read by data=text, data=tokens or data=hf",
        ),
        # trained to the end, then the first save found the other pod's shards missing
        (
            [IMAGE, "parallel.nnodes=2", "dp=2"],
            "parallel.nnodes=2 without cluster.pvc: each pod's run dir would be its own emptyDir",
        ),
        (
            [IMAGE, "cluster.gpus_per_node=8", "dp=4"],
            "cluster.gpus_per_node=8 but the plan runs 4 process(es) per node",
        ),
        (
            [IMAGE, "cluster.gpus_per_node=8", "nproc_per_node=4"],
            "set cluster.gpus_per_node=4 or leave dp and nproc_per_node unset",
        ),
        ([IMAGE, "run.name=My_Run"], "run.name='My_Run': not a DNS label for the JobSet"),
        (
            [IMAGE, "parallel.nnodes=4", "dp=4", f"run.name={'a' * 60}"],
            "60 characters; the pods' names",
        ),
        ([IMAGE, "cluster.queue=team-a;rm -rf /"], "cannot parse the value"),  # Hydra's
        ([IMAGE, "cluster.queue='team-a;rm -rf /'"], "cluster.queue='team-a;rm -rf /': not a"),
        ([IMAGE, "cluster.queue='team: a'"], "cluster.queue='team: a': not a DNS"),
        (
            ["cluster.image='train:1.0 && curl x | sh'"],
            "cluster.image='train:1.0 && curl x | sh': not an image reference",
        ),
        (["cluster.image='{a: b}'"], "not an image reference"),
        (["cluster.image='a\nb'"], "not an image reference"),
        ([IMAGE, "dp=${oc.env:HOME}"], "parallel.dp=${oc.env:HOME}: the interpolation fails"),
        ([IMAGE, "cluster.k8s_kind=pytorchjob"], "cluster.k8s_kind=pytorchjob: not allowed"),
        ([IMAGE, "cluster.shm_size=lots"], "cluster.shm_size='lots': not a Kubernetes quantity"),
        ([IMAGE, "cluster.namespace=Team_A"], "cluster.namespace='Team_A': not a DNS label"),
        ([IMAGE, "cluster.pvc=runs/../x"], "cluster.pvc='runs/../x': not a DNS-1123 name"),
        ([IMAGE, "cluster.run_root=runs"], "cluster.run_root='runs': not an absolute folder"),
        (
            [IMAGE, "parallel.nnodes=1:2", "dp=2", "cluster.k8s_kind=trainjob"],
            "Kubeflow Trainer has no elastic TrainJob",
        ),
        ([IMAGE, "cluster.env={A-B: '1'}"], "cluster.env: 'A-B' is not a variable name"),
        # the later entry wins in a pod: every pod's node rank 5
        ([IMAGE, "+cluster.env.NODE_RANK=5"], "cluster.env.NODE_RANK: set by dtrain in every pod"),
        ([IMAGE, "+cluster.env.PET_NNODES=5"], "cluster.env.PET_NNODES: set by dtrain in every"),
        ([IMAGE, "cluster.rdzv_port=70000"], "cluster.rdzv_port=70000: must be in [0, 65535]"),
        ([IMAGE, "cluster.gpus_per_node=-8"], "cluster.gpus_per_node=-8: must be in"),
        ([IMAGE, "cluster.mem=lots"], "cluster.mem='lots': use a size such as 480G"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(args, message, tmp_path):
    out = tmp_path / "job.yaml"
    result = runner.invoke(app, ["k8s", "recipe=gpt_tiny", *args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [x for x in result.output.splitlines() if x.startswith("error:")]
    assert any(message in x for x in lines), lines
    assert all(len(x) < 400 for x in lines)
    assert not out.exists()


def test_every_problem_is_reported_together():
    result = runner.invoke(app, ["k8s", "run.name=Bad_Name", "cluster.gpus_per_node=8", "dp=4"])
    assert result.exit_code == 2
    errors = [x for x in result.output.splitlines() if x.startswith("error:")]
    assert len(errors) == 2  # the name and the image; the GPU check needs a plan first
    assert "not a DNS label" in errors[0] and "cluster.image is not set" in errors[1]


def test_dry_run_with_submit_is_refused():
    result = runner.invoke(app, [*GOOD, "--dry-run", "--submit"])
    assert result.exit_code == 2 and "choose" in result.output


def guide_commands() -> list[list[str]]:
    """The ``dtrain`` lines of docs/kubernetes.md's bash blocks (the cluster's own commands
    are in ``text`` blocks)."""
    import re
    import shlex

    from tests.conftest import REPO

    text = (REPO / "docs" / "kubernetes.md").read_text()
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("dtrain "):
                out.append(shlex.split(line.split("  #")[0])[1:])
    return out


def test_the_guide_has_its_commands():
    assert len(guide_commands()) >= 4


@pytest.mark.parametrize("argv", guide_commands(), ids=" ".join)
def test_every_command_of_the_guide_runs(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert "error:" not in result.output
    if "--out" in argv:
        assert (tmp_path / argv[argv.index("--out") + 1]).is_file()


def test_the_example_site_file_gives_a_valid_manifest():
    from tests.k8s_schema import problems

    args = ["k8s", "recipe=gpt_small", "cluster=example_k8s", "parallel.nnodes=2", "run.name=x"]
    result = runner.invoke(app, [*args, "--dry-run"])
    assert result.exit_code == 0, result.output
    configmap, jobset = yaml.safe_load_all(result.stdout)
    assert problems(configmap) == problems(jobset) == []
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    ctr = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert ctr["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 8, "memory": "480Gi"}


def test_sbatchs_node_shorthands_ask_the_pods_for_the_same():
    """``nodes= gpus_per_node= cpus_per_task= mem=`` are ``dtrain sbatch``'s words for what a
    node is asked; ``dtrain k8s`` refused them as unknown keys. The same manifest now."""
    run = [IMAGE, "cluster.pvc=runs", "run.name=same-1", "--dry-run"]
    short = ["nodes=2", "gpus_per_node=8", "cpus_per_task=16", "mem=200G"]
    full = [
        "parallel.nnodes=2",
        "cluster.gpus_per_node=8",
        "cluster.cpus_per_task=16",
        "cluster.mem=200G",
    ]
    by_short = runner.invoke(app, ["k8s", "recipe=gpt_small", *short, *run])
    by_key = runner.invoke(app, ["k8s", "recipe=gpt_small", *full, *run])
    assert by_short.exit_code == 0, by_short.output
    assert by_short.stdout == by_key.stdout
    (_, jobset) = yaml.safe_load_all(by_short.stdout)
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert pod["containers"][0]["resources"]["requests"]["memory"] == "200Gi"


@pytest.mark.parametrize("slurm", ["partition=gpu", "time=04:00:00", "account=a", "qos=high"])
def test_slurms_own_settings_are_named_as_slurms(slurm):
    result = runner.invoke(app, [*GOOD, slurm, "--dry-run"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {slurm}: SLURM's #SBATCH setting")
    assert "Traceback" not in result.output


def test_a_slurm_setting_is_said_with_the_other_problems():
    result = runner.invoke(app, ["k8s", "recipe=gpt_tiny", "time=4h", "train.stepz=3"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["error", "error"], lines
    assert lines[0].startswith("error: time=4h: SLURM's") and "'train.stepz'" in lines[1]


def test_processes_per_node_given_fill_the_nodes():
    """``nproc_per_node=4`` without dp: four ranks a node and dp filling the nodes, as
    ``dtrain sbatch`` reads it (the plan was left at dp=1 and refused)."""
    args = ["nodes=2", "gpus_per_node=4", "nproc_per_node=4", "train.global_batch_size=64"]
    args.append("cluster.pvc=train-runs")
    result = runner.invoke(app, ["k8s", "recipe=gpt_small", *args, *GOOD[2:], "--dry-run"])
    assert result.exit_code == 0, result.output
    configmap, _ = yaml.safe_load_all(result.stdout)
    plan = yaml.safe_load(configmap["data"][PLAN_FILE])
    assert (plan["nnodes"], plan["nproc_per_node"], plan["world_size"]) == (2, 4, 8)


def test_a_site_s_init_containers_and_ordinary_variables_pass_quietly():
    """initContainers (a claim's permissions fixed) are not dtrain's; TOKENIZERS_PARALLELISM
    is no secret; a 16 GiB /dev/shm in bytes is under 480G (a review's finds)."""
    args = [*GOOD, "cluster.pvc=runs", "cluster.mem=480G", "cluster.shm_size=17179869184"]
    args += ["cluster.pod_spec={initContainers: [{name: fix, image: busybox}]}"]
    args += ["+cluster.env.TOKENIZERS_PARALLELISM=false"]
    result = runner.invoke(app, [*args, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr, result.stderr


def test_what_a_platform_engineer_would_miss_is_said():
    """A /dev/shm over the pod's memory (the pod is OOM-killed first), restarts with no
    checkpoint to resume from before the end (a crash restarts from step 0)."""
    args = [*GOOD, "cluster.mem=100M", "cluster.shm_size=64Gi", "launcher.max_restarts=3"]
    result = runner.invoke(app, [*args, "--dry-run"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.stderr.split())
    assert "cluster.shm_size=64Gi is more than the pod's memory (cluster.mem=100M)" in said
    assert "launcher.max_restarts=3: a restart resumes from the newest checkpoint" in said
    saved = runner.invoke(app, [*args, "checkpoint.every_steps=50", "--dry-run"])
    assert "launcher.max_restarts" not in saved.stderr
