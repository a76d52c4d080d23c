"""The XID table: the codes datacenter fleets see, each with a meaning, a cause and a first action."""

from __future__ import annotations

from gpufleet import xid

#: The codes an SRE meets on Ampere, Hopper and Blackwell fleets (NVIDIA's XID catalog).
FLEET_CODES = (8, 13, 31, 32, 38, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 119, 120, 154)


def test_every_fleet_code_is_described() -> None:
    for code in FLEET_CODES:
        info = xid.describe(code)
        assert info is not None, code
        assert info.name and len(info.meaning) > 30 and info.cause and info.action, code
    assert set(FLEET_CODES) == set(xid.XIDS)


def test_hardware_codes_are_told_from_application_ones() -> None:
    for code in (48, 63, 64, 74, 79, 92, 94, 95):
        assert xid.hardware(code), code
    for code in (13, 31, 43, 45):
        assert not xid.hardware(code) and xid.describe(code).action == "restart_app", code  # type: ignore[union-attr]
    assert xid.describe(79).action == "drain_node"  # type: ignore[union-attr]
    assert xid.describe(63).action == "reset_gpu"  # type: ignore[union-attr]


def test_unknown_codes_are_said_to_be_unknown_not_guessed() -> None:
    assert xid.describe(999) is None and not xid.hardware(999)
    assert "not in gpufleet's table" in xid.label(999)
    m = xid.meanings([63, 48, 999, 48])
    assert list(m) == ["48", "63", "999"]
    assert m["48"]["name"] == "double-bit ECC error" and m["48"]["action"] == "reset_gpu"
    assert m["999"]["name"] == "unknown"
    assert xid.label(48) == "XID 48: double-bit ECC error"
