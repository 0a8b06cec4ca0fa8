"""The field names of the config models, read from csclip's source (ast) instead of
importing it: a setting no field has is refused, with its near misses, before the modules
that define the models (and torch with them, ~10 s) are imported. tests/test_first_hour_cli.py
checks the tree read here against the models themselves."""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
ROOT_BASE = "StrictModel"  # csclip.config's base of every config section

# field -> the fields of its section, or None: a value (nothing below it is checked).
Tree = dict[str, "Tree | None"]

_CLASS_LINE = re.compile(r"^class (\w+)\(([\w., ]*)\)", re.MULTILINE)


@dataclass(frozen=True)
class _ConfigClass:
    module: str
    node: ast.ClassDef
    bases: tuple[str, ...]


def unknown_setting(target: str, data: Mapping) -> tuple[str, list[str]] | None:
    """The first dotted key of `data` (a config as read from YAML and --set) that no field
    of `target` ("module:Class", e.g. "csclip.train.loop:TrainConfig") has, with its close
    matches among the fields at that level (full dotted names); None when every key is a
    field. A key an old config may hold (refuse_renamed's) is left to the model's own
    validator, which names what replaced it."""
    module, _, name = target.partition(":")
    classes = _config_classes()
    found = _find(classes, module, name)
    if found is None:
        raise KeyError(f"{target}: no config class of that name under {PACKAGE}")
    return _first_unknown(_tree(classes, found), data, "", _renamed_keys())


def field_tree(target: str) -> Tree:
    """The field tree of `target` ("module:Class") as read from the source."""
    module, _, name = target.partition(":")
    classes = _config_classes()
    found = _find(classes, module, name)
    if found is None:
        raise KeyError(target)
    return _tree(classes, found)


def _first_unknown(tree: Tree, data: Mapping, prefix: str,
                   renamed: frozenset[str]) -> tuple[str, list[str]] | None:
    for key, value in data.items():
        key = str(key)
        if key not in tree:
            if key in renamed:
                continue
            near = difflib.get_close_matches(key, list(tree), n=3, cutoff=0.6)
            return prefix + key, [prefix + match for match in near]
        section = tree[key]
        if section is not None and isinstance(value, Mapping):
            found = _first_unknown(section, value, f"{prefix}{key}.", renamed)
            if found is not None:
                return found
    return None


@cache
def _config_classes() -> dict[str, list[_ConfigClass]]:
    """Every class under csclip/ that derives from StrictModel, by class name. A regex
    finds the candidates in each file's text; only the files holding one are parsed."""
    lines: dict[str, tuple[Path, tuple[str, ...]]] = {}
    for path in PACKAGE.rglob("*.py"):
        for name, bases in _CLASS_LINE.findall(path.read_text(encoding="utf-8")):
            lines.setdefault(f"{_module_of(path)}:{name}",
                             (path, tuple(b.strip().rpartition(".")[2] for b in bases.split(",")
                                    if b.strip())))
    wanted: set[str] = set()
    grew = True
    while grew:  # the closure of StrictModel's subclasses, by base name
        names = {key.partition(":")[2] for key in wanted} | {ROOT_BASE}
        more = {key for key, (_, bases) in lines.items() if set(bases) & names} - wanted
        wanted |= more
        grew = bool(more)
    classes: dict[str, list[_ConfigClass]] = {}
    for path in sorted({lines[key][0] for key in wanted}):
        module = _module_of(path)
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and f"{module}:{node.name}" in wanted:
                bases = tuple(ast.unparse(b).rpartition(".")[2] for b in node.bases)
                classes.setdefault(node.name, []).append(_ConfigClass(module, node, bases))
    return classes


def _module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _find(classes: dict[str, list[_ConfigClass]], module: str, name: str) -> _ConfigClass | None:
    """The class `name` as seen from `module`: its own, else the only one of that name
    (two of one name elsewhere: None, and the field is not checked below)."""
    candidates = classes.get(name, [])
    own = [c for c in candidates if c.module == module]
    if own:
        return own[0]
    return candidates[0] if len(candidates) == 1 else None


def _tree(classes: dict[str, list[_ConfigClass]], cls: _ConfigClass) -> Tree:
    tree: Tree = {}
    for base in cls.bases:  # inherited fields first, as pydantic orders them
        parent = _find(classes, cls.module, base)
        if parent is not None:
            tree.update(_tree(classes, parent))
    for name, annotation in _fields(cls.node):
        section = _section(classes, cls.module, annotation)
        tree[name] = None if section is None else _tree(classes, section)
    return tree


def _fields(node: ast.ClassDef) -> Iterator[tuple[str, ast.expr]]:
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            name = statement.target.id
            if name.startswith("_") or name == "model_config" or \
                    ast.unparse(statement.annotation).startswith("ClassVar"):
                continue
            yield name, statement.annotation


def _section(classes: dict[str, list[_ConfigClass]], module: str,
             annotation: ast.expr) -> _ConfigClass | None:
    """The config class a field holds (`X`, `X | None`, `Optional[X]`), else None."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    parts: list[ast.expr] = []
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        parts = [annotation.left, annotation.right]
    elif isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) == "Optional":
        parts = [annotation.slice]
    else:
        parts = [annotation]
    named = [p for p in parts if not (isinstance(p, ast.Constant) and p.value is None)]
    if len(named) != 1 or not isinstance(named[0], ast.Name | ast.Attribute):
        return None
    return _find(classes, module, ast.unparse(named[0]).rpartition(".")[2])


@cache
def _renamed_keys() -> frozenset[str]:
    """The old field names csclip.config.refuse_renamed refuses with a pointer to their
    replacement: every key of the mapping given to a refuse_renamed call (a literal, or a
    module-level name bound to one)."""
    keys: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if "refuse_renamed(" not in text:
            continue
        tree = ast.parse(text)
        constants = {target.id: statement.value for statement in tree.body
                     if isinstance(statement, ast.Assign) for target in statement.targets
                     if isinstance(target, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "refuse_renamed" \
                    and len(node.args) >= 3:
                mapping = node.args[2]
                if isinstance(mapping, ast.Name):
                    mapping = constants.get(mapping.id, mapping)
                if isinstance(mapping, ast.Dict):
                    keys |= {k.value for k in mapping.keys
                             if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return frozenset(keys)
