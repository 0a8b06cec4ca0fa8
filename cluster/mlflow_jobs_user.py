"""Make (or update) the MLflow user the cluster's jobs log as: not the admin.

Run on the head by cluster.yaml's head_start_ray_commands, in the background, right after
`mlflow server --app-name basic-auth` starts: it waits for the server, then, as the admin,
creates the user `csclip-jobs` with the password of the jobs' secret file (or sets that
password when the user exists). The jobs' rights come from cluster/mlflow_auth.ini's
default_permission (EDIT); the admin's password never leaves the head.

    python mlflow_jobs_user.py URL ADMIN_PASSWORD_FILE JOBS_PASSWORD_FILE SERVER_PID_FILE

Standard library only: the head's image has MLflow, but nothing here needs it.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ADMIN = "csclip"  # cluster/mlflow_auth.ini's admin_username
JOBS_USER = "csclip-jobs"
WAIT_S = 300  # the server's first start migrates its databases


def _call(url: str, method: str, path: str, admin_password: str, body: dict) -> tuple[int, str]:
    token = base64.b64encode(f"{ADMIN}:{admin_password}".encode()).decode()
    request = urllib.request.Request(
        f"{url}/api/2.0/mlflow/users/{path}", data=json.dumps(body).encode(), method=method,
        headers={"Authorization": f"Basic {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def _server_alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text().strip()), 0)
        return True
    except (OSError, ValueError):
        return False


def main(url: str, admin_file: str, jobs_file: str, pid_file: str) -> int:
    admin, password = Path(admin_file).read_text().strip(), Path(jobs_file).read_text().strip()
    body = {"username": JOBS_USER, "password": password}
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if not _server_alive(Path(pid_file)):
            print(f"the MLflow server ({pid_file}) is not running: {JOBS_USER} not made; see "
                  "its server.log", file=sys.stderr)
            return 1
        try:
            status, text = _call(url, "POST", "create", admin, body)
        except (urllib.error.URLError, OSError):  # not listening yet
            time.sleep(2)
            continue
        if status == 200:
            print(f"{JOBS_USER}: created")
            return 0
        if "RESOURCE_ALREADY_EXISTS" in text or "already exists" in text:
            status, text = _call(url, "PATCH", "update-password", admin, body)
            if status == 200:
                print(f"{JOBS_USER}: password set from {jobs_file}")
                return 0
        print(f"{JOBS_USER}: the server answered {status}: {text[:300]}", file=sys.stderr)
        return 1
    print(f"{JOBS_USER}: no answer from {url} in {WAIT_S} s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
