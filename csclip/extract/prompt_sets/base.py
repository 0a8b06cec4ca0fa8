"""What every LLM prompt set implements (`PromptSet`), and the stored answers all of them
read back (`StoredAnswers`).

A prompt set owns its calls: which requests a caption needs (each one's messages, sampling
and JSON schema), how they run on Ray Data, and how their answers become a caption's
Outcome. Every call it makes is stored as one answer record (csclip.extract.answers): `kind`
(one of its `call_kinds`), `sample_id`, `caption_index`, `entity` (or null), `occurrence`,
`answer` (null after an inference error), `error`, `prompts` (its name). Light: no pyarrow,
Ray or torch at import.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from importlib import resources
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import pyarrow as pa

    from csclip.config.extract import VllmConfig
    from csclip.extract.backends import Outcome
    from csclip.extract.vllm import Engine


def prompt_text(prompt_set: str, name: str) -> str:
    """A prompt set's text file, package data at texts/<prompt_set>/<name> beside this
    module, without the one newline each file ends with."""
    path = resources.files("csclip.extract.prompt_sets") / "texts" / prompt_set / name
    return path.read_text(encoding="utf-8").removesuffix("\n")


def prompt_json(prompt_set: str, name: str) -> dict:
    """A prompt set's JSON file (a schema), read as `prompt_text` reads text, key order kept."""
    return json.loads(prompt_text(prompt_set, name))


class MissingAnswer(LookupError):
    """A call without an answer (an inference error, or none stored for replay)."""


class CallKey(Protocol):
    """What identifies a call among a caption's calls."""

    kind: str
    entity: str | None
    occurrence: int


AnswerOf = Callable[[CallKey], str]


def answer_key(record: dict) -> tuple[str, str | None, int]:
    """(kind, entity, occurrence) of a stored answer record. Raises KeyError, TypeError or
    ValueError for a record without them."""
    return (record["kind"], record.get("entity"), int(record.get("occurrence") or 0))


class StoredAnswers:
    """A caption's stored answer records, looked up by call: as an `AnswerOf` (raising
    MissingAnswer for a call with no answer) or with `get`."""

    def __init__(self, records: Iterable[dict]):
        self.by_key = {answer_key(r): r for r in records}

    def get(self, kind: str, entity: str | None = None, occurrence: int = 0) -> str | None:
        """The answer text of a call, None when none is stored or it failed."""
        record = self.by_key.get((kind, entity, occurrence))
        return None if record is None else record.get("answer")

    def __call__(self, call: CallKey) -> str:
        record = self.by_key.get((call.kind, call.entity, call.occurrence))
        if record is None:
            raise MissingAnswer(f"no stored answer for {_describe(call)}")
        if record.get("answer") is None:
            raise MissingAnswer(f"{_describe(call)}: {record.get('error') or 'no answer'}")
        return record["answer"]


def _describe(call: CallKey) -> str:
    entity = f" {call.entity!r}" if call.entity is not None else ""
    return f"the {call.kind} call{entity} #{call.occurrence}"


@runtime_checkable
class PromptSet(Protocol):
    """One way of asking the LLM for a caption's units (`backend.prompts`).

    Caption rows carry CAPTION_SCHEMA's columns plus `shard` and `caption_index`; result
    rows are csclip.extract.backends.RESULT_SCHEMA rows, exactly one per caption, whose
    `calls_json` lists the caption's answer records.
    """

    name: str  # backend.prompts, and the `prompts` of its answer records
    source: str  # the units table's `source` of the records it makes
    call_kinds: tuple[str, ...]  # the `kind` of each call it may make, in call order

    def schemas(self) -> dict[str, dict]:
        """The JSON schema each call kind's answer is decoded under."""
        ...

    def run(self, rows: pa.Table, cfg: VllmConfig, engine: Engine | None,
            attempt: int) -> Iterator[pa.Table]:
        """Result batches of caption rows on Ray Data. engine: a Dataset -> Dataset stage
        for every engine call (tests), else built from cfg. attempt > 0: the result rows
        an earlier attempt marked Status.REPAIR, asked again."""
        ...

    def outcome(self, row: dict, answers: StoredAnswers, repair: bool) -> Outcome:
        """A caption row's Outcome from its stored answers, as the live run decided it
        (`backend.name: replay`). repair: whether the run made repair calls."""
        ...

    def requests(self, row: dict, answers: StoredAnswers, cfg: VllmConfig) -> list[dict]:
        """The requests a caption's stored answers answered, as sent (`--dump-prompts`)."""
        ...
