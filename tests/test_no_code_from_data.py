"""Reading a file someone hands us runs no code: each reader of a user's or stranger's file
that could unpickle (CIFAR-10's batches, a checkpoint's weights and training state, a
`--pretrained` weights file) or construct objects from YAML (a config file) is given a
file whose load would create a marker file, and refuses it in one line naming the file,
the marker never written."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from paper_fixtures import CIFAR10_LABELS, CIFAR10_NAMES, write_cifar10

from csclip.config import read_yaml
from csclip.errors import CheckpointMismatch, ConfigError, CsclipError, DataError
from csclip.eval.zeroshot_paper import read_paper_dataset
from csclip.model import create_bundle, load_bundle, load_train_state, save_checkpoint, spec_of
from csclip.pretrained import read_weights_file
from csclip.storage import write_manifest


class OpensMarker:
    """Unpickling this opens (creates) the marker file: code run by a load."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


class RunsShell:
    """Unpickling this runs a shell command that creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message, message
    return message


# ---------------------------------------------------------------------------------------
# CIFAR-10's python pickles (suite zeroshot_paper)
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("payload", [OpensMarker, RunsShell])
@pytest.mark.parametrize("name", ["batches.meta", "test_batch"])
def test_a_crafted_cifar10_pickle_is_refused_without_running_its_code(tmp_path, name, payload):
    folder, marker = tmp_path / "cifar10", tmp_path / "MARKER"
    write_cifar10(folder)
    path = folder / "cifar-10-batches-py" / name
    original = pickle.loads(path.read_bytes())
    key = "label_names" if name == "batches.meta" else "labels"
    path.write_bytes(pickle.dumps({**original, key: payload(marker)}, protocol=2))
    with pytest.raises(DataError) as err:
        read_paper_dataset("cifar10", str(folder))
    message = _one_line(err)
    assert str(path) in message and "refused" in message, message
    assert not marker.exists()


def test_the_cifar10_pickles_of_every_protocol_still_read(tmp_path):
    """numpy arrays as Python 3 pickles them at protocol 2 (via _codecs.encode) and at
    protocol 5 (numpy's _frombuffer), and under numpy 1.x's module names: the same images
    and labels."""
    write_cifar10(tmp_path / "expected")
    expected = read_paper_dataset("cifar10", str(tmp_path / "expected"))
    for protocol in (0, 2, 4, 5):
        folder = tmp_path / f"protocol{protocol}"
        write_cifar10(folder)
        for name in ("test_batch", "batches.meta"):
            path = folder / "cifar-10-batches-py" / name
            path.write_bytes(pickle.dumps(pickle.loads(path.read_bytes()), protocol=protocol))
        dataset = read_paper_dataset("cifar10", str(folder))
        assert dataset.classnames == CIFAR10_NAMES
        assert list(dataset.labels.values()) == list(CIFAR10_LABELS)
        assert dataset.images == expected.images, protocol
    # numpy 1.x's module name, as the published files (written by numpy 1.x) have it.
    batch = tmp_path / "protocol2" / "cifar-10-batches-py" / "test_batch"
    assert b"numpy._core.multiarray\n_reconstruct" in batch.read_bytes()
    batch.write_bytes(batch.read_bytes().replace(b"numpy._core.", b"numpy.core."))
    assert read_paper_dataset("cifar10", str(tmp_path / "protocol2")).images == expected.images


def test_a_cifar10_batch_of_objects_is_refused(tmp_path):
    """An object array is the one way a numpy pickle nests arbitrary objects: refused too."""
    write_cifar10(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "test_batch"
    batch = pickle.loads(path.read_bytes())
    path.write_bytes(pickle.dumps({**batch, "data": np.asarray(batch["data"], dtype=object)}))
    with pytest.raises(DataError, match="refused"):
        read_paper_dataset("cifar10", str(tmp_path))


# ---------------------------------------------------------------------------------------
# torch.load: a checkpoint's weights and training state, a --pretrained file
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_spec():
    return spec_of(create_bundle("csclip-tiny", image_size=32).model, "csclip-tiny")


def test_a_crafted_checkpoint_weights_file_is_refused(tmp_path, tiny_spec):
    directory, marker = tmp_path / "checkpoint", tmp_path / "MARKER"
    save_checkpoint(torch.nn.Linear(2, 2), tiny_spec, directory)
    torch.save({"visual.proj": OpensMarker(marker)}, directory / "model.pt")
    write_manifest(directory)  # complete as far as its manifest says: the load decides
    with pytest.raises(CsclipError) as err:
        load_bundle(str(directory))
    assert f"{directory}/model.pt" in _one_line(err)
    assert not marker.exists()


def test_a_crafted_train_state_is_refused(tmp_path, tiny_spec):
    directory, marker = tmp_path / "checkpoint", tmp_path / "MARKER"
    save_checkpoint(torch.nn.Linear(2, 2), tiny_spec, directory,
                    {"step": 3, "optimizer": OpensMarker(marker)})
    with pytest.raises(CheckpointMismatch) as err:
        load_train_state(directory)
    assert "train_state.pt" in _one_line(err)
    assert not marker.exists()


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_crafted_pretrained_weights_file_is_refused(tmp_path, wrapped):
    """A plain state dict, or an open_clip training checkpoint (NegCLIP's layout)."""
    path, marker = tmp_path / "weights.pt", tmp_path / "MARKER"
    state = {"visual.proj": torch.zeros(2), "logit_scale": RunsShell(marker)}
    torch.save({"epoch": 1, "state_dict": state} if wrapped else state, path)
    with pytest.raises(ConfigError) as err:
        read_weights_file(str(path))
    assert str(path) in _one_line(err)
    with pytest.raises(ConfigError):
        create_bundle("csclip-tiny", pretrained=str(path))
    assert not marker.exists()


# ---------------------------------------------------------------------------------------
# YAML: a config file
# ---------------------------------------------------------------------------------------

def test_a_config_file_constructing_python_objects_is_refused(tmp_path):
    path, marker = tmp_path / "config.yaml", tmp_path / "MARKER"
    path.write_text(f"model: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigError) as err:
        read_yaml(path)
    assert str(path) in str(err.value)
    assert not marker.exists()
