"""Which scorer a real-data benchmark is read and scored with (`suites.protocol`):

- "official" (the default): each benchmark's own code, as its repository computes it;
- "paper": the CS-CLIP authors' evaluation code (kargibora/CS-CLIP, data_loading/*.py),
  which the paper's suite average comes from.

`load_benchmark(name, loader, root, protocol)` returns a benchmark's items and scorer for
either one; `PAPER_SUITE` is the paper's sixteen benchmarks (`--suite paper`). Where the
two protocols differ, per benchmark, is in docs/evaluation.md ("Scorers and
protocols")."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from csclip.config.eval import PAPER, PROTOCOLS
from csclip.eval.suites.core import SuiteData, TextChoice

# VALSE's eleven files -> the Hugging Face release's seven phenomena (the CS-CLIP
# authors' subsets); the pieces of a phenomenon are pooled.
VALSE_PHENOMENA: dict[str, str] = {
    "existence": "existence", "plurals": "plurals",
    "counting_hard": "counting", "counting_small_quant": "counting",
    "counting_adversarial": "counting", "relations": "relations",
    "action_replacement": "actions", "actant_swap": "actions",
    "coreference_standard": "coreference", "coreference_hard": "coreference",
    "foil_it": "noun_phrases",
}  # fmt: skip


def valse_paper(data: SuiteData) -> SuiteData:
    """VALSE pooled into its seven phenomena (existence, plurals, counting, relations,
    actions, coreference, noun_phrases), each item scored as before (strict)."""
    out = replace(data, text_choices=[replace(i, subset=VALSE_PHENOMENA.get(i.subset, i.subset))
                                      for i in data.text_choices], skip_counts={})
    for (subset, reason), count in data.skip_counts.items():
        out.skip(VALSE_PHENOMENA.get(subset, subset), count, reason)
    return out


def bla_paper(data: SuiteData) -> SuiteData:
    """BLA as the CS-CLIP authors score it: True1 vs False1 and True2 vs False2 are two
    items, each right when the true sentence scores strictly above the false one."""
    choices = []
    for item in data.text_choices:
        true1, true2, false1, false2 = item.texts
        choices += [TextChoice(item.subset, item.image, (true1, false1), (0,), item.category),
                    TextChoice(item.subset, item.image, (true2, false2), (0,), item.category)]
    return replace(data, text_choices=choices, scorer=None, tie_rule="strict")


def svo_paper(data: SuiteData) -> SuiteData:
    """SVO-Probes as the CS-CLIP authors score it: the sentence must score its positive
    image strictly above the negative one (T2I)."""
    return replace(data, scorer=None, tie_rule="strict")


def spec_paper(data: SuiteData) -> SuiteData:
    """SPEC as the CS-CLIP authors run it (their SPEC_I2T): image-to-text only, right when
    the true text scores strictly above each other candidate (a tie is wrong)."""
    return replace(data, image_choices=[], tie_rule="strict")


# Benchmarks whose loader reads differently under the paper protocol (takes `protocol`).
_PROTOCOL_LOADERS = frozenset({"aro", "vl_checklist", "vismin", "colorfoil", "mmvp", "negbench"})
# Benchmarks whose items are rescored under the paper protocol.
PAPER_TRANSFORMS: Mapping[str, Callable[[SuiteData], SuiteData]] = {
    "valse": valse_paper, "bla": bla_paper, "svo_probes": svo_paper, "spec": spec_paper,
}


def load_benchmark(name: str, loader: Callable[..., SuiteData], data_root: str,
                   protocol: str = "official") -> SuiteData:
    """`loader`'s benchmark read and set up for `protocol`."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; choose from {', '.join(PROTOCOLS)}")
    data = loader(data_root, protocol=protocol) if name in _PROTOCOL_LOADERS else loader(data_root)
    if protocol == PAPER and name in PAPER_TRANSFORMS:
        data = PAPER_TRANSFORMS[name](data)
    return data


