"""The half-truth benchmark's vocabulary: every condition (defined here and nowhere else),
the protocols, the skip reasons, an item, a built benchmark and its content hash."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass
from enum import StrEnum


@dataclass(frozen=True)
class Condition:
    """One SPEC §4 condition: `slug` names it in metric keys, `label` in tables."""

    slug: str
    label: str
    group: str  # "entity" | "relation"


CONDITIONS: tuple[Condition, ...] = (
    Condition("obj", "+Obj", "entity"),
    Condition("attr", "+Attr", "entity"),
    Condition("rand", "+Rand", "entity"),
    Condition("rel_attr", "Rel:Attr", "relation"),
    Condition("rel_obj", "Rel:Obj", "relation"),
    Condition("ant", "Ant", "relation"),
    Condition("swap", "Swap", "relation"),
    Condition("subj", "Subj", "relation"),
)
# Neg (the predicate negated) is built by the authors' builder but left out of the paper's
# tables: reported apart, never in the entity / relation / overall averages.
EXTRA_CONDITIONS: tuple[Condition, ...] = (Condition("neg", "Neg", "negation"),)
ALL_CONDITIONS: tuple[Condition, ...] = CONDITIONS + EXTRA_CONDITIONS
CONDITION_BY_SLUG: dict[str, Condition] = {c.slug: c for c in ALL_CONDITIONS}
GROUPS: tuple[str, ...] = ("entity", "relation")


class Protocol(StrEnum):
    """How the items are chosen from the units (docs/evaluation.md, "Protocols")."""

    PAPER = "paper"  # the authors' builder, item for item (kargibora/CS-CLIP@2325a1c)
    CSCLIP = "csclip"  # ours: every caption's pairs and foils, seeded per image


class SkipReason(StrEnum):
    """Why an image yields no item for a condition (counted per (condition, reason))."""

    MISSING_IMAGE = "missing_image"
    NO_ENTITY_PAIR = "no_entity_pair"
    NO_ENTITY_FOIL = "no_entity_foil"
    NO_RANDOM_ENTITY = "no_random_entity"
    NO_RELATION = "no_relation"
    NO_RELATION_WITH_TWO_FOILS = "no_relation_with_two_foils"
    RELATION_LACKS_FOIL = "relation_lacks_foil"
    # paper protocol only
    OVER_NUM_SAMPLES = "over_num_samples"  # the pass had num_samples images before this one
    ANCHOR_NOT_VALID = (
        "anchor_not_valid"  # their scorer drops a sample whose anchor fails is_valid_caption
    )


@dataclass(frozen=True)
class HalfTruthItem:
    """One benchmark row: anchor A, truthful completion A+ and half-truth A- for an image."""

    image_id: str
    sample_id: str
    condition: str  # a Condition slug
    group: str  # "entity" | "relation"
    anchor: str
    completion: str
    half_truth: str
    unit: str = ""  # provenance: the unit the foil edits (B, or the relation "s r o")
    foil: str = ""  # provenance: the foil put in its place (B', X, o', s' or "s r' o")


@dataclass(frozen=True)
class HalfTruthBenchmark:
    """The items plus the accounting: for every condition the protocol builds,
    items + skips == num_images."""

    items: tuple[HalfTruthItem, ...]
    skipped: Mapping[tuple[str, str], int]  # (condition slug, SkipReason) -> images
    num_images: int
    num_records: int
    protocol: str = Protocol.CSCLIP.value
    # The images' bytes (csclip.eval.benchmark_file.images_digest): set for a frozen
    # benchmark file, whose images are checked against it when scored; None for one built
    # from a units table, whose images are that table's.
    images_digest: str | None = None

    def num_skipped(self, condition: str) -> int:
        return sum(n for (slug, _), n in self.skipped.items() if slug == condition)

    @property
    def content_hash(self) -> str:
        return benchmark_hash(self.items, self.protocol, self.images_digest)


def benchmark_hash(items: Sequence[HalfTruthItem], protocol: str,
                   images_digest: str | None = None) -> str:
    """ "sha256:<hex>" of the protocol, every item's fields in order and, when given, the
    digest of the images' bytes. Two benchmarks with the same hash hold the same items.
    With images_digest (a frozen benchmark file, whose images are checked against their
    sha256 when scored) they also score the same image bytes, so any model scores them
    identically (same weights, same scorer); without it the images are whatever the units
    table holds, which the hash does not pin."""
    fields: dict = {"protocol": protocol, "items": [list(astuple(i)) for i in items]}
    if images_digest is not None:
        fields["images"] = images_digest
    payload = json.dumps(fields, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(payload.encode("utf-8")).hexdigest()
