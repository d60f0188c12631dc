# shellcheck shell=bash
# Shared setup for scripts/demo, scripts/test and .ci/run.  Source it, then
# call `conveyor_setup`; afterwards these are set:
#
#   CONVEYOR_ROOT     the repository root (every command runs from there)
#   CONVEYOR_PYVER    "3.12", "3.11", ...
#   CONVEYOR_VENV     the virtualenv folder (.venv-<pyver> in the root)
#   CONVEYOR_VENV_PY  its python
#   CONVEYOR_DATA_DIR the embedded PostgreSQL data folder (exported; only
#                     used when DATABASE_URL is not set)
#
# Which Python: $CONVEYOR_PYTHON (a path, a command or a version such as
# "3.11") if set; otherwise 3.12 (the primary line: Django 6.1, and pgserver
# has wheels for it), then a newer python3 when a local PostgreSQL or
# DATABASE_URL exists (pgserver has no wheels past 3.12), then 3.11 with
# Django 5.2 LTS and the django-tasks backport.
#
# Re-runs are fast: the install is skipped while the venv's stamp file is
# newer than pyproject.toml and records the same install command.

CONVEYOR_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

conveyor_say() { printf 'conveyor: %s\n' "$*" >&2; }
conveyor_die() { printf 'conveyor: error: %s\n' "$*" >&2; exit 1; }

# Print "X.Y" for a working interpreter, nothing for a broken one (pyenv shims
# for a version that is not selected exist on PATH but fail when run).
conveyor_py_version() {
    "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null
}

# True when $1 is Python $2 and can make a virtualenv (Debian splits venv off).
conveyor_py_usable() {
    [ "$(conveyor_py_version "$1")" = "$2" ] && "$1" -c 'import venv, ensurepip' 2>/dev/null
}

# Print the path of a working Python X.Y, or fail.  An existing venv for X.Y
# answers first: finding the base interpreter (pyenv shims) is slow.
conveyor_find_python_version() {
    local want="$1" cand v
    cand="$CONVEYOR_ROOT/.venv-$want/bin/python"
    if [ -f "$CONVEYOR_ROOT/.venv-$want/.conveyor-installed" ] \
        && [ "$(conveyor_py_version "$cand")" = "$want" ]; then
        printf '%s\n' "$cand"
        return 0
    fi
    for cand in "python$want" python3 python; do
        if command -v "$cand" >/dev/null 2>&1 && conveyor_py_usable "$cand" "$want"; then
            "$cand" -c 'import sys; print(sys.executable)'
            return 0
        fi
    done
    if command -v pyenv >/dev/null 2>&1; then
        for v in $(pyenv versions --bare 2>/dev/null | grep -E "^$want(\.[0-9]+)?\$" | sort -rV); do
            cand="$(PYENV_VERSION="$v" pyenv which "python$want" 2>/dev/null)" || continue
            if [ -n "$cand" ] && conveyor_py_usable "$cand" "$want"; then
                printf '%s\n' "$cand"
                return 0
            fi
        done
    fi
    return 1
}

# True when PostgreSQL server binaries are on this machine (the embedded
# database can then run without pgserver, e.g. on Python 3.13+).
conveyor_have_local_pg() {
    local bindir d
    command -v pg_ctl >/dev/null 2>&1 && return 0
    if command -v pg_config >/dev/null 2>&1; then
        bindir="$(pg_config --bindir 2>/dev/null)"
        [ -n "$bindir" ] && [ -x "$bindir/pg_ctl" ] && return 0
    fi
    for d in /usr/lib/postgresql/*/bin; do
        [ -x "$d/pg_ctl" ] && return 0
    done
    return 1
}

# Sets CONVEYOR_PY_PATH and CONVEYOR_PYVER.
conveyor_pick_python() {
    local choice="${CONVEYOR_PYTHON:-}" path="" ver=""
    if [ -n "$choice" ]; then
        if [[ "$choice" =~ ^[0-9]+\.[0-9]+$ ]]; then
            path="$(conveyor_find_python_version "$choice")" \
                || conveyor_die "CONVEYOR_PYTHON=$choice: no working Python $choice found (PATH, pyenv)"
        elif command -v "$choice" >/dev/null 2>&1; then
            path="$(command -v "$choice")"
        else
            conveyor_die "CONVEYOR_PYTHON=$choice: not a version (like 3.11) nor an executable"
        fi
    elif path="$(conveyor_find_python_version 3.12)"; then
        :
    else
        path=""
        local v3
        v3="$(conveyor_py_version python3 || true)"
        if [ -n "$v3" ] && [ "${v3#3.}" -ge 13 ] 2>/dev/null; then
            if [ -n "${DATABASE_URL:-}" ] || conveyor_have_local_pg; then
                path="$(python3 -c 'import sys; print(sys.executable)')"
            else
                conveyor_say "python3 is $v3, but pgserver has no wheels for it and no PostgreSQL binaries or DATABASE_URL exist; looking for 3.11"
            fi
        fi
        if [ -z "$path" ]; then
            path="$(conveyor_find_python_version 3.11)" \
                || conveyor_die "no suitable Python found: install Python 3.12 (preferred) or 3.11, or set CONVEYOR_PYTHON"
        fi
    fi
    ver="$(conveyor_py_version "$path")" || true
    [ -n "$ver" ] || conveyor_die "$path does not run"
    [ "${ver#3.}" -ge 11 ] 2>/dev/null || conveyor_die "$path is Python $ver; django-conveyor needs 3.11+"
    CONVEYOR_PY_PATH="$path"
    CONVEYOR_PYVER="$ver"
}

# The requirements for a Python version: Django 6.1 on 3.12+, Django 5.2 LTS
# with the django-tasks backport on 3.11.  Sets the array CONVEYOR_REQS.
conveyor_requirements() {
    CONVEYOR_REQS=(-e ".[test,embedded]")
    if [ "$1" = "3.11" ]; then
        CONVEYOR_REQS+=("Django>=5.2,<5.3" "django-tasks>=0.12")
    else
        CONVEYOR_REQS+=("Django>=6.1,<6.2")
    fi
}

# True when the venv imports Django and this checkout's django_conveyor as a
# regular package (an editable install made while the package was incomplete,
# or from another checkout, maps it elsewhere or as a namespace package).
conveyor_venv_ok() {
    (cd / && "$CONVEYOR_VENV_PY" -c 'import sys, django, django_conveyor as m
sys.exit(not (m.__file__ or "").startswith(sys.argv[1]))' "$CONVEYOR_ROOT/") >/dev/null 2>&1
}

conveyor_setup() {
    conveyor_pick_python
    CONVEYOR_VENV="$CONVEYOR_ROOT/.venv-$CONVEYOR_PYVER"
    CONVEYOR_VENV_PY="$CONVEYOR_VENV/bin/python"
    local stamp cmd
    conveyor_requirements "$CONVEYOR_PYVER"
    cmd="pip install ${CONVEYOR_REQS[*]}"
    stamp="$CONVEYOR_VENV/.conveyor-installed"

    # A venv whose base interpreter went away (pyenv uninstall) is rebuilt.
    if [ -d "$CONVEYOR_VENV" ] && ! "$CONVEYOR_VENV_PY" -c '' >/dev/null 2>&1; then
        conveyor_say "rebuilding broken virtualenv $CONVEYOR_VENV"
        rm -rf "$CONVEYOR_VENV"
    fi
    if [ ! -x "$CONVEYOR_VENV_PY" ]; then
        conveyor_say "creating virtualenv .venv-$CONVEYOR_PYVER with $CONVEYOR_PY_PATH"
        "$CONVEYOR_PY_PATH" -m venv "$CONVEYOR_VENV" \
            || conveyor_die "could not create a virtualenv (on Debian/Ubuntu: apt-get install python3-venv)"
    fi
    if [ -f "$stamp" ] && [ "$stamp" -nt "$CONVEYOR_ROOT/pyproject.toml" ] \
        && [ "$(cat "$stamp")" = "$cmd" ] && conveyor_venv_ok; then
        :
    else
        conveyor_say "installing: $cmd (about a minute, once)"
        local t0=$SECONDS
        rm -f "$stamp"
        (cd "$CONVEYOR_ROOT" && "$CONVEYOR_VENV_PY" -m pip install -q "${CONVEYOR_REQS[@]}") \
            || conveyor_die "pip install failed"
        conveyor_venv_ok || conveyor_die "django_conveyor does not import from $CONVEYOR_ROOT after install"
        printf '%s\n' "$cmd" >"$stamp"
        conveyor_say "installed in $((SECONDS - t0))s"
    fi

    local versions
    versions="$("$CONVEYOR_VENV_PY" -c 'import sys, django
print("Python %s, Django %s" % (sys.version.split()[0], django.get_version()))' 2>/dev/null)" \
        || conveyor_die "Django does not import in $CONVEYOR_VENV"
    conveyor_say "$versions (venv .venv-$CONVEYOR_PYVER)"

    export CONVEYOR_DATA_DIR="${CONVEYOR_DATA_DIR:-$CONVEYOR_ROOT/var/pg-$CONVEYOR_PYVER}"
    if [ -n "${DATABASE_URL:-}" ]; then
        conveyor_say "database: DATABASE_URL from the environment"
    else
        conveyor_say "database: embedded PostgreSQL in ${CONVEYOR_DATA_DIR#"$CONVEYOR_ROOT"/}"
    fi
}
