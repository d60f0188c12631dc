"""The README's "Use it in your own project", followed literally in a new project.

The steps are the README's own code blocks, each marked by the comment
`<!-- new-project: ACTION [ARGUMENT] -->` on the line before it, taken in
the README's order:

- `install`: the pip command (not run: the package is installed already; it
  must name every package the settings import);
- `settings`: appended to the new project's settings.py;
- `file PATH`: written to PATH in the project;
- `run`: each `$ ` line run by bash in the project folder, with this
  virtualenv's `python` first on PATH;
- `shell`: run by `python manage.py shell -c`; each `print(...)  # TEXT`
  line must print TEXT.

The project is made by `django-admin startproject`, and reaches the suite's
PostgreSQL through `DATABASE_URL`, in a database of its own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import REPO, scratch_database

PROJECT = "mysite"
DATABASE = "conveyor_readme_project"
STEP = re.compile(
    r"^<!-- new-project: (?P<action>[\w-]+)(?: (?P<arg>\S+))? -->\n"
    r"```(?P<lang>\w+)\n(?P<code>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)
EXPECTED_OUTPUT = re.compile(r"^print\(.*\)\s+# (?P<text>.+)$", re.MULTILINE)
COMMAND_TIMEOUT_SECONDS = 180


@dataclass(frozen=True, slots=True)
class Step:
    action: str
    arg: str | None
    lang: str
    code: str


def readme_steps() -> list[Step]:
    text = (REPO / "README.md").read_text()
    return [Step(m["action"], m["arg"], m["lang"], m["code"]) for m in STEP.finditer(text)]


def test_the_readme_marks_every_step_of_a_new_project():
    steps = readme_steps()
    actions = [s.action for s in steps]
    assert {"install", "settings", "file", "run", "shell"} <= set(actions), actions
    assert set(actions) <= {"install", "settings", "file", "run", "shell"}, actions
    assert all(s.lang == ("console" if s.action in ("install", "run") else "python") for s in steps)
    # The settings import django-environ: the install line must name it.
    (install,) = [s for s in steps if s.action == "install"]
    assert "import environ" in "".join(s.code for s in steps if s.action == "settings")
    assert "django-environ" in install.code
    assert any(EXPECTED_OUTPUT.search(s.code) for s in steps if s.action == "shell")


def run(command: list[str] | str, cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(
        command,
        shell=isinstance(command, str),
        executable="/bin/bash" if isinstance(command, str) else None,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_SECONDS,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{command!r} exited {proc.returncode}:\n{output}"
    return proc.stdout


@pytest.mark.slow
def test_a_new_project_follows_the_readme(tmp_path):
    bin_dir = Path(sys.executable).parent
    root = tmp_path / PROJECT
    root.mkdir()
    with scratch_database(DATABASE) as url:
        # Nothing of the suite's own configuration leaks in: a new project.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CONVEYOR_"))}
        env.update(
            DATABASE_URL=url,
            PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
            PYTHONUNBUFFERED="1",
        )
        env.pop("PYTHONPATH", None)
        run([str(bin_dir / "django-admin"), "startproject", PROJECT, str(root)], root, env)
        settings = root / PROJECT / "settings.py"
        printed: list[str] = []
        for step in readme_steps():
            if step.action == "settings":
                settings.write_text(settings.read_text() + "\n" + step.code)
            elif step.action == "file":
                assert step.arg
                (root / step.arg).parent.mkdir(parents=True, exist_ok=True)
                (root / step.arg).write_text(step.code)
            elif step.action == "run":
                for line in step.code.splitlines():
                    if line.startswith("$ "):
                        run(line[2:], root, env)
            elif step.action == "shell":
                out = run([sys.executable, "manage.py", "shell", "-c", step.code], root, env)
                lines = [line.strip() for line in out.splitlines()]
                for expected in EXPECTED_OUTPUT.findall(step.code):
                    assert expected in lines, f"expected {expected!r} in the output:\n{out}"
                    printed.append(expected)
    assert printed[-1].startswith("SUCCESSFUL ")  # the last snippet reads the finished job


@pytest.mark.slow
def test_a_new_shell_without_database_url_finds_the_embedded_server(tmp_path):
    """The README's settings start (or find) the embedded PostgreSQL: no export, no traceback."""
    bin_dir = Path(sys.executable).parent
    root = tmp_path / PROJECT
    root.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CONVEYOR_"))}
    env.pop("DATABASE_URL", None)
    env.pop("PYTHONPATH", None)
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1")
    run([str(bin_dir / "django-admin"), "startproject", PROJECT, str(root)], root, env)
    settings = root / PROJECT / "settings.py"
    (code,) = [s.code for s in readme_steps() if s.action == "settings"]
    settings.write_text(settings.read_text() + "\n" + code)
    try:
        for _ in range(2):  # Starts it, then finds it running: two shells.
            out = run(
                [sys.executable, "manage.py", "shell", "-c",
                 "from django.db import connection; print(connection.vendor,"
                 " connection.settings_dict['HOST'])"],
                root, env,
            )  # fmt: skip
            last = out.strip().splitlines()[-1]  # After the shell's own banner, if any.
            assert last.split() == ["postgresql", str(root / "var" / "pg")], out
    finally:
        run([sys.executable, "-m", "django_conveyor.embedded", "stop", "var/pg"], root, env)
