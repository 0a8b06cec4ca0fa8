"""Empty MLflow sqlite stores for tests, without paying MLflow's schema migrations each time.

A new sqlite store runs every alembic migration of MLflow's schema on first use: seconds
on an idle 2-core machine, tens of seconds under load, once per test that needs a store.
The test session makes one migrated, empty store (a template) and each test gets a copy:
the same real store a fresh one would be (MLflow opens it, checks its schema version and
finds nothing to do). The copy's Default experiment gets the artifact location a fresh
client-side store gives it (./mlruns/0 under the working directory). Not for `mlflow
server`: it makes its Default experiment with its own artifact root (mlflow-artifacts:/).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

# Set by tests/conftest.py for the session.
TEMPLATE_ENV = "CSCLIP_TEST_MLFLOW_TEMPLATE"


def _make_template(template: Path) -> None:
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    template.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(suffix=".db", dir=template.parent)
    os.close(fd)
    os.unlink(staging)  # MLflow creates the file itself
    store = SqlAlchemyStore(f"sqlite:///{staging}", str(template.parent / "mlruns"))
    store.engine.dispose()
    os.replace(staging, template)  # atomic: a concurrent user sees all of it or nothing


def fresh_store(path: Path) -> Path:
    """An empty, migrated MLflow sqlite database at `path` (a copy of the session's template)
    when the session has a template; otherwise nothing is written and MLflow makes the store
    itself on first use."""
    template = os.environ.get(TEMPLATE_ENV)
    if template:
        template_path = Path(template)
        if not template_path.exists():
            _make_template(template_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template_path, path)
        with sqlite3.connect(path) as db:  # as MLflow resolves its default root, ./mlruns
            db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                       (str(Path.cwd() / "mlruns" / "0"),))
        db.close()
    return path
