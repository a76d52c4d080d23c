"""Device-plugin device ids as GPU indexes and MIG instances.

What NVIDIA's device plug-in hands the kubelet, by configuration:

* ``nvidia.com/gpu``: the GPU's UUID (``GPU-8d6c...``, the default
  ``DEVICE_ID_STRATEGY=uuid``) or its index (``"3"``, strategy ``index``);
* MIG, ``nvidia.com/mig-1g.10gb`` (strategy ``mixed``) or ``nvidia.com/gpu``
  (strategy ``single``): the MIG device's UUID (``MIG-7a3e...``), or on old
  drivers ``MIG-GPU-<gpu uuid>/<gpu instance>/<compute instance>``;
* time-slicing and MPS sharing (``nvidia.com/gpu`` or, renamed,
  ``nvidia.com/gpu.shared``): the base id with a replica suffix,
  ``GPU-8d6c...::2``; several pods then hold replicas of one GPU.

:class:`DeviceMap` is built from what the agent already knows: the GPU UUID
on every GPU row and the MIG instances' UUIDs in the NVML facts
(``gpus[].mig_instances``).  An id it cannot place maps to None, never to a
guess.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: A place on the node: (GPU index, MIG GPU-instance id or None for the whole GPU).
Place = tuple[int, int | None]


def base_id(device_id: str) -> str:
    """The device id without a sharing replica suffix (``GPU-x::3`` -> ``GPU-x``)."""
    return device_id.split("::", 1)[0].strip()


@dataclass
class DeviceMap:
    gpu_by_uuid: dict[str, int]
    mig_by_uuid: dict[str, Place]
    indexes: set[int]

    @classmethod
    def build(cls, rows: Iterable[Mapping[str, Any]], facts: Mapping[str, Any] | None = None) -> DeviceMap:
        gpu_by_uuid: dict[str, int] = {}
        mig_by_uuid: dict[str, Place] = {}
        indexes: set[int] = set()
        for row in rows:
            g = row.get("gpu")
            if not isinstance(g, int):
                continue
            indexes.add(g)
            uuid = row.get("uuid")
            if isinstance(uuid, str) and uuid and row.get("mig_instance") is None:
                gpu_by_uuid[uuid.lower()] = g
        for entry in (facts or {}).get("gpus") or ():
            if not isinstance(entry, Mapping):
                continue
            g = entry.get("gpu", entry.get("index"))
            if not isinstance(g, int):
                continue
            indexes.add(g)
            if isinstance(entry.get("uuid"), str):
                gpu_by_uuid.setdefault(entry["uuid"].lower(), g)
            for inst in entry.get("mig_instances") or ():
                if (
                    isinstance(inst, Mapping)
                    and isinstance(inst.get("uuid"), str)
                    and isinstance(inst.get("gpu_instance_id"), int)
                ):
                    mig_by_uuid[inst["uuid"].lower()] = (g, inst["gpu_instance_id"])
        return cls(gpu_by_uuid, mig_by_uuid, indexes)

    def place(self, device_id: str) -> Place | None:
        """Where a device-plugin id lives on this node, or None when it names nothing the agent reads."""
        dev = base_id(device_id)
        low = dev.lower()
        if low.startswith("mig-gpu-"):
            # MIG-GPU-<uuid>/<gi>/<ci>: the parent's UUID and the GPU instance.
            parent, _, rest = dev[len("MIG-") :].partition("/")
            gi = rest.split("/", 1)[0]
            g = self.gpu_by_uuid.get(parent.lower())
            return (g, int(gi)) if g is not None and gi.isdigit() else None
        if low.startswith("mig-"):
            return self.mig_by_uuid.get(low)
        if low.startswith("gpu-"):
            g = self.gpu_by_uuid.get(low)
            return (g, None) if g is not None else None
        if dev.isdigit() and int(dev) in self.indexes:
            return (int(dev), None)
        return None
