"""DCGM mapping, blank sentinels and the source over a fake of the small pydcgm surface it uses."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from gpufleet.agent.sources.base import SourceError, SourceUnavailable
from gpufleet.agent.sources.dcgm import (
    DCGM_FIELDS,
    DCGM_FP64_BLANK,
    DCGM_INT64_BLANK,
    FIELD_BY_NAME,
    DcgmBindings,
    DcgmSource,
    blank_kind,
    load_bindings,
    to_catalog,
)
from gpufleet.catalog import GPU_BY_NAME, GPU_FIELDS, WHOLE_GPU_FIELDS
from tests.conftest import realdata

# --------------------------------------------------------------------------- mapping as data


def field_ids_csv() -> dict[int, dict[str, str]]:
    with realdata("dcgm", "dcgm_field_ids.csv").open() as f:
        return {int(r["field_id"]): r for r in csv.DictReader(f)}


def test_mapping_agrees_with_dcgm_field_definitions() -> None:
    rows = field_ids_csv()
    for f in DCGM_FIELDS:
        row = rows[f.field_id]
        assert row["name"] == f.name, f
        assert set(f.aliases) <= set(filter(None, row["legacy_aliases"].split(";"))), f
        assert row["tag"] == f.tag, f
        assert row["type"] == {"int64": "DCGM_FT_INT64", "double": "DCGM_FT_DOUBLE"}[f.dcgm_type], f
        assert f.column in GPU_BY_NAME, f


def test_every_dcgm_sourced_catalog_column_is_mapped() -> None:
    # The shared DCGM table, or for the exporter's extra counters its own table.
    from gpufleet.agent.sources.dcgm_exporter import SERIES

    for col in GPU_FIELDS:
        if col.source.startswith("DCGM_FI_"):
            field = FIELD_BY_NAME.get(col.source) or SERIES[col.source]
            assert field.column == col.name, col.name


def exporter_names(filename: str) -> list[str]:
    names = []
    for line in realdata("dcgm-exporter", filename).read_text().splitlines():
        text = line.lstrip("#").strip()
        name = text.split(",")[0].strip()
        if name.upper().startswith("DCGM_") and "," in text:
            names.append(name)
    return names


@pytest.mark.parametrize(
    "filename", ["default-counters.csv", "dcp-metrics-included.csv", "1.x-compatibility-metrics.csv"]
)
def test_exporter_field_lists_resolve_to_the_right_field_ids(filename: str) -> None:
    rows = field_ids_csv()
    by_any_name: dict[str, int] = {}
    for fid, r in rows.items():
        for n in [r["name"], *filter(None, r["legacy_aliases"].split(";"))]:
            by_any_name[n] = fid
            by_any_name[n.lower()] = fid
        if r["tag"]:
            by_any_name[f"dcgm_{r['tag']}"] = fid
    mapped = [n for n in exporter_names(filename) if n in FIELD_BY_NAME]
    assert len(mapped) >= 6, mapped
    for name in mapped:
        assert FIELD_BY_NAME[name].field_id == by_any_name[name], name


def test_legacy_and_1x_names_resolve() -> None:
    assert FIELD_BY_NAME["DCGM_FI_DEV_POWER_USAGE"].column == "power_w"
    assert FIELD_BY_NAME["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"].column == "throttle_reasons"
    assert FIELD_BY_NAME["dcgm_gpu_temp"].column == "temp_c"
    assert FIELD_BY_NAME["dcgm_fi_prof_pcie_tx_bytes"].column == "pcie_tx_bytes_s"


# --------------------------------------------------------------------------- sentinels


@pytest.mark.parametrize(
    ("value", "dcgm_type", "kind"),
    [
        (DCGM_INT64_BLANK, "int64", "blank"),
        (DCGM_INT64_BLANK + 1, "int64", "blank"),  # NOT_FOUND
        (9223372036854775794, "int64", "not_supported"),  # NOT_SUPPORTED, as printed by tools
        (DCGM_INT64_BLANK + 3, "int64", "not_supported"),  # NOT_PERMISSIONED
        (DCGM_FP64_BLANK, "double", "blank"),
        (DCGM_FP64_BLANK + 2.0, "double", "not_supported"),
        (float(DCGM_INT64_BLANK + 2), "int64", "blank"),  # a sentinel that went through a float
        ("<<<NOT_SUPPORTED>>>", "int64", "not_supported"),
        ("<<<NULL>>>", "int64", "blank"),
        (None, "double", "blank"),
        (0, "int64", "value"),
        (431.5, "double", "value"),
    ],
)
def test_blank_sentinels(value: Any, dcgm_type: str, kind: str) -> None:
    assert blank_kind(value, dcgm_type) == kind  # type: ignore[arg-type]


def test_every_blank_becomes_none_and_units_convert() -> None:
    power = FIELD_BY_NAME["DCGM_FI_DEV_POWER_USAGE"]
    energy = FIELD_BY_NAME["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    pcie_dev = FIELD_BY_NAME["DCGM_FI_DEV_PCIE_TX_THROUGHPUT"]
    for sentinel in (DCGM_FP64_BLANK, DCGM_FP64_BLANK + 1, DCGM_FP64_BLANK + 2, DCGM_FP64_BLANK + 3):
        assert to_catalog(power, sentinel) is None
    for sentinel in range(DCGM_INT64_BLANK, DCGM_INT64_BLANK + 4):
        assert to_catalog(energy, sentinel) is None
    assert to_catalog(power, 113.611) == pytest.approx(113.611)
    assert to_catalog(energy, 123456789012345) == 123456789012345
    assert to_catalog(pcie_dev, 9139) == 9139 * 1024


# --------------------------------------------------------------------------- a fake of the pydcgm surface


class FakeDCGMError(Exception):
    pass


GPU, GPU_I = 1, 4


@dataclass
class Sample:
    value: Any
    ts: int = 1


@dataclass
class FakeEngine:
    """What nv-hostengine knows: entities, field values, failures to inject."""

    gpus: list[int]
    uuids: dict[int, str]
    #: (entity_id, parent gpu, nvml GPU instance id)
    instances: list[tuple[int, int, int]] = field(default_factory=list)
    values: dict[tuple[int, int], dict[int, Sample]] = field(default_factory=dict)
    prof_unavailable: bool = False
    connect_fails: bool = False
    read_fails: bool = False
    connections: int = 0
    deleted: list[str] = field(default_factory=list)
    #: Per GPU id: dcgmGetNvLinkLinkStatus link states (0 not supported, 2 down, 3 up); None: call fails.
    links: dict[int, list[int]] | None = field(default_factory=dict)


def fake_bindings(engine: FakeEngine) -> DcgmBindings:
    structs = ModuleType("dcgm_structs")
    structs.DCGMError = FakeDCGMError  # type: ignore[attr-defined]
    structs.DCGM_OPERATION_MODE_AUTO = 1  # type: ignore[attr-defined]
    fields_mod = ModuleType("dcgm_fields")
    fields_mod.DCGM_FE_GPU = GPU  # type: ignore[attr-defined]
    fields_mod.DCGM_FE_GPU_I = GPU_I  # type: ignore[attr-defined]

    class FieldGroup:
        def __init__(self, handle: Any, name: str, ids: list[int]) -> None:
            self.name, self.ids = name, ids

        def Delete(self) -> None:
            engine.deleted.append(self.name)

    class Samples:
        def __init__(self, group: Group) -> None:
            self.group = group

        def WatchFields(self, fg: FieldGroup, interval_us: int, keep_age_s: float, keep_n: int) -> None:
            if engine.prof_unavailable and any(1001 <= i <= 1040 for i in fg.ids):
                raise FakeDCGMError("DCGM_ST_PROFILING_NOT_SUPPORTED")

        def GetLatest_v2(self, fg: FieldGroup) -> Any:
            if engine.read_fails:
                raise FakeDCGMError("DCGM_ST_CONNECTION_NOT_VALID")
            out: dict[int, dict[int, dict[int, list[Sample]]]] = {}
            for grp, eid in self.group.entities:
                vals = engine.values.get((grp, eid), {})
                out.setdefault(grp, {})[eid] = {fid: [s] for fid, s in vals.items() if fid in fg.ids}
            return SimpleNamespace(values=out)

    class Group:
        def __init__(self) -> None:
            self.entities: list[tuple[int, int]] = []
            self.samples = Samples(self)

        def AddEntity(self, grp: int, eid: int) -> None:
            self.entities.append((grp, eid))

        def Delete(self) -> None:
            engine.deleted.append("group")

    class Handle:
        def __init__(self, ipAddress: str, opMode: int) -> None:
            if engine.connect_fails:
                raise FakeDCGMError("DCGM_ST_CONNECTION_NOT_VALID")
            engine.connections += 1
            self.handle = object()

        def GetSystem(self) -> Any:
            attrs = lambda g: SimpleNamespace(identifiers=SimpleNamespace(uuid=engine.uuids[g].encode()))  # noqa: E731
            discovery = SimpleNamespace(
                GetAllSupportedGpuIds=lambda: list(engine.gpus), GetGpuAttributes=attrs
            )
            return SimpleNamespace(
                discovery=discovery, GetEmptyGroup=lambda name: Group(), UpdateAllFields=lambda wait: None
            )

    pydcgm = ModuleType("pydcgm")
    pydcgm.DcgmHandle = Handle  # type: ignore[attr-defined]
    pydcgm.DcgmFieldGroup = FieldGroup  # type: ignore[attr-defined]

    def hierarchy(handle: object) -> Any:
        entries = [
            SimpleNamespace(
                entity=SimpleNamespace(entityGroupId=GPU_I, entityId=eid),
                parent=SimpleNamespace(entityGroupId=GPU, entityId=parent),
                info=SimpleNamespace(nvmlInstanceId=gi),
            )
            for eid, parent, gi in engine.instances
        ]
        return SimpleNamespace(count=len(entries), entityList=entries)

    def link_status(handle: object) -> Any:
        if engine.links is None:
            raise FakeDCGMError("DCGM_ST_NOT_SUPPORTED")
        gpus = [SimpleNamespace(entityId=g, linkState=states) for g, states in engine.links.items()]
        return SimpleNamespace(numGpus=len(gpus), gpus=gpus)

    agent = ModuleType("dcgm_agent")
    agent.dcgmGetGpuInstanceHierarchy = hierarchy  # type: ignore[attr-defined]
    agent.dcgmGetNvLinkLinkStatus = link_status  # type: ignore[attr-defined]
    return DcgmBindings(pydcgm, structs, fields_mod, agent)


def h100_values(power: float = 431.5) -> dict[int, Sample]:
    return {
        203: Sample(97),
        1002: Sample(0.82),
        1004: Sample(0.41),
        1005: Sample(0.33),
        252: Sample(19818),
        250: Sample(81559),
        155: Sample(power),
        156: Sample(987654321),
        164: Sample(700.0),
        100: Sample(1980),
        113: Sample(1980),
        101: Sample(2619),
        150: Sample(59),
        140: Sample(55),
        112: Sample(0),
        1009: Sample(3_166_208),
        1010: Sample(6_498_304),
        237: Sample(5),
        235: Sample(5),
        238: Sample(16),
        236: Sample(16),
        1011: Sample(DCGM_INT64_BLANK + 2),
        1012: Sample(DCGM_INT64_BLANK + 2),
        311: Sample(0),
        230: Sample(DCGM_INT64_BLANK),
    }


def mig_engine() -> FakeEngine:
    engine = FakeEngine(gpus=[0, 1], uuids={0: "GPU-aaaa", 1: "GPU-bbbb"}, instances=[(0, 1, 2), (1, 1, 9)])
    engine.values[(GPU, 0)] = h100_values()
    engine.values[(GPU, 1)] = {**h100_values(444.7), 203: Sample(DCGM_INT64_BLANK + 2)}
    # dcgm-exporter and DCGM report device-level fields for GPU instances too:
    # they must not land on the instance rows.
    engine.values[(GPU_I, 0)] = {
        1002: Sample(0.9),
        252: Sample(11091),
        250: Sample(40448),
        155: Sample(444.7),
    }
    engine.values[(GPU_I, 1)] = {1002: Sample(0.1), 252: Sample(9), 250: Sample(9984), 156: Sample(5)}
    return engine


def rows_by_key(src: DcgmSource) -> dict[tuple[int, int | None], dict]:
    return {(r["gpu"], r["mig_instance"]): r for r in src.collect().gpus}


def test_gpu_rows_carry_profiling_fields_in_catalog_units() -> None:
    engine = mig_engine()
    src = DcgmSource(bindings=fake_bindings(engine))
    row = rows_by_key(src)[(0, None)]
    assert row["uuid"] == "GPU-aaaa"
    assert (row["util_pct"], row["sm_active"], row["tensor_active"], row["dram_active"]) == (
        97,
        0.82,
        0.41,
        0.33,
    )
    assert row["power_w"] == 431.5 and row["energy_mj"] == 987654321 and row["power_limit_w"] == 700.0
    assert row["pcie_tx_bytes_s"] == 3_166_208 and row["pcie_rx_bytes_s"] == 6_498_304
    assert row["nvlink_tx_bytes_s"] is None  # NOT_SUPPORTED sentinel, not a huge number
    assert row["xid"] == 0  # blank XID: none seen since watching


def test_mig_instances_get_their_own_rows_without_whole_gpu_fields() -> None:
    src = DcgmSource(bindings=fake_bindings(mig_engine()))
    rows = rows_by_key(src)
    assert set(rows) == {(0, None), (1, None), (1, 2), (1, 9)}
    assert rows[(1, None)]["util_pct"] is None and rows[(1, None)]["power_w"] == 444.7
    inst = rows[(1, 2)]
    assert inst["sm_active"] == 0.9 and inst["mem_used_mib"] == 11091 and inst["mem_total_mib"] == 40448
    for name in WHOLE_GPU_FIELDS:
        assert inst.get(name) is None, name
    assert rows[(1, 9)].get("energy_mj") is None


def test_profiling_unavailable_keeps_device_fields() -> None:
    engine = mig_engine()
    engine.prof_unavailable = True
    row = rows_by_key(DcgmSource(bindings=fake_bindings(engine)))[(0, None)]
    assert row["power_w"] == 431.5
    assert row.get("sm_active") is None and row.get("tensor_active") is None


def test_prof_pcie_wins_over_deprecated_dev_throughput() -> None:
    engine = mig_engine()
    engine.values[(GPU, 0)][200] = Sample(9139)  # KB/s
    src = DcgmSource(bindings=fake_bindings(engine))
    assert rows_by_key(src)[(0, None)]["pcie_tx_bytes_s"] == 3_166_208
    del engine.values[(GPU, 0)][1009]
    assert rows_by_key(src)[(0, None)]["pcie_tx_bytes_s"] == 9139 * 1024


def test_xid_reported_once_per_new_event() -> None:
    engine = mig_engine()
    src = DcgmSource(bindings=fake_bindings(engine))
    assert rows_by_key(src)[(0, None)]["xid"] == 0
    engine.values[(GPU, 0)][230] = Sample(79, ts=1_000)
    assert rows_by_key(src)[(0, None)]["xid"] == 79
    assert rows_by_key(src)[(0, None)]["xid"] == 0  # same sample: not in this interval
    engine.values[(GPU, 0)][230] = Sample(48, ts=2_000)
    assert rows_by_key(src)[(0, None)]["xid"] == 48
    engine.values[(GPU, 0)][230] = Sample(DCGM_INT64_BLANK + 2)
    assert rows_by_key(src)[(0, None)]["xid"] is None


def test_no_hostengine_is_unavailable_and_lost_connection_reconnects() -> None:
    engine = mig_engine()
    engine.connect_fails = True
    with pytest.raises(SourceUnavailable):
        DcgmSource(bindings=fake_bindings(engine)).collect()
    engine.connect_fails = False
    src = DcgmSource(bindings=fake_bindings(engine))
    src.collect()
    engine.read_fails = True
    with pytest.raises(SourceError, match="CONNECTION_NOT_VALID"):
        src.collect()
    engine.read_fails = False
    src.collect()
    assert engine.connections == 2


def test_close_deletes_groups_and_facts_list_entities() -> None:
    engine = mig_engine()
    src = DcgmSource(bindings=fake_bindings(engine))
    facts = src.facts()
    assert facts["dcgm_gpus"] == [{"gpu": 0, "uuid": "GPU-aaaa"}, {"gpu": 1, "uuid": "GPU-bbbb"}]
    assert [i["gpu_instance_id"] for i in facts["dcgm_mig_instances"]] == [2, 9]
    src.close()
    assert "group" in engine.deleted and len(engine.deleted) == 3


def test_missing_bindings_mean_unavailable() -> None:
    try:
        import pydcgm  # noqa: F401
    except ImportError:
        with pytest.raises(SourceUnavailable, match="datacenter-gpu-manager"):
            load_bindings(extra_dirs=())
    else:
        assert load_bindings(extra_dirs=()).pydcgm is not None


def test_real_bindings_expose_the_surface_used() -> None:
    pytest.importorskip(
        "pydcgm",
        reason="DCGM bindings (pydcgm) not installed: they ship with NVIDIA's "
        "datacenter-gpu-manager, not PyPI",
    )
    b = load_bindings()
    assert hasattr(b.pydcgm, "DcgmHandle") and hasattr(b.pydcgm, "DcgmFieldGroup")
    assert hasattr(b.dcgm_agent, "dcgmGetGpuInstanceHierarchy") and hasattr(
        b.dcgm_agent, "dcgmGetNvLinkLinkStatus"
    )
    assert hasattr(b.dcgm_fields, "DCGM_FE_GPU_I")


def test_health_counters_map_and_links_come_from_link_status() -> None:
    engine = mig_engine()
    engine.values[(GPU, 0)].update(
        {
            310: Sample(12),
            312: Sample(40),
            313: Sample(1),
            393: Sample(1),
            394: Sample(2),
            395: Sample(0),
            396: Sample(1),
            202: Sample(9),
            409: Sample(150),
            429: Sample(5),
            439: Sample(DCGM_INT64_BLANK + 2),
            498: Sample(3),
        }
    )
    engine.links = {0: [3] * 16 + [2, 2] + [0] * 6, 1: [0] * 24}
    row = rows_by_key(DcgmSource(bindings=fake_bindings(engine)))[(0, None)]
    assert (row["ecc_sbe_vol"], row["ecc_sbe_agg"], row["ecc_dbe_vol"], row["ecc_dbe_agg"]) == (12, 40, 0, 1)
    assert (row["remapped_rows_uncorrectable"], row["remapped_rows_correctable"]) == (1, 2)
    assert (row["remapped_rows_failed"], row["remapped_rows_pending"]) == (0, 1)
    assert row["pcie_replay_count"] == 9
    assert (row["nvlink_crc_errors"], row["nvlink_replay_errors"]) == (150, 5)
    # 439 says NOT_SUPPORTED: the newer id 498 fills the column.
    assert row["nvlink_recovery_errors"] == 3
    assert (row["nvlink_links_up"], row["nvlink_links_max"]) == (16, 18)
    other = rows_by_key(DcgmSource(bindings=fake_bindings(engine)))[(1, None)]
    assert other.get("nvlink_links_max") is None  # every link "not supported": no NVLink, NULL
    engine.links = None
    src = DcgmSource(bindings=fake_bindings(engine))
    assert rows_by_key(src)[(0, None)].get("nvlink_links_up") is None
    assert rows_by_key(src)[(0, None)]["pcie_replay_count"] == 9  # the rest still flows


def test_management_limit_is_the_fallback_of_the_enforced_limit() -> None:
    engine = mig_engine()
    engine.values[(GPU, 0)].pop(164, None)  # a DCGM that does not report the enforced limit
    engine.values[(GPU, 0)].update({160: Sample(500.0)})
    assert rows_by_key(DcgmSource(bindings=fake_bindings(engine)))[(0, None)][
        "power_limit_w"
    ] == pytest.approx(500.0)
    engine.values[(GPU, 0)].update({164: Sample(450.0)})
    assert rows_by_key(DcgmSource(bindings=fake_bindings(engine)))[(0, None)][
        "power_limit_w"
    ] == pytest.approx(450.0)
    engine.values[(GPU, 0)].update({164: Sample(DCGM_FP64_BLANK)})
    assert rows_by_key(DcgmSource(bindings=fake_bindings(engine)))[(0, None)][
        "power_limit_w"
    ] == pytest.approx(500.0)
