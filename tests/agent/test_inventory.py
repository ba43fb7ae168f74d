"""Inventory: --fake-gpus parsing and NVML reading (through a fake NVML module)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from llmgw.agent.inventory import GIB, FakeGpuSpecError, detect, parse_fake_gpus, probe_nvml


def test_fake_gpus_several_groups() -> None:
    gpus = parse_fake_gpus("2xH100-80GB, 1xA100-SXM4-40GB", node_id="n1")
    assert [(g.index, g.model, g.memory_total_bytes // GIB) for g in gpus] == [
        (0, "H100", 80), (1, "H100", 80), (2, "A100-SXM4", 40)]  # fmt: skip
    assert all(g.simulated for g in gpus)
    assert gpus[0].nvlink_peers == (gpus[1].uuid,) and gpus[2].nvlink_peers == ()
    assert all(g.uuid.startswith("SIM-") for g in gpus)
    assert len({g.uuid for g in gpus}) == 3


def test_fake_gpu_uuids_stable_per_node_and_distinct_between_nodes() -> None:
    a, b = parse_fake_gpus("1xL4-24GB", "a"), parse_fake_gpus("1xL4-24GB", "b")
    assert a == parse_fake_gpus("1xL4-24GB", "a")
    assert a[0].uuid != b[0].uuid


@pytest.mark.parametrize(("spec", "message"), [
    ("4xH100", ("--fake-gpus entry '4xH100' is not understood; the format is COUNTxMODEL-MEMGB, several "
               "separated by commas, e.g. 4xH100-80GB or 2xA100-40GB,1xL4-24GB")),
    ("", ("--fake-gpus is empty or has an empty entry; the format is COUNTxMODEL-MEMGB, several "
         "separated by commas, e.g. 4xH100-80GB or 2xA100-40GB,1xL4-24GB")),
    ("1xL4-24GB,", ("--fake-gpus is empty or has an empty entry; the format is COUNTxMODEL-MEMGB, "
                   "several separated by commas, e.g. 4xH100-80GB or 2xA100-40GB,1xL4-24GB")),
    ("0xL4-24GB", ("--fake-gpus entry '0xL4-24GB' needs a count and memory above zero; the format is "
                  "COUNTxMODEL-MEMGB, several separated by commas, e.g. 4xH100-80GB or 2xA100-40GB,1xL4-24GB")),
    ("2000xH100-80GB", ("--fake-gpus declares more than 1024 GPUs; the format is COUNTxMODEL-MEMGB, "
                       "several separated by commas, e.g. 4xH100-80GB or 2xA100-40GB,1xL4-24GB")),
])  # fmt: skip
def test_bad_fake_gpu_specs_say_the_format(spec: str, message: str) -> None:
    with pytest.raises(FakeGpuSpecError) as info:
        parse_fake_gpus(spec)
    assert str(info.value) == message


class _Err(Exception):
    pass


class FakeNvml:
    """Three GPUs: 0 and 1 linked directly, 2 without NVLink; or no library at all."""

    NVMLError = _Err
    NVML_NVLINK_MAX_LINKS = 4
    NVML_NVLINK_DEVICE_TYPE_GPU = 0
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 2

    def __init__(self, present: bool = True, switch: bool = False) -> None:
        self.present, self.switch, self.inits = present, switch, 0
        self.bus = ["00000000:07:00.0", "00000000:08:00.0", "00000000:09:00.0"]

    def nvmlInit(self) -> None:
        if not self.present:
            raise _Err("NVML Shared Library Not Found")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.inits -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.1"

    def nvmlDeviceGetCount(self) -> int:
        return 3

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h}"

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=80 * GIB, free=79 * GIB, used=GIB)

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=self.bus[h].encode())

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if h == 2 or link > 1:
            raise _Err("Not Supported")
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        other = 1 - h
        return SimpleNamespace(busId=("0000:" + self.bus[other].split(":", 1)[1]).encode())

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: int, link: int) -> int:
        return 2 if self.switch else 0


def test_nvml_gpus_and_direct_nvlink_peers() -> None:
    nvml = FakeNvml()
    inv = probe_nvml(nvml)
    assert inv.driver_version == "580.1" and not inv.simulated and inv.note == ""
    assert [(g.uuid, g.model, g.nvlink_peers) for g in inv.gpus] == [
        ("GPU-0", "NVIDIA H100 80GB HBM3", ("GPU-1",)),
        ("GPU-1", "NVIDIA H100 80GB HBM3", ("GPU-0",)),
        ("GPU-2", "NVIDIA H100 80GB HBM3", ()),
    ]
    assert nvml.inits == 0  # shut down again


def test_nvml_switch_connects_every_gpu_on_it() -> None:
    inv = probe_nvml(FakeNvml(switch=True))
    assert [g.nvlink_peers for g in inv.gpus] == [("GPU-1",), ("GPU-0",), ()]


def test_no_driver_is_an_empty_inventory_with_a_note() -> None:
    inv = probe_nvml(FakeNvml(present=False))
    assert inv.gpus == () and inv.note == "no NVIDIA driver: NVML Shared Library Not Found"


def test_fake_gpus_win_over_nvml() -> None:
    inv = detect("1xL4-24GB", "n", nvml=FakeNvml())
    assert inv.simulated and inv.note == "1 simulated GPUs from --fake-gpus 1xL4-24GB"
