"""docs/quickstart.md cannot drift: every command of its ```bash blocks runs, in the order
the doc gives, in a temporary copy of the checkout (with this interpreter's venv, no new
one), and exits as the doc says: 0, or the code its `# exits N` comment names, with the
error line the doc prints. A block the test does not run carries a marker line just above
its fence, `<!-- quickstart-test: not run: REASON -->`, allowed only for the commands in
NOT_RUN_ALLOWED (the 12-minute demo, the test suite itself, a server, the sweep); each one
is reported as a skipped test with its reason. Also: false claims the docs once made (a
../shared directory, checkpoint paths under runs/demo/, world columns unread, a README that
missed commands) stay gone."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from csclip.config.eval import EvalConfig

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "docs" / "quickstart.md"
MARKER = re.compile(r"^<!--\s*quickstart-test:\s*not run:\s*(?P<reason>.+?)\s*-->$")
EXPECTED_EXIT = re.compile(r"\s#\s*exits\s+(?P<code>\d+)\s*$")
# The commands a block may keep out of the test (by the marker above): each takes
# minutes (the demo, the suite, a sweep) or never ends (a server). Anything else in a
# marked block fails the parse test, so a broken command cannot hide behind a marker.
NOT_RUN_ALLOWED = ("make demo", "make test", "csclip demo ", "csclip ablate ",
                   ".venv/bin/mlflow ui ", "mlflow ui ")
# Every piece of the method the quickstart shows on its own must stay runnable.
RUN_REQUIRED = ("csclip train ", "csclip evaluate ", "csclip extract ", "csclip benchmark build ")


@dataclass(frozen=True)
class Command:
    text: str
    expected: int  # the exit code the doc says
    line: int  # in the doc, 1-based


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence
    commands: tuple[Command, ...]
    not_run: str | None  # the marker's reason, None: the test runs it


def parse_blocks(text: str) -> list[Block]:
    """The ```bash blocks of a markdown text, each with its commands (comment lines and
    blank lines dropped, `\\` continuations joined, a trailing `# exits N` read as the
    expected exit code) and its not-run marker, if the line above its fence has one."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```bash":
            i += 1
            continue
        start = i
        marker = MARKER.match(lines[start - 1].strip()) if start else None
        commands: list[Command] = []
        pending, pending_line = "", 0
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            raw = lines[i].rstrip()
            stripped = raw.strip()
            if not pending and (not stripped or stripped.startswith("#")):
                i += 1
                continue
            if not pending:
                pending_line = i + 1
            if stripped.endswith("\\"):
                pending += stripped[:-1].rstrip() + " "
                i += 1
                continue
            full = pending + stripped
            pending = ""
            found = EXPECTED_EXIT.search(full)
            expected = int(found.group("code")) if found else 0
            commands.append(Command(full[:found.start()].rstrip() if found else full,
                                    expected, pending_line))
            i += 1
        if i >= len(lines):
            raise AssertionError(f"quickstart line {start + 1}: ```bash block never closed")
        blocks.append(Block(start + 1, tuple(commands),
                            marker.group("reason") if marker else None))
        i += 1
    return blocks


def _not_run(blocks: list[Block]) -> list[tuple[Command, str]]:
    return [(c, b.not_run) for b in blocks if b.not_run is not None for c in b.commands]


BLOCKS = parse_blocks(QUICKSTART.read_text())


def test_every_block_is_run_or_marked_and_the_pieces_are_all_run():
    assert BLOCKS, "docs/quickstart.md has no ```bash block"
    for command, reason in _not_run(BLOCKS):
        assert command.text.startswith(NOT_RUN_ALLOWED) or command.text in NOT_RUN_ALLOWED, (
            f"quickstart line {command.line}: `{command.text}` is marked not run ({reason}); "
            f"only {NOT_RUN_ALLOWED} may be: give it tiny settings instead")
    run = [c.text for b in BLOCKS if b.not_run is None for c in b.commands]
    for piece in RUN_REQUIRED:
        assert any(text.startswith(piece) for text in run), f"no `{piece}...` the test runs"
    assert any(c.expected == 2 for b in BLOCKS for c in b.commands)  # a refusal is shown
    # Each marker sits right above a fence: one that does not is a typo the test would
    # not see (and its block would run).
    text = QUICKSTART.read_text().splitlines()
    markers = [n for n, line in enumerate(text) if "quickstart-test" in line]
    assert all(MARKER.match(text[n].strip()) and text[n + 1].strip() == "```bash"
               for n in markers), [text[n] for n in markers]
    assert len(markers) == sum(b.not_run is not None for b in BLOCKS)


def test_the_parser_reads_continuations_expected_codes_and_markers():
    doc = ("text\n```bash\n# a comment\ncsclip train \\\n  --max-steps 2\n\n"
           "csclip train --set x=1   # exits 2\n```\n"
           "<!-- quickstart-test: not run: a server -->\n```bash\nmlflow ui\n```\n"
           "```\nnot bash\n```\n")
    first, second = parse_blocks(doc)
    assert first.commands == (Command("csclip train --max-steps 2", 0, 4),
                              Command("csclip train --set x=1", 2, 7))
    assert first.not_run is None and second.not_run == "a server"
    assert second.commands == (Command("mlflow ui", 0, 11),)


@pytest.mark.parametrize("command,reason", _not_run(BLOCKS),
                         ids=[c.text for c, _ in _not_run(BLOCKS)])
def test_not_run_by_the_quickstart_test(command, reason):
    """Says, in the skip summary (-ra), each command of the doc the test does not run."""
    pytest.skip(f"docs/quickstart.md line {command.line}: `{command.text}` not run: {reason}")


def checkout_copy(target: Path) -> Path:
    """The working tree's files (tracked, and untracked ones git does not ignore) copied
    to `target`: a fresh clone of what is on disk, without venvs, runs or databases."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, capture_output=True, check=True)
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is not there
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def run_commands(blocks: list[Block], doc: str, cwd: Path, env: dict[str, str],
                 timeout: float = 600) -> tuple[list[str], list[str]]:
    """Run each command of the blocks not marked, in order, each in its own bash; return
    (problems, log): a problem for each command whose exit code is not the doc's, or
    that is refused (the doc's code is not 0) with other than one `error:` line that is a
    line of the doc."""
    problems, log = [], []
    shown = {line.strip() for line in doc.splitlines()}  # the doc's lines, each whole
    for block in blocks:
        if block.not_run is not None:
            continue
        for command in block.commands:
            started = time.monotonic()
            done = subprocess.run(["bash", "-c", command.text], cwd=cwd, env=env,
                                  capture_output=True, text=True, timeout=timeout)
            log.append(f"{time.monotonic() - started:5.1f} s  exit {done.returncode}  "
                       f"{command.text}")
            if done.returncode != command.expected:
                tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
                problems.append(f"line {command.line}: `{command.text}` exited "
                                f"{done.returncode}, the doc says {command.expected}:\n{tail}")
            elif command.expected != 0:
                # A refusal is one `error:` line, the one the doc shows.
                errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
                if len(errors) != 1 or errors[0] not in shown:
                    problems.append(f"line {command.line}: `{command.text}` printed "
                                    f"{errors}, not the doc's one error line")
    return problems, log


def test_a_command_that_breaks_fails_the_check(tmp_path):
    doc = ("```bash\ntrue\nfalse\n(echo 'error: shown'; exit 2) >&2   # exits 2\n"
           "exit 3   # exits 2\n(echo 'error: not shown'; exit 2) >&2   # exits 2\n```\n"
           "```\nerror: shown\n```\n")
    problems, log = run_commands(parse_blocks(doc), doc, tmp_path, dict(os.environ))
    assert len(log) == 5
    assert [p.split(":")[0] for p in problems] == ["line 3", "line 5", "line 6"]
    assert "exited 1, the doc says 0" in problems[0] and "exited 3, the doc says 2" in problems[1]
    assert "not the doc's one error line" in problems[2]


@pytest.mark.slow
def test_every_quickstart_command_exits_as_the_doc_says(tmp_path, monkeypatch):
    """The doc's commands with the tiny settings it states, from a copy of the checkout:
    this interpreter's `csclip` and `python` first on the PATH, the copy's csclip imported
    (PYTHONPATH), the default tracking store (./mlflow.db) made empty beforehand from the
    session's migrated template (tests/mlflow_store.py: the store MLflow would create)."""
    from mlflow_store import fresh_store

    checkout = checkout_copy(tmp_path / "csclip")
    monkeypatch.chdir(checkout)
    fresh_store(checkout / "mlflow.db")
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "PYTHONPATH")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(checkout)
    problems, log = run_commands(BLOCKS, QUICKSTART.read_text(), checkout, env)
    skipped = [f"line {c.line}: {c.text} ({reason})" for c, reason in _not_run(BLOCKS)]
    print("quickstart commands run:\n" + "\n".join(log))
    print("not run (marked in the doc):\n" + "\n".join(skipped))
    assert not problems, "\n\n".join(problems)
    # What the doc says the commands leave behind.
    assert (checkout / "runs" / "train" / "quick" / "final" / "model_spec.json").is_file()
    for out in ("eval-quick", "eval-bench"):
        assert (checkout / "runs" / out / "table1.csv").is_file(), out
    assert (checkout / "runs" / "bench-quick.json").is_file()
    assert (checkout / "runs" / "captions" / "units").is_dir()
    # Nothing was written into the real checkout.
    assert not (REPO / "captions.txt").exists()


def test_the_docs_false_claims_about_paths_and_commands_are_gone():
    from csclip import cli
    from csclip.entry import extract

    quickstart = QUICKSTART.read_text()
    # A fresh clone has no ../shared next to it.
    assert "../shared" not in quickstart
    assert "../shared" not in extract.build_parser().format_help()
    # The demo's checkpoints are runs/train/<run>/final, not under runs/demo/.
    assert "runs/demo/csclip/checkpoint_" not in (REPO / "docs" / "evaluation.md").read_text()
    # The world fills every Tables 16-17 column (docs/ablation.md, "The table").
    assert "world columns read —" not in (REPO / "docs" / "ablation.md").read_text()
    # The README names every command.
    readme = (REPO / "README.md").read_text()
    listed = re.search(r"`csclip ([a-z|]+) \.\.\.`", readme)
    assert listed and set(listed.group(1).split("|")) == set(cli.COMMANDS)


def test_the_quickstart_says_how_many_scenes_evaluate_scores():
    quickstart = QUICKSTART.read_text()
    # `csclip evaluate` reads no configs/default.yaml: EvalConfig's world (500 val scenes).
    said = re.search(r"`csclip evaluate` scores the world's ([\d,]+) validation scenes",
                     quickstart.replace("\n", " "))
    assert said and int(said.group(1).replace(",", "")) == EvalConfig().data.world.num_val
    assert "evaluate on 300" not in quickstart.replace("\n", " ")
