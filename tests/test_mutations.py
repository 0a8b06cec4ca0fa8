"""Tests that once passed with their feature removed, kept honest: each case removes the
feature from a copy of the code and runs the test that guards it, which must then fail on
its assertion. A test that still passes, fails to import, or fails because the mutant made
the code raise (a NameError, TypeError, ... rather than a failed assertion) is reported as
such and fails the case: a raising mutant shows the code broke, not that the test checks
the feature (tests/mutation_outcome.py records which exception ended the test).

A case whose line is no longer in the source fails with the line it looked for: move the
mutation with the code it breaks, never delete it to get a green run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    file: str    # relative to the repository root
    line: str    # replaced: must occur exactly once in the file
    mutant: str
    test: str    # the pytest node id that must fail on the mutant


MUTATIONS = {
    # The guard beyond the authors': a relation foil that is another relation of the same
    # sample is true of the image, so it is no foil.
    "true_relation_kept_as_foil": Mutation(
        "csclip/train/sampling.py",
        "    forbidden = [r.text for r in record.relations if r is not relation]\n"
        "    candidates = _stored_candidates(",
        "    forbidden = []\n    candidates = _stored_candidates(",
        "tests/test_sampling.py::test_relation_foil_that_is_another_true_relation_is_dropped"),
    # Python's hash() is salted per process: draws seeded with it differ between Ray
    # Data's worker processes (the test compares processes, not two calls in one).
    "draws_seeded_by_salted_hash": Mutation(
        "csclip/train/sampling.py",
        'return random.Random(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big"))',
        "return random.Random(hash(key))",
        "tests/test_sampling.py::test_texts_are_the_same_in_another_process_and_under_another_hash_seed"),
    # ARO's fourth order foil moves whole trigrams; shuffling inside them again is the
    # third foil twice (the test checks the official perturbations, not the function
    # against itself).
    "aro_trigrams_not_moved": Mutation(
        "csclip/eval/suites/aro.py",
        "reordered = shuffle_trigrams(tokens, rng)",
        "reordered = shuffle_within_trigrams(tokens, rng)",
        "tests/test_suites_benchmarks.py::test_aro_order_foils_follow_the_official_four_perturbations"),
    # A layout head that cannot see the image: "absent" is right for most kinds, so only
    # a loss below the best image-blind head shows that the tower learned.
    "layout_head_blind_to_the_image": Mutation(
        "csclip/train/warm_start.py",
        "return getattr(model, HEAD)(model.visual(images)), None, model.logit_scale.exp()",
        "return getattr(model, HEAD)(0 * model.visual(images)), None, model.logit_scale.exp()",
        "tests/test_warm_start.py::test_the_layout_objective_trains_the_image_tower_only_through_the_one_step"),
    # The rules backend: what a caption says is absent ("without a rainbow umbrella") is cut
    # out before reading, so it never becomes a unit or a relation's argument.
    "absence_after_without_read_as_present": Mutation(
        "csclip/extract/rules/absence.py",
        "            span = _cut_after_without(tokens, i, absent)\n",
        "            span = None\n",
        "tests/test_rules.py::test_absence_reads_the_rest_as_if_it_were_not_written"),
    # The half-truth builder: a +Rand entity X drawn from another image that may describe
    # this image's own entities ("circle" for a red circle) would be true, so it is drawn
    # again.
    "rand_entity_that_may_hold_kept": Mutation(
        "csclip/eval/halftruth/construction.py",
        "        if source != image_id and not entity_may_hold(text, image_entities):",
        "        if source != image_id:",
        "tests/test_halftruth.py::test_random_entity_that_may_hold_is_drawn_again"),
    # The metrics: the bootstrap interval is a 95% one (a 90% one is narrower, and looks
    # just as plausible).
    "bootstrap_ci_at_90_percent": Mutation(
        "csclip/eval/halftruth/metrics.py",
        "seed: int = 0, level: float = 0.95",
        "seed: int = 0, level: float = 0.90",
        "tests/test_halftruth.py::test_bootstrap_ci_is_a_95_percent_interval"),
    # The ablation report's plot: its curves, not only a PNG.
    "ablation_plot_without_points": Mutation(
        "csclip/ablation/report.py",
        "panel.plot(xs, [math.nan if y is None else y for y in ys], marker=marker, label=name)",
        "panel.plot([], [], marker=marker, label=name)",
        "tests/test_ablation.py::test_report_files_and_plot"),
    # The loss: a sample without units is no column of L_unit for the others (its unit
    # text is a placeholder).
    "masked_unit_scored_as_a_negative": Mutation(
        "csclip/loss.py",
        "    unit_scores = unit_scores.masked_fill(~valid_pair, _NEVER)\n",
        "",
        "tests/test_loss.py::test_masked_sample_is_neither_row_nor_negative"),
    # The training loop's schedule: the authors' scheduler is stepped once per epoch, so
    # their run stays near a tenth of lr throughout (SPEC §6), not warmed up per step.
    "authors_schedule_stepped_per_step": Mutation(
        "csclip/train/optim.py",
        'position = step if optim.schedule == "cosine" else step // max(1, steps_per_epoch)',
        "position = step",
        "tests/test_optim.py::test_authors_run_stays_near_a_tenth_of_lr_throughout"),
}


def mutated_copy(mutation: Mutation, destination: Path) -> Path:
    """The package, the tests and the pytest settings copied to `destination`, with the
    mutation applied."""
    for folder in ("csclip", "tests"):
        shutil.copytree(REPO_ROOT / folder, destination / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", destination)
    target = destination / mutation.file
    source = target.read_text()
    count = source.count(mutation.line)
    if count != 1:
        pytest.fail(f"{mutation.file} holds {count} copies of the line to mutate (wanted 1); "
                    f"move the mutation with the code:\n{mutation.line}")
    target.write_text(source.replace(mutation.line, mutation.mutant))
    return destination


def run_recorded(test: str, cwd: Path, path: list[Path], outcome: Path) -> tuple[int, str]:
    """Run one pytest node id in a fresh process, with `path` first on PYTHONPATH and
    tests/mutation_outcome.py recording to `outcome` what ended it; (exit code, output)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path)),
           "MUTATION_OUTCOME": str(outcome)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         "-p", "mutation_outcome", test],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def caught_by_an_assertion(outcome: Path) -> tuple[bool, str]:
    """Whether the recorded test failed on a failed assertion only (an AssertionError, or
    pytest's Failed from pytest.fail and pytest.raises), and what ended it."""
    records = ([json.loads(line) for line in outcome.read_text().splitlines()]
               if outcome.exists() else [])
    if not records:
        return False, "no test phase raised"
    described = "; ".join(f"{r['when']}: {r['type']}: {r['message']}" for r in records)
    return all(r["assertion"] for r in records), described


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_the_guarding_test_fails_on_the_mutant(name, tmp_path):
    mutation = MUTATIONS[name]
    root = mutated_copy(mutation, tmp_path / "copy")
    outcome = tmp_path / "outcome.jsonl"
    # The copy first on the path: its csclip shadows the checkout's editable install; its
    # tests/ holds the plugin.
    code, output = run_recorded(mutation.test, root, [root, root / "tests"], outcome)
    # Exit code 1: tests ran and one failed. 0 would be the mutant passing; 2-4 a
    # collection or usage error, which proves nothing about the test.
    assert code == 1, f"{mutation.test} on the mutant:\n{output[-3000:]}"
    assert "1 failed" in output and "error" not in output.splitlines()[-1], output[-3000:]
    # The failure must be the test's assertion, not an exception the mutant raised.
    caught, how = caught_by_an_assertion(outcome)
    assert caught, f"{name}: mutant raised, not caught by an assertion ({how})"
    # And the code that failed was the copy's: its module is imported from there.
    module = mutation.file.removesuffix(".py").replace("/", ".")
    where = subprocess.run([sys.executable, "-c", f"import {module} as m; print(m.__file__)"],
                           cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                           capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()) == root / mutation.file


def test_a_raising_mutant_is_told_from_a_failed_assertion(tmp_path):
    (tmp_path / "test_cases.py").write_text(
        "import pytest\n\n"
        "def test_assertion():\n    assert 1 + 1 == 3\n\n"
        "def test_did_not_raise():\n    with pytest.raises(ValueError):\n        pass\n\n"
        "def test_name_error():\n    undefined_name\n\n"
        "def test_type_error():\n    len(1)\n")
    expected = {"test_assertion": True, "test_did_not_raise": True,
                "test_name_error": False, "test_type_error": False}
    for test, caught_expected in expected.items():
        outcome = tmp_path / f"{test}.jsonl"
        code, output = run_recorded(f"test_cases.py::{test}", tmp_path, [REPO_ROOT / "tests"],
                                    outcome)
        assert code == 1, output[-2000:]
        caught, how = caught_by_an_assertion(outcome)
        assert caught is caught_expected, (test, how)
    assert "builtins.TypeError" in how
