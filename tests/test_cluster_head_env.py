"""The extraction's driver runs on the head, whose Python has only what cluster.yaml's
setup installs (cluster/requirements.txt) on top of Ray's image: build the vLLM processor
(`ray.data.llm.build_processor`, which imports transformers and builds every stage without
running one) in an environment with exactly those packages; then check, for each stage,
which node types its resource request admits and that each of them has what it imports.

The environment: a fresh venv (no pip, no system site-packages) whose site-packages links
the distributions of this test's venv that the head's requirements pull in (their
Requires-Dist closure, extras and markers evaluated), and nothing else: no pytest, no dev
extra, no vllm, no csclip install (csclip comes from the checkout, as a job's working
directory brings it). Built in a second from the project's files and the venv `make test`
already installs (`.[dev,cluster]`), so nothing is downloaded. What it cannot be: the image
itself (Python 3.12, Ray's image's extra tools); a top-level directory that several
distributions share (a namespace package) comes whole.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
import tempfile
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from csclip import cluster

REPO_ROOT = Path(__file__).resolve().parents[1]
CLUSTER_YAML = REPO_ROOT / "cluster.yaml"

BUILD_SCRIPT = """
import json, sys
import ray
if sys.argv[3] == "init":  # a small local Ray; build_processor would start a default one
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
from csclip.extract.vllm import VllmConfig, processor_config
from ray.data.llm import build_processor

cfg = VllmConfig.model_validate({**json.loads(sys.argv[1]), "model_source": sys.argv[2]})
processor = build_processor(processor_config(cfg))
stages = processor.stages.values() if isinstance(processor.stages, dict) else processor.stages
out = []
for stage in stages:
    kwargs = stage.map_batches_kwargs
    request = {"CPU": kwargs.get("num_cpus", 1), "GPU": kwargs.get("num_gpus", 0),
               **(kwargs.get("resources") or {})}
    remote_fn = kwargs.get("ray_remote_args_fn")
    if remote_fn is not None:  # tensor parallel: the engine's placement group's bundles
        for bundle in remote_fn.args[2]["bundles"]:
            request.update({k: max(request.get(k, 0), v) for k, v in bundle.items()})
    out.append({"stage": type(stage).__name__, "request": request})
print("STAGES " + json.dumps(out))
print("VLLM_IMPORTED", "vllm" in sys.modules)
"""


def requirement_closure(requirements: list[str]) -> tuple[set[str], list[str]]:
    """The distributions (canonical names) that `requirements` pull in, as installed in
    this interpreter, and the requirements nothing installed satisfies."""
    found: set[str] = set()
    missing: list[str] = []
    seen: set[tuple[str, frozenset]] = set()
    pending = [Requirement(r) for r in requirements]
    while pending:
        requirement = pending.pop()
        key = (canonicalize_name(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            missing.append(str(requirement))
            continue
        if dist.version not in requirement.specifier and requirement.specifier:
            missing.append(f"{requirement} (installed {dist.version})")
        found.add(key[0])
        for line in dist.requires or []:
            dependency = Requirement(line)
            extras = [""] + sorted(requirement.extras)
            if dependency.marker is None or any(
                    dependency.marker.evaluate({"extra": extra}) for extra in extras):
                pending.append(dependency)
    return found, missing


def build_env(root: Path, distributions: set[str]) -> Path:
    """A venv at `root` whose site-packages holds links to exactly `distributions`;
    returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    here = Path(sysconfig.get_paths()["purelib"])
    for dist in metadata.distributions():
        if canonicalize_name(dist.metadata["Name"]) not in distributions:
            continue
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            source, target = here / top, site / top
            if source.exists() and not target.exists():
                target.symlink_to(source)
    return python


def _run_build(python: Path, tmp_path: Path, vllm_fields: dict,
               start_ray: bool = True) -> subprocess.CompletedProcess:
    model = tmp_path / "model"  # a local model directory: no hub, nothing downloaded
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(
        {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))
    ray_tmp = Path(tempfile.mkdtemp(prefix="csclip-headenv-", dir="/tmp"))
    env = {"PATH": f"{python.parent}:/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT),
           "HOME": str(tmp_path), "RAY_TMPDIR": str(ray_tmp), "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1", "PYTHONNOUSERSITE": "1"}
    return subprocess.run([str(python), "-c", BUILD_SCRIPT, json.dumps(vllm_fields), str(model),
                           "init" if start_ray else "no-init"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def head_requirements() -> list[str]:
    return cluster.node_requirements()


@pytest.fixture(scope="module")
def extraction_vllm() -> dict:
    extract = yaml.safe_load((REPO_ROOT / "configs" / "extract_coco.yaml").read_text())
    return {k: v for k, v in extract["backend"]["vllm"].items() if k != "model_source"}


@pytest.fixture(scope="module")
def built(head_requirements, extraction_vllm, tmp_path_factory) -> dict:
    distributions, missing = requirement_closure(head_requirements)
    assert not missing, f"this venv lacks what the head installs: {missing} (make test reinstalls)"
    tmp = tmp_path_factory.mktemp("head-env")
    python = build_env(tmp / "venv", distributions)
    # With the tokenizer stages on: every stage the config can build (off, the same
    # imports and a subset of the stages).
    done = _run_build(python, tmp, {**extraction_vllm, "tokenizer_stages": True})
    assert done.returncode == 0, done.stderr[-4000:]
    [line] = [t for t in done.stdout.splitlines() if t.startswith("STAGES ")]
    return {"stages": json.loads(line[len("STAGES "):]), "stdout": done.stdout,
            "distributions": distributions}


def test_the_head_environment_builds_the_vllm_processor(built):
    names = [s["stage"] for s in built["stages"]]
    assert names == ["ChatTemplateStage", "TokenizeStage", "vLLMEngineStage", "DetokenizeStage"]
    # Exactly the head's packages: no vLLM there (its engines run on the vLLM nodes), no
    # test tools.
    assert "VLLM_IMPORTED False" in built["stdout"]
    assert not {"vllm", "pytest", "hypothesis", "moto"} & built["distributions"]
    assert "transformers" in built["distributions"]


def test_without_transformers_the_head_could_not_build_it(head_requirements, extraction_vllm,
                                                          tmp_path):
    # What the head had before: the same packages less transformers (what cluster.yaml
    # installed then). build_processor imports transformers first, before it starts Ray.
    # Taken out of the closure, not only the list: clip_benchmark requires it too.
    before = [r for r in head_requirements if not r.startswith("transformers")]
    distributions, _ = requirement_closure(before)
    distributions.discard("transformers")
    done = _run_build(build_env(tmp_path / "venv", distributions), tmp_path, extraction_vllm,
                      start_ray=False)
    assert done.returncode != 0
    assert "No module named 'transformers'" in done.stderr


# ---------------------------------------------------------------------------------------
# Where each stage may run, and what is there
# ---------------------------------------------------------------------------------------

def _gpu_instance(instance_type: str) -> bool:
    # The node types' instance families: g6 / g6e / p4d / p5 have NVIDIA GPUs, m6i none.
    return bool(re.match(r"(g\d|p\d)", instance_type))


def node_types_admitting(request: dict[str, float], config: dict) -> list[str]:
    """The node types whose resources can hold `request` (the head's CPU 0 holds no
    task; CPU and GPU counts are filled in by `ray up` from the instance type)."""
    admitted = []
    for name, node_type in config["available_node_types"].items():
        declared = node_type.get("resources") or {}
        fits = all(declared.get(resource, 0) >= amount for resource, amount in request.items()
                   if resource not in ("CPU", "GPU") and amount)
        if request.get("CPU", 0) and declared.get("CPU", 1) == 0:
            fits = False
        if request.get("GPU", 0) and not _gpu_instance(node_type["node_config"]["InstanceType"]):
            fits = False
        if fits:
            admitted.append(name)
    return admitted


def _installs_node_requirements(commands: list[str]) -> bool:
    return any(c.startswith("pip install -q -r /home/ray/csclip/requirements.txt") for c in commands)


def test_each_stage_names_where_it_may_run_and_those_nodes_have_its_imports(built):
    from ray.autoscaler.v2.instance_manager.config import AutoscalingConfig

    raw = yaml.safe_load(CLUSTER_YAML.read_text())
    ray_view = AutoscalingConfig(raw, skip_content_hash=True)
    head = ray_view.get_head_node_type()
    requirements = cluster.NODE_REQUIREMENTS.read_text()
    assert re.search(r"^transformers", requirements, re.M)
    # The driver (build_processor) runs on the head: its setup installs the requirements.
    assert _installs_node_requirements(ray_view.get_head_setup_commands())
    by_stage = {s["stage"]: node_types_admitting(s["request"], raw) for s in built["stages"]}
    # The engine asks for the vLLM nodes' own resource: only they can hold it, and their
    # image (Ray's LLM image) has vLLM.
    assert by_stage["vLLMEngineStage"] == ["vllm_worker"]
    assert "ray-llm" in ray_view.get_docker_config("vllm_worker")["image"]
    # The CPU stages ask only for CPU: every node type with CPUs may run them, and every
    # one of those installs transformers (the head, with CPU 0, runs none).
    for stage in ("ChatTemplateStage", "TokenizeStage", "DetokenizeStage"):
        assert head not in by_stage[stage]
        assert set(by_stage[stage]) == {"cpu_worker", "gpu_train", "vllm_worker"}, stage
        for node_type in by_stage[stage]:
            assert _installs_node_requirements(ray_view.get_worker_setup_commands(node_type)), \
                (stage, node_type)

