"""Gold units, foils and captions of a scene.

Entity units are "[size] color shape" and appear verbatim in the caption (training edits
captions with `caption.replace(entity, foil, 1)`). Relation units are "{subject}
{predicate} {object}" over entity units. Every foil is checked with the oracle
(`Scene.holds`) and kept only when it is false of the scene.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from csclip.config.world import ABOVE, ANTONYMS, BELOW, LEFT, RIGHT, SIZES, WorldConfig
from csclip.units import ChangeType, Foil, Unit
from csclip.world.scene import Scene, SceneObject


@dataclass(frozen=True)
class Described:
    """A scene described in words: the caption, its entity units (in scene-object order)
    and its relation units, all with their foils."""

    caption: str
    entities: tuple[Unit, ...]
    relations: tuple[Unit, ...]
    template: str


def mention(obj: SceneObject, with_size: bool, color: str | None = None,
            shape: str | None = None, size: str | None = None) -> str:
    """The entity text of `obj`, optionally with one attribute replaced (for foils)."""
    words = [size or obj.size] if with_size else []
    return " ".join(words + [color or obj.color, shape or obj.shape])


def entity_foils(obj: SceneObject, with_size: bool, scene: Scene, config: WorldConfig,
                 rng: random.Random) -> tuple[Foil, ...]:
    """Foils of one entity: a color change, a size change (when the size is mentioned) and
    a shape change, each the first candidate (in random order) that the scene makes false."""
    foils: list[Foil] = []
    colors = [c for c in config.colors if c != obj.color]
    for color in rng.sample(colors, len(colors)):
        text = mention(obj, with_size, color=color)
        if not scene.holds(text):
            foils.append(Foil(text, ChangeType.ATTRIBUTE_CHANGE))
            break
    if with_size:
        other = SIZES[1 - SIZES.index(obj.size)]
        text = mention(obj, True, size=other)
        if not scene.holds(text):  # always false while (color, shape) pairs are unique
            foils.append(Foil(text, ChangeType.ATTRIBUTE_CHANGE))
    shapes = [s for s in config.shapes if s != obj.shape]
    for shape in rng.sample(shapes, len(shapes)):
        text = mention(obj, with_size, shape=shape)
        if not scene.holds(text):
            foils.append(Foil(text, ChangeType.OBJECT_CHANGE))
            break
    return tuple(foils)


def negate(predicate: str) -> str:
    """"is left of" -> "is not left of"."""
    return predicate.replace("is ", "is not ", 1)


def relation_unit(subject: Unit, predicate: str, object: Unit, scene: Scene,
                  rng: random.Random) -> Unit:
    """A relation unit with antonym, negation, swap, subject- and object-replace foils,
    each kept only if the scene makes it false."""
    s, o = subject.text, object.text
    candidates = [
        Foil.relation(s, ANTONYMS[predicate], o, ChangeType.ANTONYM),
        Foil.relation(s, negate(predicate), o, ChangeType.NEGATION),
        Foil.relation(o, predicate, s, ChangeType.SUBJECT_OBJECT_SWAP),
    ]
    if subject.foils:
        candidates.append(Foil.relation(rng.choice(subject.foils).text, predicate, o,
                                        ChangeType.SUBJECT_REPLACE))
    if object.foils:
        candidates.append(Foil.relation(s, predicate, rng.choice(object.foils).text,
                                        ChangeType.OBJECT_REPLACE))
    foils = tuple(f for f in candidates if not scene.holds(f.text))
    return Unit.relation(s, predicate, o, foils)


def _pick_relations(scene: Scene, config: WorldConfig,
                    rng: random.Random) -> list[tuple[int, str, int]]:
    """1..max_relations (subject index, predicate, object index) over distinct object pairs.
    Only clear relations: left/right across columns, above/below across rows."""
    objects = scene.objects
    pairs = [(i, j) for i in range(len(objects)) for j in range(i + 1, len(objects))]
    count = min(rng.randint(1, config.max_relations), len(pairs))
    picked = []
    for i, j in rng.sample(pairs, count):
        if rng.random() < 0.5:
            i, j = j, i
        a, b = objects[i], objects[j]
        options = []
        if a.col != b.col:
            options.append(LEFT if a.col < b.col else RIGHT)
        if a.row != b.row:
            options.append(ABOVE if a.row < b.row else BELOW)
        picked.append((i, rng.choice(options), j))  # distinct cells: options is never empty
    return picked


def _article(text: str) -> str:
    return f"an {text}" if text[0] in "aeiou" else f"a {text}"


def _listing(texts: Sequence[str]) -> str:
    items = [_article(t) for t in texts]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


_BARE = {LEFT: "to the left of", RIGHT: "to the right of", ABOVE: "above", BELOW: "below"}
_ITS = {LEFT: "to its left", RIGHT: "to its right", ABOVE: "above it", BELOW: "below it"}


def _relation_clause(s: str, predicate: str, o: str, rng: random.Random) -> str:
    # Several phrasings of one fact; each names both entities verbatim.
    style = rng.randrange(3)
    if style == 0:
        return f"{_article(s)} {predicate} {_article(o)}"
    if style == 1:
        return f"there is {_article(s)} {_BARE[predicate]} {_article(o)}"
    return f"{_article(o)}, with {_article(s)} {_ITS[predicate]}"


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:] + "."


TEMPLATES: tuple[str, ...] = ("listing", "relations_first", "plus")


def compose_caption(entity_texts: Sequence[str], relations: Sequence[tuple[str, str, str]],
                    template: str, rng: random.Random) -> str:
    """A caption naming every entity and stating every relation, in one of TEMPLATES.
    Facts are split into sentences so no phrase reads as a false claim (e.g. "X is left
    of Y and Z" would also claim X is left of Z)."""
    in_relations = {t for s, _, o in relations for t in (s, o)}
    rest = [t for t in entity_texts if t not in in_relations]
    if template == "listing":
        sentences = [f"a scene with {_listing(entity_texts)}"]
        sentences += [f"the {s} {p} the {o}" for s, p, o in relations]
    elif template == "relations_first":
        sentences = [_relation_clause(s, p, o, rng) for s, p, o in relations]
        if rest:
            sentences.append(f"there is also {_listing(rest)}")
    else:
        first = _relation_clause(*relations[0], rng)
        sentences = [first + (f"; plus {_listing(rest)}" if rest else "")]
        sentences += [_relation_clause(s, p, o, rng) for s, p, o in relations[1:]]
    return " ".join(_sentence(s) for s in sentences)


def describe(scene: Scene, config: WorldConfig, rng: random.Random) -> Described:
    """Gold units, foils and a caption for `scene`."""
    entities = []
    for obj in scene.objects:
        with_size = rng.random() < config.size_mention_prob
        entities.append(Unit.entity(mention(obj, with_size),
                                    entity_foils(obj, with_size, scene, config, rng)))
    relations = [relation_unit(entities[i], predicate, entities[j], scene, rng)
                 for i, predicate, j in _pick_relations(scene, config, rng)]
    texts = [e.text for e in entities]
    while True:
        # The first template (in random order) whose caption fits; if none does, state one
        # relation fewer (relation units are what the caption states, so the unit goes too).
        # With one relation left, the shortest caption is kept even if it is too long:
        # every entity must be named.
        options = []
        for template in rng.sample(TEMPLATES, len(TEMPLATES)):
            caption = compose_caption(
                texts, [(r.subject, r.predicate, r.object) for r in relations], template, rng)
            if count_tokens(caption) <= config.max_caption_tokens:
                return Described(caption, tuple(entities), tuple(relations), template)
            options.append((count_tokens(caption), caption, template))
        if len(relations) == 1:
            _, caption, template = min(options)
            return Described(caption, tuple(entities), tuple(relations), template)
        relations.pop()


_TOKEN = re.compile(r"[a-z]+|[^\sa-z]")


def count_tokens(caption: str) -> int:
    """CLIP BPE tokens of a world caption, start and end tokens included: each world word
    and each punctuation mark is one token (checked against open_clip's tokenizer)."""
    return len(_TOKEN.findall(caption.lower())) + 2
