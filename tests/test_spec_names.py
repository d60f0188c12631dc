"""The spec and the protocol module name the same actions (STYLE: keep them in step).

Every state-changing statement of `protocol.py` (each SQL constant that
writes conveyor_job is in `protocol.ACTIONS`) is an action of the TLA+ spec
and of the Promela model, and every action of either model is such a
statement: the parity is exact in both directions, except for the actions
modelled ahead of their statement (below). The mutations that spec/check
applies to the models must still apply (each text to mutate occurs exactly
once) and name properties the configuration checks.
"""

import re
import tomllib
from pathlib import Path

from django_conveyor import protocol

SPEC = Path(__file__).resolve().parent.parent / "spec"

# Modelled ahead of their statement: each name is an action of both models
# already, with the semantics fixed for it (isolated jobs: CLAIM_ISOLATED;
# workflows: UNBLOCK, CANCEL_DEPENDENTS, REBLOCK_DEPENDENTS; flow control:
# CLAIM_LIMITED), and its SQL constant lands in protocol.ACTIONS with the
# branch of its issue. When one lands, remove it from here: a name both in
# protocol.ACTIONS and in this set fails the tests below, so the set only
# shrinks, to empty once every one has landed.
MODELLED_AHEAD: set[str] = set()


def tla_actions() -> set[str]:
    """Operators named in capitals: `NAME(args) ==` at the start of a line."""
    tla = (SPEC / "tla" / "Conveyor.tla").read_text()
    return set(re.findall(r"^([A-Z][A-Z_]+)\([^)]*\)\s*==", tla, flags=re.MULTILINE))


def promela_actions() -> set[str]:
    """Actions are introduced by a comment that starts with the statement's name."""
    pml = (SPEC / "promela" / "conveyor.pml").read_text()
    return set(re.findall(r"/\*\s*([A-Z][A-Z_]{2,})\b", pml))


WRITES_JOBS = re.compile(
    r"\b(UPDATE\s+conveyor_job|INSERT\s+INTO\s+conveyor_job|DELETE\s+FROM\s+conveyor_job)\b",
    re.IGNORECASE,
)


def test_every_statement_is_a_named_sql_constant():
    for name in protocol.ACTIONS:
        assert isinstance(getattr(protocol, name, None), str), f"{name} has no SQL constant"


def test_every_sql_constant_that_writes_jobs_is_an_action():
    """A statement that changes conveyor_job and is not in ACTIONS would escape the parity."""
    writers = {
        name
        for name, value in vars(protocol).items()
        if name.isupper() and isinstance(value, str) and WRITES_JOBS.search(value)
    }
    assert writers, "no statement found: the pattern no longer matches protocol.py"
    unmodelled = writers - set(protocol.ACTIONS) - set(protocol.FORMS)
    assert unmodelled == set(), "statements that write jobs, not in ACTIONS"
    assert set(protocol.FORMS.values()) <= set(protocol.ACTIONS), "a form of no action"


def test_landed_statements_leave_the_modelled_ahead_list():
    landed = MODELLED_AHEAD & set(protocol.ACTIONS)
    assert not landed, f"now in protocol.ACTIONS, remove from MODELLED_AHEAD: {sorted(landed)}"


def test_tla_actions_are_exactly_the_statements():
    actions = tla_actions()
    assert set(protocol.ACTIONS) - actions == set(), "statements missing from Conveyor.tla"
    assert actions - set(protocol.ACTIONS) == MODELLED_AHEAD, "TLA+ actions not statements"


def test_promela_actions_are_exactly_the_statements():
    actions = promela_actions()
    assert set(protocol.ACTIONS) - actions == set(), "statements missing from conveyor.pml"
    assert actions - set(protocol.ACTIONS) == MODELLED_AHEAD, "Promela actions not statements"


def test_every_mutation_still_applies():
    mutations = tomllib.loads((SPEC / "mutations.toml").read_text())["mutation"]
    models = {
        "tla": (SPEC / "tla" / "Conveyor.tla").read_text(),
        "spin": (SPEC / "promela" / "conveyor.pml").read_text(),
    }
    configs = {path.stem: path.read_text() for path in (SPEC / "tla").glob("*.cfg")}
    # The never claims of the Promela model, by name (pan -N name).
    claims = set(re.findall(r"^[A-Z_]+\((\w+),", models["spin"], flags=re.MULTILINE))
    assert len(mutations) >= 8
    for mutation in mutations:
        assert "tla" in mutation, f"{mutation['name']} is not checked by TLC"
        config = mutation["tla"]["config"].removesuffix(".cfg")
        assert config in configs
        checked = set(re.findall(r"^\s+([A-Z]\w+)\s*$", configs[config], flags=re.MULTILINE))
        for prop in mutation["tla"]["expect"] + mutation["tla"].get("check", []):
            assert prop in checked, f"{mutation['name']}: {config} does not check {prop}"
        if "spin" in mutation:
            assert mutation["spin"]["expect"] in claims, f"{mutation['name']}: no such claim"
        for checker, model in models.items():
            for edit in mutation.get(checker, {}).get("edit", []):
                assert model.count(edit["find"]) == 1, f"{mutation['name']} ({checker})"
