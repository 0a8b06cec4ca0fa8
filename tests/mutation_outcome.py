"""A pytest plugin for tests/test_mutations.py: writes, one JSON line per test phase that
raised, which exception ended it (to the file named by $MUTATION_OUTCOME), so that the
harness can tell a failed assertion from a mutant that made the code raise."""

from __future__ import annotations

import json
import os

from _pytest.outcomes import Failed, Skipped, XFailed


def pytest_runtest_makereport(item, call) -> None:
    if call.excinfo is None or call.excinfo.errisinstance((Skipped, XFailed)):
        return
    error = call.excinfo.value
    record = {"test": item.nodeid, "when": call.when,
              "type": f"{type(error).__module__}.{type(error).__qualname__}",
              # pytest's assertion failures: a failed `assert` (AssertionError, also from
              # pytest.approx) and pytest.fail / pytest.raises' "DID NOT RAISE" (Failed).
              "assertion": call.when == "call" and isinstance(error, (AssertionError, Failed)),
              "message": str(error).splitlines()[0][:300] if str(error) else ""}
    with open(os.environ["MUTATION_OUTCOME"], "a") as handle:
        handle.write(json.dumps(record) + "\n")
