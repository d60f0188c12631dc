"""Per-system virtual environments under var/bench/venvs/<name>.

The parent process needs only the standard library; every system (and the
plotter) gets its own interpreter so peers never meet the package's deps.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

DJANGO = "Django==6.1.3"
PSYCOPG = "psycopg[binary,pool]==3.3.9"


@dataclass(frozen=True)
class EnvSpec:
    name: str
    requirements: tuple[str, ...]
    # distribution whose version is reported as "the system's version"
    dist: str
    editable_repo: bool = False


def specs(repo: Path) -> dict[str, EnvSpec]:
    return {
        "conveyor": EnvSpec("conveyor", (DJANGO, PSYCOPG), "django-conveyor", editable_repo=True),
        "procrastinate": EnvSpec(
            "procrastinate", ("procrastinate==3.10.0", PSYCOPG), "procrastinate"
        ),
        "pgqueuer": EnvSpec("pgqueuer", ("pgqueuer[asyncpg]==1.6.0", PSYCOPG), "pgqueuer"),
        "chancy": EnvSpec("chancy", ("chancy==0.26.0", PSYCOPG), "chancy"),
        "django-tasks-db": EnvSpec(
            "django-tasks-db", ("django-tasks-db==0.13.0", DJANGO, PSYCOPG), "django-tasks-db"
        ),
        "django-ox": EnvSpec("django-ox", ("django-ox==1.9.1", DJANGO, PSYCOPG), "django-ox"),
        "celery": EnvSpec("celery", ("celery[redis]==5.7.0",), "celery"),
        "_plot": EnvSpec("_plot", ("matplotlib==3.11.2",), "matplotlib"),
        "_tools": EnvSpec("_tools", ("py-spy==0.4.3",), "py-spy"),
    }


def find_python312() -> str:
    """A Python 3.12 interpreter: pyenv's 3.12.1, else python3.12 on PATH."""
    env = dict(os.environ, PYENV_VERSION="3.12.1")
    if shutil.which("pyenv"):
        out = subprocess.run(
            ["pyenv", "which", "python3.12"], env=env, capture_output=True, text=True
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    found = shutil.which("python3.12")
    if found:
        return found
    if sys.version_info[:2] == (3, 12):
        return sys.executable
    raise RuntimeError("Python 3.12 not found (tried pyenv 3.12.1 and python3.12 on PATH)")


def venv_python(root: Path, name: str) -> Path:
    return root / name / "bin" / "python"


def _stamp(spec: EnvSpec, repo: Path) -> str:
    blob = json.dumps([spec.requirements, spec.editable_repo, str(repo)])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def ensure_venv(spec: EnvSpec, root: Path, repo: Path, log: Path) -> Path:
    """Create (or reuse) the venv for spec; returns its python. Raises on failure."""
    target = root / spec.name
    py = venv_python(root, spec.name)
    stamp_file = target / ".bench-stamp"
    stamp = _stamp(spec, repo)
    if py.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        return py
    if target.exists():
        shutil.rmtree(target)
    root.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        subprocess.run(
            [find_python312(), "-m", "venv", str(target)],
            check=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        reqs = list(spec.requirements)
        if spec.editable_repo:
            reqs += ["-e", f"{repo}[binary]"]
        subprocess.run(pip + reqs, check=True, stdout=out, stderr=subprocess.STDOUT)
    stamp_file.write_text(stamp)
    return py


def dist_version(py: Path, dist: str) -> str | None:
    code = (
        "import importlib.metadata as m, sys\n"
        "try: print(m.version(sys.argv[1]))\n"
        "except Exception: print('')\n"
    )
    out = subprocess.run([str(py), "-c", code, dist], capture_output=True, text=True)
    return out.stdout.strip() or None
