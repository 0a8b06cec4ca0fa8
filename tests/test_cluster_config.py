"""cluster.yaml against Ray's own cluster-config schema and against what a real run needs;
the autoscaler's maximum and what the sweep sizes from it; vLLM engines pinned to the vLLM
nodes."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest
import ray
import yaml

from csclip import cluster
from csclip.ablation import sweep as sweeps
from csclip.config.extract import VllmConfig
from csclip.extract.vllm import processor_config

REPO_ROOT = Path(__file__).resolve().parents[1]
CLUSTER_YAML = REPO_ROOT / "cluster.yaml"


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(CLUSTER_YAML.read_text())


@pytest.fixture(scope="module")
def prepared(raw) -> dict:
    """The config as `ray up` sees it before talking to AWS: defaults merged, setup
    commands merged, node type bounds filled."""
    from ray.autoscaler._private.util import prepare_config

    return prepare_config(yaml.safe_load(CLUSTER_YAML.read_text()))


def test_cluster_yaml_passes_rays_cluster_schema(prepared):
    from ray.autoscaler._private.util import validate_config

    validate_config(prepared)  # Ray's ray-schema.json plus its cross-field checks


def test_every_node_type_has_an_instance_profile_and_the_pinned_ami(raw):
    node_types = raw["available_node_types"]
    assert set(node_types) == {"head", "cpu_worker", "gpu_train", "vllm_worker"}
    profiles = {str(t["node_config"].get("IamInstanceProfile")) for t in node_types.values()}
    amis = {t["node_config"].get("ImageId") for t in node_types.values()}
    # Every node has a profile (workers read and write S3 too) and one AMI for all: the
    # provider's default AMI (an old driver) is never used.
    assert "None" not in profiles
    assert len(amis) == 1 and None not in amis
    text = CLUSTER_YAML.read_text()
    assert "/aws/service/deeplearning/ami/x86_64/" in text  # how to pin it per region


def test_training_and_vllm_nodes_are_separate_gpu_types_with_their_own_resource(raw):
    node_types = raw["available_node_types"]
    train, vllm = node_types["gpu_train"], node_types["vllm_worker"]
    assert train["node_config"]["InstanceType"].startswith(("g6e.", "p4d.", "p5."))
    assert set(train["resources"]) == {"csclip_train"}
    assert set(vllm["resources"]) == {"csclip_vllm"}
    # The configs that run there ask for exactly these resources.
    coco = yaml.safe_load((REPO_ROOT / "configs" / "coco.yaml").read_text())
    assert set(coco["run"]["worker_resources"]) == set(train["resources"])
    assert coco["run"]["num_workers"] <= train["resources"]["csclip_train"]
    extract = yaml.safe_load((REPO_ROOT / "configs" / "extract_coco.yaml").read_text())
    assert extract["backend"]["vllm"]["node_resource"] in vllm["resources"]
    assert extract["backend"]["vllm"]["num_engines"] <= \
        vllm["resources"]["csclip_vllm"] * vllm["max_workers"]


def test_vllm_nodes_run_rays_llm_image_of_the_same_ray_and_python(raw):
    base = raw["docker"]["image"]
    llm = raw["available_node_types"]["vllm_worker"]["docker"]["worker_image"]
    assert llm == f"rayproject/ray-llm:{ray.__version__}-py312-cu130"
    # All nodes of one Ray cluster run the same Ray and Python minor version.
    assert base.startswith(f"rayproject/ray:{ray.__version__}-py312-")
    text = CLUSTER_YAML.read_text()
    assert "vLLM 0.29.0" in text and "torch 2.13" in text and "CUDA 13" in text


def test_setup_installs_the_pinned_dependencies_of_pyproject(raw):
    # A directory is mounted (never a single file, which goes stale in a running
    # container); it holds what setup reads, made from pyproject.toml.
    assert raw["file_mounts"] == {"/home/ray/csclip": "./cluster"}
    assert (REPO_ROOT / "cluster" / "requirements.txt").read_text() == \
        cluster.node_requirements_text()
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert cluster.node_requirements() == [*project["dependencies"],
                                           *project["optional-dependencies"]["cluster"]]
    vllm_setup = raw["available_node_types"]["vllm_worker"]["worker_setup_commands"]
    for commands in (raw["setup_commands"], vllm_setup):
        assert any(c.startswith("pip install -q -r /home/ray/csclip/requirements.txt")
                   for c in commands)
    # On the vLLM image, pip must not replace the torch / vLLM / Ray builds it ships; the
    # pins are written under the user's home, not into the mount.
    assert any("-c ~/csclip-setup/image-pins.txt" in c for c in vllm_setup)
    assert not any("> /home/ray/csclip/" in c for c in [*raw["setup_commands"], *vllm_setup])
    # The old comment claimed the image ships torch; it does not (torch comes from here).
    assert "has Ray 2.60 and torch" not in CLUSTER_YAML.read_text()
    assert any(r.startswith("torch") for r in cluster.node_requirements())


def test_head_runs_an_mlflow_server_that_every_ray_process_is_pointed_at(raw):
    head = " ".join(raw["head_start_ray_commands"])
    assert "mlflow server" in head
    assert "--backend-store-uri sqlite:////home/ray/mlflow/mlflow.db" in head
    assert "--artifacts-destination s3://" in head
    # The database directory is the host's disk, mounted into the head's container.
    assert "-v /home/ubuntu/csclip-mlflow:/home/ray/mlflow" in raw["docker"]["head_run_options"]
    for commands in (raw["head_start_ray_commands"], raw["worker_start_ray_commands"]):
        start = [c for c in commands if "ray start" in c]
        assert start and all(c.startswith("export ") and "MLFLOW_TRACKING_URI=http://" in c
                             for c in start)
    assert "$RAY_HEAD_IP:5000" in " ".join(raw["worker_start_ray_commands"])


def test_autoscaler_maximum_of_cluster_yaml(prepared):
    total = cluster.autoscaler_max_resources(prepared)
    assert total["csclip_train"] == 8 and total["csclip_vllm"] == 8
    assert total.get("CPU", 0) == 0  # the head's CPU 0; workers' CPUs are filled by `ray up`


def _write_autoscaling_config(path, gpus_per_node: int = 8, max_nodes: int = 2):
    path.write_text(yaml.safe_dump({
        "head_node_type": "head",
        "available_node_types": {
            "head": {"resources": {"CPU": 0}, "max_workers": 0},
            "gpu": {"resources": {"CPU": 96, "GPU": gpus_per_node}, "max_workers": max_nodes},
        }}))


def test_sweep_concurrency_comes_from_the_autoscaler_not_the_empty_cluster(ray_session, tmp_path,
                                                                           monkeypatch):
    # An autoscaling cluster starts with no GPU node: sized from ray.cluster_resources(),
    # a GPU sweep would run one trial at a time on a cluster that can hold eight.
    assert ray.cluster_resources().get("GPU", 0) == 0
    config = tmp_path / "ray_bootstrap_config.yaml"
    _write_autoscaling_config(config)
    monkeypatch.setenv(cluster.AUTOSCALING_CONFIG_ENV, str(config))
    assert cluster.max_resources() == {"CPU": 192.0, "GPU": 16.0}
    assert sweeps.max_concurrent_trials(cluster.max_resources(), num_workers=2, use_gpu=True) == 8
    monkeypatch.setenv(cluster.AUTOSCALING_CONFIG_ENV, str(tmp_path / "absent.yaml"))
    assert cluster.max_resources() == dict(ray.cluster_resources())


def test_sweep_counts_only_the_training_nodes_gpus(prepared, tmp_path, monkeypatch):
    # On the head, ~/ray_bootstrap_config.yaml has each node type's CPU and GPU filled in
    # from its instance type (the AWS provider does it at `ray up`): the vLLM nodes' GPUs
    # count in GPU too, but a training worker asks for csclip_train and never lands there.
    filled = {"head": {}, "cpu_worker": {"CPU": 16}, "gpu_train": {"CPU": 48, "GPU": 4},
              "vllm_worker": {"CPU": 48, "GPU": 4}}
    config = {**prepared, "available_node_types": {
        name: {**t, "resources": {**filled[name], **t["resources"]}}
        for name, t in prepared["available_node_types"].items()}}
    path = tmp_path / "ray_bootstrap_config.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv(cluster.AUTOSCALING_CONFIG_ENV, str(path))
    total = cluster.max_resources()
    assert total["GPU"] == 16 and total["csclip_train"] == 8
    coco = yaml.safe_load((REPO_ROOT / "configs" / "coco.yaml").read_text())["run"]
    workers = coco["num_workers"]
    assert workers == 4
    # 8 training GPUs hold 2 trials of 4 workers, not the 4 that all 16 GPUs would plan.
    assert sweeps.max_concurrent_trials(total, workers, use_gpu=True,
                                        worker_resources=coco["worker_resources"]) == 2
    assert sweeps.max_concurrent_trials(total, workers, use_gpu=True) == 4
    assert cluster.training_worker_slots(total, {}) is None
    assert cluster.training_worker_slots(total, {"csclip_train": 2}) == 4


def test_vllm_engines_ask_for_the_vllm_nodes_resource():
    from ray.llm._internal.batch.stages.vllm_engine_stage import vLLMEngineStage

    def stage_args(**fields):
        config = processor_config(VllmConfig(**fields))
        stage = vLLMEngineStage(
            fn_constructor_kwargs={"model": config.model_source,
                                   "engine_kwargs": dict(config.engine_kwargs),
                                   "placement_group_config": config.placement_group_config},
            map_batches_kwargs={"accelerator_type": config.accelerator_type})
        return stage.map_batches_kwargs

    # One GPU per engine: the actor itself takes the GPU and one unit of the resource.
    one = stage_args(node_resource="csclip_vllm")
    assert (one["num_gpus"], one["resources"]) == (1, {"csclip_vllm": 1})
    # Tensor parallel: every GPU bundle of the engine's placement group takes one unit.
    two = stage_args(node_resource="csclip_vllm", tensor_parallel_size=2)
    bundles = two["ray_remote_args_fn"].args[2]["bundles"]
    assert bundles == [{"CPU": 1, "GPU": 1, "csclip_vllm": 1}] * 2
    # Without the field: any GPU node, as before.
    assert "resources" not in stage_args()


def test_vllm_wait_covers_a_cold_gpu_node():
    # Boot + image pull + setup + model load on a cold autoscaling cluster: ~25 min.
    assert VllmConfig().wait_for_min_actors_s >= 1800


def test_cluster_extra_has_the_job_server_and_boto3_and_make_test_installs_it():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    [ray_pin] = [d for d in project["dependencies"] if d.startswith("ray[")]
    cluster_extra = project["optional-dependencies"]["cluster"]
    # ray[default] at exactly the version range of ray[data,train,tune].
    assert f"ray[default]{ray_pin.split(']', 1)[1]}" in cluster_extra
    assert any(d.startswith("boto3") for d in cluster_extra)
    # What make would run to build .venv (-n: print only; -B: as if it were missing).
    recipe = subprocess.run(["make", "-n", "-B", ".venv/.installed"], cwd=REPO_ROOT,
                            capture_output=True, text=True, check=True).stdout
    assert any("-m pip install" in line and line.endswith("-e '.[dev,cluster]'")
               for line in recipe.splitlines()), recipe


def _code_blocks(markdown: str) -> list[str]:
    return markdown.split("```")[1::2]


def test_readme_runs_every_job_on_the_cluster_and_links_the_guide():
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme[readme.index("## On a cluster"):readme.index("## Docs")]
    commands = " ".join(_code_blocks(section)).replace("\\\n", " ").splitlines()
    jobs = [c for c in commands if "pipelines/" in c or "tune/ablate.py" in c]
    assert jobs and all("ray job submit" in c or "--address" in c for c in jobs), jobs
    assert "(docs/cluster.md)" in readme


def test_cluster_guide_rehearses_the_same_commands_on_one_machine():
    guide = (REPO_ROOT / "docs" / "cluster.md").read_text()
    rehearsal = " ".join(_code_blocks(guide[guide.index("## Rehearse on one machine"):]))
    for command in ("ray start --head", "ray job submit", "python pipelines/train.py",
                    "python tune/ablate.py", "--address", "ray stop"):
        assert command in rehearsal, command
    for heading in ("## What to install where", "## Time and cost", "## Watching it",
                    "## When a node dies"):
        assert heading in guide


# ---------------------------------------------------------------------------------------
# Least privilege: two roles, IMDSv2, versioned runs, the jobs' own MLflow user
# ---------------------------------------------------------------------------------------

AWS_DIR = REPO_ROOT / "cluster"


def _policy(name: str) -> list[dict]:
    """The statements of cluster/<name>, Action and Resource always lists."""
    import json

    statements = json.loads((AWS_DIR / name).read_text())["Statement"]
    for statement in statements:
        for key in ("Action", "Resource"):
            if isinstance(statement.get(key), str):
                statement[key] = [statement[key]]
    return statements


def _profiles(raw: dict) -> dict[str, str]:
    return {name: t["node_config"]["IamInstanceProfile"]["Name"]
            for name, t in raw["available_node_types"].items()}


def test_the_head_and_the_workers_have_their_own_instance_profile(raw):
    profiles = _profiles(raw)
    head = profiles.pop(raw["head_node_type"])
    # Code on a worker (a job, a model's own code) gets the worker's rights only.
    assert set(profiles.values()) == {"csclip-worker"} and head == "csclip-head"


def test_every_node_type_requires_imdsv2(raw):
    for name, node_type in raw["available_node_types"].items():
        options = node_type["node_config"].get("MetadataOptions") or {}
        assert options.get("HttpTokens") == "required", name
        assert options.get("HttpEndpoint", "enabled") == "enabled", name
        # Ray's containers share the host's network: one hop reaches the metadata service.
        assert options.get("HttpPutResponseHopLimit", 1) == 1, name


def test_the_heads_ec2_rights_are_conditioned_on_the_cluster_tag(raw):
    statements = _policy("aws-head-policy.json")
    assert all(s["Effect"] == "Allow" for s in statements)
    actions = [a for s in statements for a in s["Action"]]
    assert not [a for a in actions if a.endswith("*") and not a.startswith("ec2:Describe")]
    tag = {"ec2:ResourceTag/ray-cluster-name": raw["cluster_name"]}
    request_tag = {"aws:RequestTag/ray-cluster-name": raw["cluster_name"]}
    for statement in statements:
        ec2 = [a for a in statement["Action"] if a.startswith("ec2:")]
        condition = statement.get("Condition", {}).get("StringEquals", {})
        if not ec2 or all(a.startswith("ec2:Describe") for a in ec2):
            continue
        instances = [r for r in statement["Resource"] if ":instance/" in r]
        if ec2 == ["ec2:RunInstances"] and not instances:
            # What a launch also touches (image, subnet, volume, the cluster's group)
            # carries no tag; an instance is launched only with the cluster's tag (below).
            assert not [r for r in statement["Resource"] if r == "*"]
            assert any(r.endswith(":security-group/SG-ID") for r in statement["Resource"])
            continue
        assert instances == statement["Resource"], statement["Sid"]
        if ec2 == ["ec2:RunInstances"]:
            # Only cluster.yaml's node types, only in its region (the count is the
            # autoscaler's max_workers: IAM has no condition on it).
            types = sorted({t["node_config"]["InstanceType"]
                            for t in raw["available_node_types"].values()})
            assert condition == {**request_tag, "ec2:InstanceType": types,
                                 "aws:RequestedRegion": raw["provider"]["region"]}, \
                statement["Sid"]
        elif ec2 == ["ec2:CreateTags"]:  # tags set by the launch itself
            assert condition == {"ec2:CreateAction": "RunInstances"}, statement["Sid"]
        else:
            assert condition == tag, statement["Sid"]
            assert {"ec2:TerminateInstances", "ec2:CreateTags"} <= set(ec2)
    launch = [s for s in statements if "ec2:RunInstances" in s["Action"]
              and any(":instance/" in r for r in s["Resource"])]
    assert launch and all(s.get("Condition") for s in launch)


def test_the_head_may_pass_only_the_worker_role(raw):
    statements = _policy("aws-head-policy.json")
    passing = [s for s in statements if any(a.startswith("iam:PassRole") or a in ("iam:*", "*")
                                            for a in s["Action"])]
    assert len(passing) == 1
    [worker_profile] = set(_profiles(raw).values()) - {"csclip-head"}
    assert passing[0]["Resource"] == [f"arn:aws:iam::ACCOUNT-ID:role/{worker_profile}"]
    assert passing[0]["Condition"] == {
        "StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}
    iam = {a for s in statements for a in s["Action"] if a.startswith("iam:")}
    assert iam == {"iam:PassRole", "iam:GetInstanceProfile"}


def test_workers_get_s3_only_and_no_delete_on_the_data():
    statements = _policy("aws-worker-policy.json")
    actions = {a for s in statements for a in s["Action"]}
    assert all(a.startswith("s3:") for a in actions) and "s3:*" not in actions
    data = ("arn:aws:s3:::MY-BUCKET/coco/*", "arn:aws:s3:::MY-BUCKET/bench/*")
    for statement in statements:
        if {"s3:DeleteObject", "s3:PutObject"} & set(statement["Action"]):
            assert not set(data) & set(statement["Resource"]), statement["Sid"]
            assert not [r for r in statement["Resource"] if r.endswith(("MY-BUCKET/*", "*:::*"))]
    assert not [a for a in actions if "Version" in a or "Bucket" in a and a != "s3:ListBucket"]
    readable = {r for s in statements if "s3:GetObject" in s["Action"] for r in s["Resource"]}
    assert set(data) <= readable and "arn:aws:s3:::MY-BUCKET/runs/*" in readable
    # Nor has the head the right to purge: no object versions deleted, no versioning off.
    head = {a for s in _policy("aws-head-policy.json") for a in s["Action"]}
    assert not [a for a in head | actions if "Version" in a or a == "s3:PutBucketVersioning"]


def test_the_guide_applies_these_policies_and_versions_the_bucket(raw):
    guide = (REPO_ROOT / "docs" / "cluster.md").read_text()
    commands = " ".join(_code_blocks(guide)).replace("\\\n", " ")
    for role, policy in (("csclip-head", "aws-head-policy.json"),
                         ("csclip-worker", "aws-worker-policy.json")):
        assert f"--role-name {role}" in commands and f"cluster/{policy}" in commands
        assert f"--instance-profile-name {role}" in commands
    assert "AmazonEC2FullAccess" not in guide
    assert "put-bucket-versioning" in commands and "Status=Enabled" in commands
    assert "cluster/aws-s3-lifecycle.json" in commands
    # The exposure table says where the GCS and raylet listen: all interfaces, not "each
    # node's address"; what crosses the network in clear is named, with how to close it.
    assert "each node's address" not in guide
    section = guide[guide.index("## What crosses the network"):]
    for words in ("MLflow", "metrics", "RAY_USE_TLS", "basic-auth"):
        assert words in section, words


def test_jobs_log_to_mlflow_as_their_own_user_not_the_admin(raw):
    import configparser

    ini = configparser.ConfigParser()
    ini.read(REPO_ROOT / "cluster" / "mlflow_auth.ini")
    admin = ini["mlflow"]["admin_username"]
    assert ini["mlflow"]["default_permission"] == "EDIT"
    starts = [c for c in [*raw["head_start_ray_commands"], *raw["worker_start_ray_commands"]]
              if "ray start" in c]
    for command in starts:
        assert "MLFLOW_TRACKING_USERNAME=csclip-jobs " in command and admin != "csclip-jobs"
        assert "MLFLOW_TRACKING_PASSWORD=$(cat /home/ray/csclip-secrets/mlflow-jobs-password)" \
            in command
    # The admin's password is read from the head's MLflow directory, which is not synced.
    [server] = [c for c in raw["head_start_ray_commands"] if "mlflow server" in c]
    assert "MLFLOW_AUTH_ADMIN_PASSWORD=$(cat /home/ray/mlflow/admin-password)" in server
    assert not [p for p in raw["cluster_synced_files"] if p.startswith("/home/ray/mlflow")]
    assert any("mlflow_jobs_user.py" in c for c in raw["head_start_ray_commands"])
