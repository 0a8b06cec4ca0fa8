"""CLIP models from open_clip: our small configs for CPU work, pretrained tags or local
checkpoints on a cluster, and checkpoints that carry their model config (SPEC §6,
"Activation": a checkpoint reloaded with the wrong activation is silently wrong, so we
store the config beside the weights and refuse a mismatch).

Checkpoint directory layout (written by `save_checkpoint`):
    model.pt          plain state dict; loads with open_clip's `pretrained=<path>`
    model_spec.json   ModelSpec: name, quick_gelu, image size, context length, full config
    train_state.pt    optional: optimizer / schedule state, step and every rank's random
                      generator states (training resumes); tensors and plain types only
    config.json       optional: the resolved training config
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import pickle
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import open_clip
import torch
from open_clip.model import get_model_preprocess_cfg
from open_clip.transformer import QuickGELU

from csclip.config.model import ModelConfig, ModelSource
from csclip.errors import CheckpointMismatch, ConfigError, DataError
from csclip.model_configs import SMALL_MODEL_CONFIGS, register_small_models
from csclip.pretrained import (
    TRAINING_CHECKPOINT_QUICK_GELU,
    read_weights_file,
    resolve_tag_weights,
    tag_config,
)
from csclip.storage import check_export, local_dir, write_manifest

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "model.pt"
# Modules a training objective adds to the model for itself (loss.method layout's head,
# csclip.train.warm_start): in that run's checkpoints, so a resumed run keeps them, but not
# part of the CLIP model: a checkpoint loaded as a model (model.pretrained, load_bundle)
# leaves them out.
OBJECTIVE_HEADS = ("layout_head",)
SPEC_FILE = "model_spec.json"
TRAIN_STATE_FILE = "train_state.pt"
CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class ClipBundle:
    """A model with the preprocessing that belongs to it.

    model: open_clip CLIP (encode_image / encode_text / logit_scale).
    preprocess: PIL image -> (3, H, W) float tensor (open_clip's eval transform).
    tokenizer: list[str] -> (N, context_length) long tensor.
    name: open_clip model name; pretrained: tag or checkpoint path, or None.
    """

    model: torch.nn.Module
    preprocess: Callable
    tokenizer: Callable
    name: str
    pretrained: str | None = None


@dataclass(frozen=True)
class ModelSpec:
    """What a checkpoint's weights need to be read correctly. Stored as model_spec.json.

    The first five fields are compared on load; `model_cfg` (the full open_clip config)
    and `preprocess_cfg` rebuild the model and its transform.
    """

    name: str
    quick_gelu: bool
    image_size: int
    context_length: int
    embed_dim: int
    model_cfg: dict = field(default_factory=dict, compare=False)
    preprocess_cfg: dict = field(default_factory=dict, compare=False)

    COMPARED = ("name", "quick_gelu", "image_size", "context_length", "embed_dim")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> ModelSpec:
        """The spec of model_spec.json's text. Raises ValueError for text that is not
        JSON, not an object, or lacks a compared field."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
        missing = [k for k in ModelSpec.COMPARED if k not in data]
        if missing:
            raise ValueError(f"no {', '.join(missing)}")
        return ModelSpec(**{k: data[k] for k in ModelSpec.__dataclass_fields__ if k in data})


def _image_size(value: Any) -> int:
    return int(value[0] if isinstance(value, list | tuple) else value)


def spec_of(model: torch.nn.Module, name: str) -> ModelSpec:
    """Read the spec off a built open_clip model (what it *is*, not what was asked)."""
    quick_gelu = any(isinstance(m, QuickGELU) for m in model.modules())
    preprocess_cfg = dict(get_model_preprocess_cfg(model))
    preprocess_cfg = {k: list(v) if isinstance(v, tuple) else v for k, v in preprocess_cfg.items()}
    image_size = _image_size(model.visual.image_size)
    model_cfg = _resolved_model_cfg(name, quick_gelu, image_size)
    return ModelSpec(name=name, quick_gelu=quick_gelu, image_size=image_size,
                     context_length=int(model.context_length),
                     embed_dim=int(model.text_projection.shape[-1]),
                     model_cfg=model_cfg, preprocess_cfg=preprocess_cfg)


def _resolved_model_cfg(name: str, quick_gelu: bool, image_size: int) -> dict:
    cfg = open_clip.get_model_config(name) or {}
    cfg = copy.deepcopy(cfg)
    cfg["quick_gelu"] = quick_gelu
    cfg.setdefault("vision_cfg", {})["image_size"] = image_size
    return cfg


def check_spec(saved: ModelSpec, wanted: ModelSpec, where: str) -> None:
    """Raise CheckpointMismatch naming every field where `saved` differs from `wanted`."""
    diffs = [f"{key}={getattr(saved, key)!r} (config: {getattr(wanted, key)!r})"
             for key in ModelSpec.COMPARED if getattr(saved, key) != getattr(wanted, key)]
    if diffs:
        raise CheckpointMismatch(
            f"{where} was saved with " + ", ".join(diffs)
            + "; set model.name / model.quick_gelu / model.image_size to match the checkpoint")


def read_spec(checkpoint_dir: str | Path) -> ModelSpec:
    path = Path(checkpoint_dir) / SPEC_FILE
    if not path.is_file():
        raise CheckpointMismatch(f"{checkpoint_dir} has no {SPEC_FILE}; it is not a csclip "
                                 "checkpoint (pass a state-dict file as model.pretrained instead)")
    return parse_spec(path.read_bytes(), str(path))


def parse_spec(data: bytes, where: str) -> ModelSpec:
    """The ModelSpec of model_spec.json's bytes. Raises CheckpointMismatch naming `where`
    (the file) for bytes that are not UTF-8, not JSON, not an object or lack a field."""
    try:
        return ModelSpec.from_json(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        reason = f"not UTF-8: {err.reason} at byte {err.start}"
    except (ValueError, RecursionError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
    raise CheckpointMismatch(f"{where}: not a model spec ({reason}); a csclip checkpoint "
                             "saves a JSON object with name, quick_gelu, image_size, "
                             "context_length, embed_dim")


def is_checkpoint_dir(path: str | Path | None) -> bool:
    return path is not None and (Path(path) / SPEC_FILE).is_file()


def _build(name: str, pretrained: str | None, device: str, quick_gelu: bool | None,
           image_size: int | None, load_weights: bool = True) -> ClipBundle:
    register_small_models()
    if open_clip.get_model_config(name) is None and not name.startswith(("hf-hub:", "local-dir:")):
        raise ConfigError(f"model.name: unknown open_clip model {name!r}; choose one of "
                          f"{sorted(SMALL_MODEL_CONFIGS)} or open_clip.list_models()")
    tag_cfg = tag_config(name, pretrained)
    if quick_gelu is None:
        quick_gelu = bool(tag_cfg.get("quick_gelu", False))
    if tag_cfg and bool(tag_cfg.get("quick_gelu", False)) != quick_gelu:
        # open_clip only warns here; a wrong activation silently degrades the model (SPEC §6).
        raise CheckpointMismatch(
            f"pretrained tag {name}/{pretrained} was trained with quick_gelu="
            f"{tag_cfg.get('quick_gelu', False)}; set model.quick_gelu to match (or leave "
            "it unset: the tag decides)")
    # Without weights the tag's preprocessing still applies (mean/std differ per tag); the
    # tag itself is not passed, since open_clip would download it. With weights in the
    # cache, open_clip gets their file and the tag's preprocessing: no network at all.
    preprocess_overrides = _tag_preprocess(tag_cfg) if not load_weights else {}
    weights = pretrained
    if tag_cfg and load_weights:
        cached = resolve_tag_weights(name, pretrained)
        if cached is not None:
            weights, preprocess_overrides = cached.file, _tag_preprocess(tag_cfg)
    root = logging.getLogger()
    if not load_weights or not pretrained:
        # Built to read its spec, or random weights by request (pretrained None):
        # open_clip's "no weights loaded" warning says nothing the caller did not choose.
        root.addFilter(_skip_no_weights_warning)
    try:
        model, _, preprocess = open_clip.create_model_and_transforms(
            name, pretrained=weights if load_weights else None, device=device,
            force_quick_gelu=quick_gelu, force_image_size=image_size, **preprocess_overrides)
    except (RuntimeError, AssertionError) as err:
        # A weights file of another model: load_state_dict's size mismatch, or open_clip's
        # own assert while it resizes the position embeddings to this model's.
        if not (load_weights and weights and not tag_cfg and Path(weights).is_file()):
            raise
        raise CheckpointMismatch(_not_weights_of(weights, name, err)) from err
    finally:
        root.removeFilter(_skip_no_weights_warning)
    model.eval()
    return ClipBundle(model, preprocess, open_clip.get_tokenizer(name), name, pretrained)


def _build_from_checkpoint(directory: str | Path, name: str, device: str, quick_gelu: bool | None,
                           image_size: int | None) -> ClipBundle:
    """The model of a csclip checkpoint directory, without the objective's heads
    (OBJECTIVE_HEADS) its training may have saved with it."""
    weights = Path(directory) / WEIGHTS_FILE
    state = torch.load(weights, map_location="cpu", weights_only=True, mmap=True)
    if not any(key.split(".", 1)[0] in OBJECTIVE_HEADS for key in state):
        return _build(name, str(weights), device, quick_gelu, image_size)
    bundle = _build(name, None, device, quick_gelu, image_size)
    bundle.model.load_state_dict({key: value for key, value in state.items()
                                  if key.split(".", 1)[0] not in OBJECTIVE_HEADS})
    bundle.model.to(device)
    return ClipBundle(bundle.model, bundle.preprocess, bundle.tokenizer, name, str(weights))


# What torch.load and load_state_dict raise for a file that is not (all) a state dict: a
# truncated or foreign file, or weights of another model. Other errors are bugs.
_UNREADABLE_WEIGHTS = ("PytorchStreamReader", "zip archive", "magic number",
                       "Error(s) in loading state_dict", "Weights only load failed",
                       "mmap can only be used")


@contextlib.contextmanager
def unreadable_weights_as_data_error(directory: str | Path) -> Iterator[None]:
    """Turn the errors of reading a checkpoint's weights into one DataError naming it."""
    try:
        yield
    except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile) as err:
        raise DataError(f"{Path(directory) / WEIGHTS_FILE}: not a readable state dict "
                        f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
                        ) from err
    except RuntimeError as err:
        if not any(marker in str(err) for marker in _UNREADABLE_WEIGHTS):
            raise
        raise DataError(f"{Path(directory) / WEIGHTS_FILE}: not a readable state dict of "
                        f"this model ({str(err).splitlines()[0]})") from err


def _not_weights_of(path: str | Path, name: str, err: BaseException) -> str:
    """One line: the weights file `path` does not fit model `name` (err: what torch or
    open_clip said, its first line that names a tensor, else its last)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    detail = next((line for line in lines if "size mismatch" in line), lines[-1] if lines
                  else type(err).__name__)
    return (f"{path}: not weights of {name} ({detail}); set model.name (--model) to the model "
            "the weights are of")


def _skip_no_weights_warning(record: logging.LogRecord) -> bool:
    # open_clip logs "No pretrained weights loaded for model ..." through the root logger.
    return not record.getMessage().startswith("No pretrained weights loaded")


def _tag_preprocess(tag_cfg: dict) -> dict:
    names = {"mean": "image_mean", "std": "image_std", "interpolation": "image_interpolation",
             "resize_mode": "image_resize_mode"}
    return {names[k]: tag_cfg[k] for k in names if k in tag_cfg}


def create_bundle(name: str, pretrained: str | None = None, device: str = "cpu", *,
                  quick_gelu: bool | None = None, image_size: int | None = None) -> ClipBundle:
    """Create an open_clip model by name with random weights, a pretrained tag, a
    state-dict file or a csclip checkpoint directory (its spec must match the request).
    quick_gelu None: the tag's or the checkpoint's activation (False for neither).

    Raises ConfigError for an unknown name or a tag whose weights are neither cached nor
    downloadable, CheckpointMismatch for a spec mismatch.
    """
    if is_checkpoint_dir(pretrained):
        if quick_gelu is None:
            quick_gelu = read_spec(pretrained).quick_gelu
        # Check before loading: open_clip would silently resize position embeddings.
        wanted = _build(name, None, "cpu", quick_gelu, image_size, load_weights=False)
        check_spec(read_spec(pretrained), spec_of(wanted.model, name), str(pretrained))
        return _build_from_checkpoint(pretrained, name, device, quick_gelu, image_size)
    if pretrained and not Path(pretrained).exists() and ("/" in pretrained or pretrained.endswith(".pt")):
        raise ConfigError(f"model.pretrained: {pretrained} does not exist; give a pretrained "
                          "tag, a state-dict file or a checkpoint directory")
    if pretrained and Path(pretrained).is_file() and not pretrained.endswith((".safetensors", ".npz")):
        return _build_from_file(name, pretrained, device, quick_gelu, image_size)
    return _build(name, pretrained, device, quick_gelu, image_size)


def _build_from_file(name: str, path: str, device: str, quick_gelu: bool | None,
                     image_size: int | None) -> ClipBundle:
    """A torch-saved weights file: a plain state dict goes to open_clip as before; an
    open_clip training checkpoint (NegCLIP's released file: "module."-prefixed state dict
    beside epoch, name, optimizer) is loaded here, all its keys or none, built with
    model.quick_gelu or, unset, TRAINING_CHECKPOINT_QUICK_GELU, said in one log line."""
    weights = read_weights_file(path)
    if not weights.training:
        return _build(name, path, device, quick_gelu, image_size)
    if quick_gelu is None:
        quick_gelu = TRAINING_CHECKPOINT_QUICK_GELU
        logger.warning("%s: an open_clip training checkpoint (epoch %s, run %s) does not record "
                       "its activation; built as %s with quick_gelu=%s, as the CS-CLIP authors "
                       "evaluated NegCLIP (set model.quick_gelu=true for the QuickGELU NegCLIP "
                       "was fine-tuned with from OpenAI's weights)", path, weights.epoch,
                       weights.run_name, name, quick_gelu)
    bundle = _build(name, None, device, quick_gelu, image_size)
    try:
        missing, unexpected = bundle.model.load_state_dict(weights.state_dict, strict=False)
    except RuntimeError as err:  # a tensor of another shape: weights of another model
        raise CheckpointMismatch(_not_weights_of(path, name, err)) from err
    if missing or unexpected:
        raise CheckpointMismatch(f"{path}: not weights of {name} ({len(missing)} of its keys "
                                 f"missing, e.g. {missing[:2]}; {len(unexpected)} unexpected, "
                                 f"e.g. {unexpected[:2]}); set model.name to the checkpoint's model")
    bundle.model.to(device)
    return ClipBundle(bundle.model, bundle.preprocess, bundle.tokenizer, name, path)


def bundle_from_config(config: ModelSource, device: str = "cpu") -> ClipBundle:
    """create_bundle for a model section (ModelSource or ModelConfig)."""
    return create_bundle(config.name, config.pretrained, device,
                         quick_gelu=config.quick_gelu, image_size=config.image_size)


def effective_quick_gelu(config: ModelSource) -> bool:
    """model.quick_gelu as the model is built: the value set, else the checkpoint's
    (model.pretrained a checkpoint directory) or the pretrained tag's, else False."""
    if config.quick_gelu is not None:
        return config.quick_gelu
    if is_checkpoint_dir(config.pretrained):
        return read_spec(config.pretrained).quick_gelu
    return bool(tag_config(config.name, config.pretrained).get("quick_gelu", False))


def spec_from_config(config: ModelSource) -> ModelSpec:
    """The spec `config` would build, without loading or downloading weights."""
    bundle = _build(config.name, config.pretrained if not is_checkpoint_dir(config.pretrained)
                    else None, "cpu", effective_quick_gelu(config), config.image_size,
                    load_weights=False)
    return spec_of(bundle.model, config.name)


def load_bundle(checkpoint_or_name: str | Path, pretrained: str | None = None,
                device: str = "cpu", expected: ModelConfig | None = None) -> ClipBundle:
    """Load a csclip checkpoint directory (the model is rebuilt from its stored spec) or
    create a model by open_clip name.

    checkpoint_or_name: a local directory, an s3:// directory (copied once into the local
    cache, csclip.storage.local_dir, and loaded from there) or an open_clip model name.
    expected: when given, the checkpoint's spec must match what this config builds.
    Raises CheckpointMismatch when it does not, DataError for an empty s3:// location.
    """
    if str(checkpoint_or_name).startswith("s3://"):
        uri = str(checkpoint_or_name)
        wanted = (lambda: spec_from_config(expected)) if expected is not None else None
        local = local_dir(uri, kind="checkpoints", check=remote_checkpoint_check(uri, wanted))
        if not is_checkpoint_dir(local):
            raise CheckpointMismatch(f"{uri} has no {SPEC_FILE}; it is not a csclip checkpoint "
                                     "(a run's checkpoint is <run.storage_path>/<run>/final)")
        check_export(local, shown_as=uri)
        bundle = load_bundle(local, pretrained, device, expected)
        return ClipBundle(bundle.model, bundle.preprocess, bundle.tokenizer, bundle.name, uri)
    if not is_checkpoint_dir(checkpoint_or_name):
        if Path(str(checkpoint_or_name)).exists():
            read_spec(checkpoint_or_name)  # raises with an explanation
        return create_bundle(str(checkpoint_or_name), pretrained, device)
    saved = read_spec(checkpoint_or_name)
    if expected is not None:
        check_spec(saved, spec_from_config(expected), str(checkpoint_or_name))
    check_export(checkpoint_or_name)
    with unreadable_weights_as_data_error(checkpoint_or_name):
        bundle = _build_from_checkpoint(checkpoint_or_name, saved.name, device,
                                        saved.quick_gelu, saved.image_size)
    check_spec(saved, spec_of(bundle.model, saved.name), str(checkpoint_or_name))
    return ClipBundle(bundle.model, bundle.preprocess, bundle.tokenizer, saved.name,
                      str(checkpoint_or_name))


def remote_checkpoint_check(uri: str, wanted: Callable[[], ModelSpec] | None = None
                            ) -> Callable[[Callable[[str], bytes | None]], None]:
    """csclip.storage.local_dir's `check` for a checkpoint on S3: its spec is read, and
    compared with `wanted()` when given, before any other file of the prefix is
    downloaded (a prefix that is no checkpoint of this model costs one small read)."""

    def check(read: Callable[[str], bytes | None]) -> None:
        text = read(SPEC_FILE)
        if text is None and any(read(name) is not None for name in ("metrics.json", CONFIG_FILE)):
            # Another file of a checkpoint but no spec: an export killed before the spec
            # landed (the small files go first), the same refusal as storage.check_export.
            raise DataError(f"checkpoint {uri} is incomplete (export interrupted?): rerun the "
                            f"same command (it has no {SPEC_FILE})")
        if text is None:
            raise CheckpointMismatch(f"{uri} has no {SPEC_FILE}; it is not a csclip checkpoint "
                                     "(a run's checkpoint is <run.storage_path>/<run>/final)")
        if wanted is not None:
            check_spec(parse_spec(text, f"{uri}/{SPEC_FILE}"), wanted(), uri)

    return check


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The open_clip model inside torch.compile's and DistributedDataParallel's wrappers
    and the step's runners (LayoutForward, TrimmedTextForward), or the model."""
    model = getattr(model, "_orig_mod", model)   # torch.compile's OptimizedModule
    model = getattr(model, "module", model)      # DistributedDataParallel
    return model.model if getattr(type(model), "wraps_model", False) else model


def _num_groups(tower_blocks: int) -> int:
    # open_clip's lock groups: embeddings, blocks[:-1], [last block + final norm], projection.
    return tower_blocks + 2


def apply_training_options(model: torch.nn.Module, config: ModelConfig) -> None:
    """Gradient checkpointing and tower locking on an open_clip CLIP, in place (open_clip's
    `set_grad_checkpointing`, `lock_image_tower`, `lock_text_tower`). Locked parameters get
    requires_grad=False, so `build_optimizer` leaves them out.

    Raises ConfigError when more groups are unlocked than the tower has.
    """
    if config.grad_checkpointing:
        model.set_grad_checkpointing(True)
    lock = config.lock
    if lock.image:
        available = _num_groups(len(model.visual.transformer.resblocks))
        if lock.image_unlocked_groups > available:
            raise ConfigError(f"model.lock.image_unlocked_groups={lock.image_unlocked_groups}: "
                              f"the image tower of {config.name} has {available} groups")
        model.lock_image_tower(unlocked_groups=lock.image_unlocked_groups)
    if lock.text:
        available = _num_groups(len(model.transformer.resblocks))
        if lock.text_unlocked_layers > available:
            raise ConfigError(f"model.lock.text_unlocked_layers={lock.text_unlocked_layers}: "
                              f"the text tower of {config.name} has {available} groups")
        model.lock_text_tower(unlocked_layers=lock.text_unlocked_layers)


def save_checkpoint(model: torch.nn.Module, spec: ModelSpec, directory: str | Path,
                    train_state: dict | None = None, config: dict | None = None) -> Path:
    """Write weights (plain state dict), spec and optional training state to `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}
    torch.save(state, directory / WEIGHTS_FILE)
    (directory / SPEC_FILE).write_text(spec.to_json())
    if train_state is not None:
        torch.save(train_state, directory / TRAIN_STATE_FILE)
    if config is not None:
        (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))
    # Last: a directory whose manifest matches its files is complete (csclip.storage).
    write_manifest(directory)
    return directory


def load_train_state(directory: str | Path) -> dict | None:
    """The optimizer / schedule / step state saved with a checkpoint, or None.

    Loaded with weights_only=True: tensors and plain containers and numbers only, so a
    train_state.pt from a shared prefix or someone's run directory runs no code when read
    (a full unpickle would run whatever the file names). Whatever the trainer saves here
    must stay of those types (an RNG state as tensors or tuples of ints, not numpy arrays).

    Raises CheckpointMismatch for a file holding anything else.
    """
    path = Path(directory) / TRAIN_STATE_FILE
    if not path.is_file():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        first = next((line for line in str(err).splitlines() if "unsupported" in line.lower()), "")
        raise CheckpointMismatch(
            f"{path}: refused, it holds objects a training state never does "
            f"({first.strip() or type(err).__name__}); it is read with weights_only=True so "
            "that a crafted file cannot run code; resume from a checkpoint csclip wrote") from err


def load_weights_into(model: torch.nn.Module, directory: str | Path, expected: ModelSpec) -> None:
    """Load a checkpoint's weights into an existing model after checking its spec."""
    check_spec(read_spec(directory), expected, str(directory))
    check_export(directory)
    state = torch.load(Path(directory) / WEIGHTS_FILE, map_location="cpu", weights_only=True)
    unwrap(model).load_state_dict(state)
