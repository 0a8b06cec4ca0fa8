"""The package layout's boundaries: arrows point down only (docs/architecture.md).

Two checks. Every import statement of csclip/, the ones inside functions too, is read
from the source, relative ones resolved to absolute names (most stage-to-stage imports
are deferred into functions, where a top-level import test cannot see them). And after a
real evaluation and a real training step, `sys.modules` holds nothing of the stages they
must not reach.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "csclip"
STAGES = ("train", "eval", "extract", "ablation", "report", "demo", "entry", "cli")
# What each stage may import of the other stages (the library is open to all of them).
ALLOWED = {
    "eval": set(),
    "extract": set(),
    "train": {"eval"},  # evaluation during training (csclip.train.periodic) scores the live model
    "ablation": {"train", "eval"},
    "report": {"eval", "ablation"},  # the paper report reads evaluations and sweeps
    "demo": {"train", "eval"},
    "entry": set(STAGES),
    "cli": {"entry"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str | None = None) -> set[str]:
    """The absolute names `path` imports; `module` is its own name, which relative imports
    (`from ..train import loop`) are resolved against."""
    names: set[str] = set()
    package = None
    if module is not None:
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module
            if node.level:
                parts = (package or "").split(".")
                if package is None or node.level > len(parts):
                    raise ValueError(f"{path}: relative import beyond its package")
                base = ".".join(parts[: len(parts) - node.level + 1] + [node.module or ""])
                base = base.rstrip(".")
            if base:
                names.add(base)
                names |= {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in names if name.split(".")[0] in ("csclip", "research", "benchmarks")}


def _stage(module: str) -> str | None:
    """The stage a csclip module belongs to; None for the library."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else None


def import_graph() -> dict[str, set[str]]:
    return {_module_name(path): _imports(path, _module_name(path)) for path in PACKAGE.rglob("*.py")}


def test_every_import_in_csclip_points_down():
    wrong = []
    for module, imported in sorted(import_graph().items()):
        source = _stage(module)
        for name in sorted(imported):
            if name == "csclip":  # `from csclip import tracking`: the submodule is listed too
                continue
            if not name.startswith("csclip."):
                wrong.append(f"{module} -> {name} (studies and benchmarks are not the product)")
                continue
            target = _stage(name)
            if target is None or target == source:
                continue
            if source is None:
                wrong.append(f"{module} (library) -> {name}")
            elif target not in ALLOWED[source]:
                wrong.append(f"{module} -> {name}")
    assert not wrong, "\n".join(wrong)


def test_no_module_of_the_package_is_over_900_lines_and_few_over_500():
    # A module past this is due a split along its sections, as rules.py and halftruth.py
    # were when they grew past it; loop.py had grown back to 906.
    lengths = {str(path.relative_to(REPO_ROOT)): len(path.read_text().splitlines())
               for path in PACKAGE.rglob("*.py")}
    assert len(lengths) > 50
    assert not {name: n for name, n in lengths.items() if n > 900}
    assert len({name for name, n in lengths.items() if n > 500}) <= 10


def declared_config_fields() -> list[tuple[str, str, str]]:
    """(module, class, field) for each field a config class of csclip.config declares
    itself (a subclass's redeclared default counts again): what a user can set."""
    import importlib
    import inspect
    import pkgutil

    import pydantic

    import csclip.config

    seen, rows = set(), []
    for info in pkgutil.iter_modules(csclip.config.__path__):
        module = importlib.import_module(f"csclip.config.{info.name}")
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, pydantic.BaseModel)
                    and obj.__module__ == module.__name__ and obj not in seen):
                seen.add(obj)
                rows += [(info.name, name, field) for field in getattr(obj, "__annotations__", {})
                         if field in obj.model_fields]
    return rows


def test_config_fields_stay_at_most_211():
    # A field is a knob every user reads past: one more must replace one (a redundant
    # field, a dead one, or a constant no user should set, out of the configs).
    rows = declared_config_fields()
    assert ("train", "RunSection", "best_metric") in rows  # the count sees the fields
    assert len(rows) <= 211, len(rows)


def _module_edges() -> dict[str, set[str]]:
    """module -> the csclip modules it imports (inside functions too; names imported from a
    module count as that module, a submodule imported by name as the submodule)."""
    graph = import_graph()
    modules = set(graph)
    edges: dict[str, set[str]] = {}
    for module, names in graph.items():
        targets = set()
        for name in names:
            if any(other.startswith(name + ".") and other in modules for other in names):
                continue  # `from package import submodule` reaches the submodule
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module and name != "csclip":
                targets.add(name)
        edges[module] = targets
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_in_the_package():
    assert _cycles(_module_edges()) == []


def test_the_cycle_finder_finds_a_deferred_back_edge():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_private_name_is_imported_across_modules():
    graph = import_graph()
    wrong = []
    for module, names in sorted(graph.items()):
        for name in sorted(names):
            owner, _, last = name.rpartition(".")
            if (owner in graph and owner != module and last.startswith("_")
                    and not last.startswith("__")):
                wrong.append(f"{module} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_every_package_says_its_public_names():
    missing = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        tree = ast.parse(init.read_text())
        names = {target.id for node in tree.body if isinstance(node, ast.Assign)
                 for target in node.targets if isinstance(target, ast.Name)}
        names |= {node.target.id for node in tree.body
                  if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
        if "__all__" not in names:
            missing.append(str(init.relative_to(REPO_ROOT)))
    assert not missing


def test_the_graph_reader_sees_imports_inside_functions(tmp_path):
    # The check above is only as good as its reader: a deferred import must count.
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from csclip.train.loop import run\n    import csclip.demo\n")
    assert _imports(module) == {"csclip.train.loop", "csclip.train.loop.run", "csclip.demo"}


def test_the_graph_reader_resolves_relative_imports(tmp_path):
    # `from ..train import loop` inside csclip/eval/ is csclip.train.loop, and is refused.
    module = tmp_path / "m.py"
    module.write_text("from ..train import loop\nfrom . import encoder\n"
                      "def f():\n    from .suites.core import Item\n")
    assert _imports(module, "csclip.eval.m") == {
        "csclip.train", "csclip.train.loop", "csclip.eval", "csclip.eval.encoder",
        "csclip.eval.suites.core", "csclip.eval.suites.core.Item"}
    package = tmp_path / "__init__.py"
    package.write_text("from .rules import extract_units\nfrom .. import units\n")
    assert _imports(package, "csclip.extract") == {
        "csclip.extract.rules", "csclip.extract.rules.extract_units", "csclip",
        "csclip.units"}


def _modules_after(code: str) -> set[str]:
    """The csclip, ray and torch modules loaded in a fresh interpreter after `code` ran."""
    script = (code + "\nimport sys\nprint('\\n'.join(sorted(m for m in sys.modules "
              "if m.split('.')[0] in ('csclip', 'ray', 'torch'))))")
    done = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                          text=True, cwd=REPO_ROOT, timeout=600)
    return set(done.stdout.split())


def _loaded(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


def test_a_real_evaluation_loads_nothing_of_training_extraction_or_ray():
    modules = _modules_after(
        "from csclip.config.eval import BenchmarkConfig, EvalDataConfig\n"
        "from csclip.config.world import WorldConfig\n"
        "from csclip.eval.pipeline import evaluate_bundle, load_records\n"
        "from csclip.model import create_bundle\n"
        "world = WorldConfig(num_train=0, num_val=12, num_test=0, image_size=32)\n"
        "records = load_records(EvalDataConfig(world=world))\n"
        "report = evaluate_bundle(create_bundle('csclip-tiny', image_size=32), records,\n"
        "                         benchmark=BenchmarkConfig(num_bootstrap=5))\n"
        "assert 'ht_all' in report.metrics and 'ret_i2t' in report.metrics\n")
    assert "csclip.eval.pipeline" in modules and "csclip.records" in modules
    assert not _loaded(modules, ("csclip.train", "csclip.extract", "csclip.ablation",
                                 "csclip.report", "csclip.demo", "csclip.entry", "ray"))


def test_a_real_training_step_loads_no_evaluation_or_ray():
    modules = _modules_after(
        "import torch\n"
        "from csclip.config.train import TrainConfig\n"
        "from csclip.train.loop import prepare_training\n"
        "from csclip.config.train import SamplingConfig\n"
        "from csclip.train.step import train_step\n"
        "from csclip.train.stream import prepare_batch, preprocess_key\n"
        "from csclip.units import records_to_table\n"
        "from csclip.config.world import WorldConfig\n"
        "from csclip.world import world_record\n"
        "config = TrainConfig.model_validate({'model': {'image_size': 32}, 'data': {'batch_size': 4}})\n"
        "setup = prepare_training(config, torch.device('cpu'))\n"
        "world = WorldConfig(num_train=4, image_size=32)\n"
        "table = records_to_table([world_record(world, 'train', i) for i in range(4)])\n"
        "columns = prepare_batch(table, sampling=SamplingConfig().model_dump(),\n"
        "    preprocess=preprocess_key(setup.spec.preprocess_cfg), model_name='csclip-tiny',\n"
        "    seed=0, epoch=0)\n"
        "batch = {k: torch.as_tensor(v) for k, v in columns.items()}\n"
        "parts = train_step(setup.training, batch)\n"
        "assert torch.isfinite(parts.total)\n")
    assert "csclip.train.step" in modules
    assert not _loaded(modules, ("csclip.eval", "csclip.extract", "csclip.ablation",
                                 "csclip.demo", "csclip.entry", "ray"))


def test_the_training_streams_functions_unpickle_without_torch():
    # Ray Train's DatasetManager and each epoch's SplitCoordinator unpickle these (and
    # their fn_kwargs) before the first step of every run; torch would cost each ~3 s.
    modules = _modules_after(
        "import pickle\n"
        "from csclip.config.train import SamplingConfig\n"
        "from csclip.train.stream import decode_batch, prepare_batch, sample_batch\n"
        "kwargs = {'sampling': SamplingConfig().model_dump(mode='json'), 'seed': 0, 'epoch': 0}\n"
        "pickle.loads(pickle.dumps((decode_batch, prepare_batch, sample_batch, kwargs)))\n"
        "from csclip.train.ingest import EpochSplitConfig\n"  # the DatasetManager's DataConfig
        "pickle.loads(pickle.dumps(EpochSplitConfig(datasets_to_split='all')))\n"
        "import csclip.train\n")
    assert {"csclip.train.stream", "csclip.train.ingest"} <= modules
    assert not _loaded(modules, ("torch", "csclip.train.loop", "csclip.loss"))


@pytest.mark.parametrize("module", ["csclip.loss", "csclip.train.sampling", "csclip.records",
                                    "csclip.eval.halftruth", "csclip.world"])
def test_pure_modules_do_not_import_ray(module):
    assert not _loaded(_modules_after(f"import {module}"), ("ray",))


def test_marked_section_takes_over_an_unmarked_heading_section(tmp_path):
    from csclip.markdoc import update_marked_section

    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\n## A (bench_a.py)\nold a\n\n## B\nkeep b\n")
    update_marked_section(doc, "a", "## A (bench_a.py)\nnew a", heading="## A (bench_a.py)")
    update_marked_section(doc, "a", "## A (bench_a.py)\nnewer a", heading="## A (bench_a.py)")
    text = doc.read_text()
    assert "old a" not in text and "new a\n" not in text and text.count("newer a") == 1
    assert "## B\nkeep b" in text and text.index("newer a") < text.index("## B")
