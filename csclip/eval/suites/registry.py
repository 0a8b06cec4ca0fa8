"""The real-data suites by name (`--suite aro,winoground,...`), each found under
<data-root>/<name>/ in its published layout, and the capability table (the paper's
Tables 8-10 grouping) that turns per-subset scores into per-capability averages and the
suite averages of the Tables 16-17 compositional columns."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence

import numpy as np

from csclip.config.eval import BENCHMARK_NAMES, PAPER
from csclip.eval.encoder import Encoder
from csclip.eval.suites.aro import load_aro
from csclip.eval.suites.colorfoil import load_colorfoil
from csclip.eval.suites.core import (
    BenchmarkNotFound,
    Loader,
    SuiteData,
    check_complete,
    evaluate_suite_data,
    join,
)
from csclip.eval.suites.mmvp import load_mmvp
from csclip.eval.suites.negbench import load_negbench
from csclip.eval.suites.pairs import load_cola, load_colorswap
from csclip.eval.suites.probes import load_bla, load_spec, load_svo_probes
from csclip.eval.suites.protocol import load_benchmark
from csclip.eval.suites.sugarcrepe import load_sugarcrepe_suite
from csclip.eval.suites.sugarcrepe_pp import load_sugarcrepe_pp
from csclip.eval.suites.valse import load_valse
from csclip.eval.suites.vismin import load_vismin
from csclip.eval.suites.vl_checklist import load_vl_checklist
from csclip.eval.suites.whatsup import load_whatsup
from csclip.eval.suites.winoground import load_coco_counterfactuals, load_winoground

log = logging.getLogger(__name__)

BENCHMARKS: dict[str, Loader] = {
    "aro": load_aro,
    "bla": load_bla,
    "coco_cf": load_coco_counterfactuals,
    "cola": load_cola,
    "colorswap": load_colorswap,
    "spec": load_spec,
    "sugarcrepe": load_sugarcrepe_suite,
    "sugarcrepe_pp": load_sugarcrepe_pp,
    "svo_probes": load_svo_probes,
    "valse": load_valse,
    "vl_checklist": load_vl_checklist,
    "whatsup": load_whatsup,
    "winoground": load_winoground,
    # The rest of the paper's sixteen (protocol.PAPER_SUITE).
    "colorfoil": load_colorfoil,
    "mmvp": load_mmvp,
    "negbench": load_negbench,
    "vismin": load_vismin,
}
if tuple(sorted(BENCHMARKS)) != BENCHMARK_NAMES:  # the config validates names against it
    raise ImportError("csclip.config.eval.BENCHMARK_NAMES differs from the registry's loaders: "
                      f"{sorted(set(BENCHMARK_NAMES) ^ set(BENCHMARKS))}")

ENTITY, RELATIONAL, BINDING, LINGUISTIC = "entity", "relational", "binding", "linguistic"
CAPABILITIES: tuple[str, ...] = (ENTITY, RELATIONAL, BINDING, LINGUISTIC)

# (benchmark, subset) -> capability. Entity content: which objects, attributes, counts are
# there; relational structure: relations, actions, spatial layout, who does what to whom;
# binding: which attribute goes with which object; linguistic: word order, syntax,
# coreference, negation. The paper's assignment (Tables 9-10) is the CS-CLIP authors'
# experiments/configs/benchmarks.json (subset_capability_map, top level; kargibora/CS-CLIP
# commit 16276c7); SVO-Probes, which the paper does not run, and Winoground's tags, which
# it scores as one "all", are ours. A subset not listed counts toward no capability.
CAPABILITY_OF: dict[tuple[str, str], str] = {
    ("aro", "vg_relation"): RELATIONAL, ("aro", "vg_attribution"): BINDING,
    ("aro", "coco_order"): LINGUISTIC, ("aro", "flickr30k_order"): LINGUISTIC,
    ("bla", "active_passive"): LINGUISTIC, ("bla", "coordination"): LINGUISTIC,
    ("bla", "relative_clause"): LINGUISTIC,
    ("coco_cf", "all"): ENTITY,
    ("cola", "multi_objects"): BINDING,
    ("colorswap", "all"): BINDING,
    ("spec", "absolute_size"): ENTITY, ("spec", "relative_size"): ENTITY,
    ("spec", "absolute_spatial"): RELATIONAL, ("spec", "relative_spatial"): RELATIONAL,
    ("spec", "existence"): ENTITY, ("spec", "count"): ENTITY,
    ("sugarcrepe", "add_att"): ENTITY, ("sugarcrepe", "add_obj"): ENTITY,
    ("sugarcrepe", "replace_att"): ENTITY, ("sugarcrepe", "replace_obj"): ENTITY,
    ("sugarcrepe", "replace_rel"): RELATIONAL, ("sugarcrepe", "swap_obj"): RELATIONAL,
    ("sugarcrepe", "swap_att"): BINDING,
    ("sugarcrepe_pp", "replace_att"): ENTITY, ("sugarcrepe_pp", "replace_obj"): ENTITY,
    ("sugarcrepe_pp", "replace_rel"): RELATIONAL, ("sugarcrepe_pp", "swap_obj"): RELATIONAL,
    ("sugarcrepe_pp", "swap_att"): BINDING,
    ("svo_probes", "subj_neg"): ENTITY, ("svo_probes", "obj_neg"): ENTITY,
    ("svo_probes", "verb_neg"): RELATIONAL,
    ("valse", "existence"): ENTITY, ("valse", "plurals"): ENTITY,
    ("valse", "counting_hard"): ENTITY, ("valse", "counting_small_quant"): ENTITY,
    ("valse", "counting_adversarial"): ENTITY, ("valse", "foil_it"): LINGUISTIC,
    ("valse", "relations"): RELATIONAL, ("valse", "action_replacement"): RELATIONAL,
    ("valse", "actant_swap"): RELATIONAL, ("valse", "coreference_standard"): LINGUISTIC,
    ("valse", "coreference_hard"): LINGUISTIC,
    ("vl_checklist", "object_location"): ENTITY, ("vl_checklist", "object_size"): ENTITY,
    ("vl_checklist", "attribute_action"): ENTITY, ("vl_checklist", "attribute_color"): ENTITY,
    ("vl_checklist", "attribute_material"): ENTITY, ("vl_checklist", "attribute_size"): ENTITY,
    ("vl_checklist", "attribute_state"): ENTITY,
    ("vl_checklist", "relation_action"): RELATIONAL, ("vl_checklist", "relation_spatial"): RELATIONAL,
    ("whatsup", "controlled_a"): RELATIONAL, ("whatsup", "controlled_b"): RELATIONAL,
    ("whatsup", "coco_one"): RELATIONAL, ("whatsup", "coco_two"): RELATIONAL,
    ("whatsup", "vg_one"): RELATIONAL, ("whatsup", "vg_two"): RELATIONAL,
    ("winoground", "object"): BINDING, ("winoground", "relation"): RELATIONAL,
    ("winoground", "both"): RELATIONAL,
    # The paper's other four benchmarks, and the subsets the paper protocol renames.
    ("colorfoil", "all"): ENTITY,
    ("vismin", "object"): ENTITY, ("vismin", "attribute"): ENTITY,
    ("vismin", "relation"): RELATIONAL, ("vismin", "counting"): ENTITY,
    ("vismin", "spatial_relation"): RELATIONAL, ("vismin", "count"): ENTITY,
    ("vismin", "all"): ENTITY,  # the paper's pooled VisMin: three of its four tags are entity
    # MMVP: the official script's categories, then the Type column's (the paper's).
    ("mmvp", "orientation_and_direction"): RELATIONAL,
    ("mmvp", "presence_of_specific_features"): ENTITY, ("mmvp", "state_and_condition"): RELATIONAL,
    ("mmvp", "quantity_and_count"): ENTITY, ("mmvp", "positional_and_relational_context"): RELATIONAL,
    ("mmvp", "color_and_appearance"): ENTITY, ("mmvp", "structural_characteristics"): ENTITY,
    ("mmvp", "texts"): ENTITY, ("mmvp", "viewpoint_and_perspective"): RELATIONAL,
    ("mmvp", "orientation"): RELATIONAL, ("mmvp", "presence"): ENTITY, ("mmvp", "state"): RELATIONAL,
    ("mmvp", "quantity"): ENTITY, ("mmvp", "spatial"): RELATIONAL, ("mmvp", "color"): ENTITY,
    ("mmvp", "structural_character"): ENTITY, ("mmvp", "text"): ENTITY,
    # Camera perspective and text: not in the authors' subset map (they fall back to all
    # of MMVP's tags); ours.
    ("mmvp", "camera_perspective"): RELATIONAL,
    ("negbench", "coco_mcq"): LINGUISTIC, ("negbench", "voc2007_mcq"): LINGUISTIC,
    ("negbench", "msrvtt_mcq"): LINGUISTIC,
    ("valse", "counting"): ENTITY, ("valse", "actions"): RELATIONAL,
    ("valse", "coreference"): LINGUISTIC, ("valse", "noun_phrases"): LINGUISTIC,
}  # fmt: skip

DIRECTIONS: tuple[str, ...] = ("i2t", "t2i", "group")


def capability_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """From `<benchmark>_<subset>_<direction>` and `<benchmark>_<direction>` keys:
    `cap_<capability>_<direction>` (mean over that capability's measured subsets) and
    `suite_<direction>` (mean over the measured benchmarks: the Tables 16-17 compositional
    columns on real data). Only measured averages get a key."""
    out: dict[str, float] = {}
    for direction in DIRECTIONS:
        for capability in CAPABILITIES:
            values = [metrics[f"{b}_{s}_{direction}"] for (b, s), c in CAPABILITY_OF.items()
                      if c == capability and f"{b}_{s}_{direction}" in metrics]
            if values:
                out[f"cap_{capability}_{direction}"] = float(np.mean(values))
        values = [metrics[f"{b}_{direction}"] for b in BENCHMARKS if f"{b}_{direction}" in metrics]
        if values:
            out[f"suite_{direction}"] = float(np.mean(values))
    return out


def load_benchmarks(names: Sequence[str], data_root: str, allow_partial: bool = False,
                    protocol: str = "official") -> dict[str, SuiteData]:
    """Load each named benchmark found under data_root with the protocol's loaders
    (protocol.py), before any encoding: one whose files are not there is skipped with one
    warning line naming what it expects; one whose images are missing or unreadable raises
    IncompleteBenchmark (unless allow_partial)."""
    loaded, missing = load_present_benchmarks(names, data_root, allow_partial, protocol)
    for err in missing.values():
        log.warning("%s; skipped", err)
    return loaded


def load_present_benchmarks(names: Sequence[str], data_root: str, allow_partial: bool = False,
                            protocol: str = "official"
                            ) -> tuple[dict[str, SuiteData], dict[str, BenchmarkNotFound]]:
    """load_benchmarks without the warnings: (the benchmarks found, a BenchmarkNotFound
    per name whose files are not under data_root), for a caller that decides whether
    a missing one is an error (csclip.eval.suites.find_named_suites)."""
    loaded: dict[str, SuiteData] = {}
    missing: dict[str, BenchmarkNotFound] = {}
    for name in names:
        try:
            data = load_benchmark(name, BENCHMARKS[name], data_root, protocol)
        except BenchmarkNotFound as err:
            missing[name] = err
            continue
        # A loader that does not say where it looked or what it expects: its folder and
        # its module's LAYOUT, for the one-line error.
        data.root = data.root or join(data_root, name)
        data.layout = data.layout or getattr(sys.modules.get(BENCHMARKS[name].__module__),
                                             "LAYOUT", "")
        check_complete(data, allow_partial)
        loaded[name] = data
    return loaded, missing


def evaluate_benchmarks(encoder: Encoder, names: Sequence[str], data_root: str,
                        max_per_subset: int | None = None, allow_partial: bool = False,
                        protocol: str = "official",
                        loaded: Mapping[str, SuiteData] | None = None) -> dict[str, float]:
    """Load (load_benchmarks, unless `loaded` holds them already), encode and score each
    named benchmark under data_root with the protocol's scorers, and log its accounting.
    Returns the benchmarks' metrics (per subset: accuracies and read / num / skipped /
    skipped_<reason>) plus the capability and suite averages, and `suite_protocol_paper`
    (1 or 0) saying which protocol scored them (when one ran)."""
    if loaded is None:
        loaded = load_benchmarks(names, data_root, allow_partial, protocol)
    metrics: dict[str, float] = {}
    for data in loaded.values():
        log.info("%s", data.accounting())
        scored, _ = evaluate_suite_data(encoder, data.limit(max_per_subset))
        metrics.update(scored)
    metrics.update(capability_metrics(metrics))
    if metrics:
        metrics["suite_protocol_paper"] = float(protocol == PAPER)
    return metrics
