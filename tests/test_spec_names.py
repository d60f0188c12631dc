"""The spec and the protocol module name the same actions (STYLE: keep them in step)."""

import re
from pathlib import Path

from django_conveyor import protocol

SPEC = Path(__file__).resolve().parent.parent / "spec"
MODELLED = {"ENQUEUE", "CLAIM", "HEARTBEAT", "COMPLETE", "RETRY", "FAIL", "RELEASE", "REAP"}


def test_every_tla_action_is_a_protocol_statement():
    tla = (SPEC / "tla" / "Conveyor.tla").read_text()
    actions = set(re.findall(r"^([A-Z][A-Z_]+)\([^)]*\) ==", tla, flags=re.MULTILINE))
    assert actions >= MODELLED
    for name in actions:
        assert isinstance(getattr(protocol, name, None), str), f"{name} is not in protocol.py"


def test_the_promela_model_names_the_same_statements():
    pml = (SPEC / "promela" / "conveyor.pml").read_text()
    for name in MODELLED | {"LOCK_FOR_EFFECT"}:
        assert re.search(rf"/\*[^*]*\b{name}\b", pml), f"{name} is not modelled in Promela"
        assert name in protocol.ACTIONS
