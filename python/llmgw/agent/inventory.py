"""What this node has: GPUs (through NVML, or declared with --fake-gpus), CPUs and memory.

Simulated GPUs are marked `simulated=True` in every report so that nothing
downstream (placement, `ctl nodes`, the console) can mistake them for real
ones. NVML is optional: a node without the driver gets an empty GPU list and a
note saying why, never a crash.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import socket
from typing import Any

import msgspec

GIB = 1024**3
FAKE_FORMAT = "COUNTxMODEL-MEMGB, several separated by commas, e.g. 4xH100-80GB or 2xA100-40GB,1xL4-24GB"
_FAKE = re.compile(r"(?P<count>\d+)x(?P<model>[A-Za-z0-9][A-Za-z0-9_.-]*?)-(?P<mem>\d+(?:\.\d+)?)GB",
                   re.IGNORECASE)  # fmt: skip
MAX_FAKE_GPUS = 1024  # a typo like 800xH100 should fail loudly, not allocate a fleet


class GpuInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU as the control plane sees it."""

    uuid: str
    index: int
    model: str
    memory_total_bytes: int
    memory_free_bytes: int
    nvlink_peers: tuple[str, ...] = ()
    simulated: bool = False
    pci_bus_id: str = ""


class Inventory(msgspec.Struct, frozen=True, kw_only=True):
    """The node's GPUs and, when there are none, why (`note`)."""

    gpus: tuple[GpuInfo, ...]
    note: str = ""
    driver_version: str = ""

    @property
    def simulated(self) -> bool:
        """True when the GPUs were declared with --fake-gpus."""
        return any(g.simulated for g in self.gpus)


class FakeGpuSpecError(ValueError):
    """A --fake-gpus value that does not parse; the message is a sentence for the operator."""


def parse_fake_gpus(spec: str, node_id: str = "") -> tuple[GpuInfo, ...]:
    """Simulated GPUs from `COUNTxMODEL-MEMGB[,...]`, numbered in order.

    UUIDs are `SIM-<8 hex of the node id>-<index>`: stable across restarts of one
    node and distinct between nodes, as real UUIDs are. The GPUs of one group are
    NVLink peers of each other (one simulated HGX board); groups are not linked.
    """
    parts = [p.strip() for p in spec.split(",")]
    if not spec.strip() or any(not p for p in parts):
        raise FakeGpuSpecError(f"--fake-gpus is empty or has an empty entry; the format is {FAKE_FORMAT}")
    node = hashlib.sha256(node_id.encode()).hexdigest()[:8]
    gpus: list[GpuInfo] = []
    for part in parts:
        m = _FAKE.fullmatch(part)
        if m is None:
            shown = part if len(part) <= 40 else part[:40] + "..."
            raise FakeGpuSpecError(f"--fake-gpus entry {shown!r} is not understood; the format is {FAKE_FORMAT}")
        count, mem = int(m["count"]), float(m["mem"])
        if count < 1 or mem <= 0:
            raise FakeGpuSpecError(f"--fake-gpus entry {part!r} needs a count and memory above zero; "
                                   f"the format is {FAKE_FORMAT}")
        if len(gpus) + count > MAX_FAKE_GPUS:
            raise FakeGpuSpecError(f"--fake-gpus declares more than {MAX_FAKE_GPUS} GPUs; the format is {FAKE_FORMAT}")
        first = len(gpus)
        uuids = [f"SIM-{node}-{first + i:04d}" for i in range(count)]
        total = int(mem * GIB)
        for i, uuid in enumerate(uuids):
            gpus.append(GpuInfo(
                uuid=uuid, index=first + i, model=m["model"], memory_total_bytes=total,
                memory_free_bytes=total, simulated=True,
                nvlink_peers=tuple(u for u in uuids if u != uuid),
            ))  # fmt: skip
    return tuple(gpus)


def _load_nvml() -> Any:
    """The `pynvml` module (nvidia-ml-py, untyped), or None; imported only where it is used."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus(value: object) -> str:
    """A PCI bus id in one spelling: NVML writes the domain with 4 or 8 digits."""
    text = _text(value).strip().lower()
    domain, _, rest = text.partition(":")
    return f"{int(domain, 16):08x}:{rest}" if rest and domain else text


def probe_nvml(nvml: Any = None) -> Inventory:
    """The node's real GPUs through NVML; `nvml` is the `pynvml` module (tests pass a fake).

    No library or no driver gives an empty inventory whose note says so.
    """
    if nvml is None:
        nvml = _load_nvml()
        if nvml is None:
            return Inventory(gpus=(), note="no NVIDIA driver: nvidia-ml-py is not installed")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return Inventory(gpus=(), note=f"no NVIDIA driver: {exc}")
    try:
        return _read_devices(nvml)
    finally:
        nvml.nvmlShutdown()


def _read_devices(nvml: Any) -> Inventory:
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    base: list[tuple[GpuInfo, Any]] = []
    for index, h in enumerate(handles):
        mem = nvml.nvmlDeviceGetMemoryInfo(h)
        info = GpuInfo(
            uuid=_text(nvml.nvmlDeviceGetUUID(h)), index=index, model=_text(nvml.nvmlDeviceGetName(h)),
            memory_total_bytes=int(mem.total), memory_free_bytes=int(mem.free),
            pci_bus_id=_bus(nvml.nvmlDeviceGetPciInfo(h).busId),
        )  # fmt: skip
        base.append((info, h))
    by_bus = {g.pci_bus_id: g.uuid for g, _ in base}
    direct: dict[str, set[str]] = {g.uuid: set() for g, _ in base}
    on_switch: set[str] = set()
    for g, h in base:
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            # Per link: GPUs without NVLink, or with fewer links, raise NotSupported or
            # InvalidArgument for the links they lack; that only means "no peer here".
            try:
                if not nvml.nvmlDeviceGetNvLinkState(h, link):
                    continue
                remote = _bus(nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
                kind = _remote_kind(nvml, h, link)
            except nvml.NVMLError:
                continue
            if kind == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                on_switch.add(g.uuid)
            elif remote in by_bus and by_bus[remote] != g.uuid:
                direct[g.uuid].add(by_bus[remote])
    gpus = []
    for g, _ in base:
        # NVSwitch systems: every GPU on the switch reaches every other at full speed.
        peers = direct[g.uuid] | (on_switch - {g.uuid} if g.uuid in on_switch else set())
        gpus.append(msgspec.structs.replace(g, nvlink_peers=tuple(sorted(peers))))
    note = "" if gpus else "the NVIDIA driver reports no GPU"
    return Inventory(gpus=tuple(gpus), note=note, driver_version=driver)


def _remote_kind(nvml: Any, handle: Any, link: int) -> int:
    try:
        return int(nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
    except nvml.NVMLError:  # older drivers lack the call: assume a GPU, matched by bus id
        return int(nvml.NVML_NVLINK_DEVICE_TYPE_GPU)


def detect(fake_gpus: str | None, node_id: str = "", nvml: Any = None) -> Inventory:
    """The inventory to report: the declared simulated GPUs, else what NVML finds."""
    if fake_gpus:
        gpus = parse_fake_gpus(fake_gpus, node_id)
        return Inventory(gpus=gpus, note=f"{len(gpus)} simulated GPUs from --fake-gpus {fake_gpus}")
    return probe_nvml(nvml)


class GpuSample(msgspec.Struct, frozen=True):
    """Load of one GPU at one moment, for heartbeats."""

    uuid: str
    utilization_percent: int
    memory_used_bytes: int
    memory_free_bytes: int


def sample_load(inventory: Inventory, nvml: Any = None) -> list[GpuSample]:
    """Utilisation and memory of every GPU now. Blocking (NVML): call it in a thread.

    Simulated GPUs report idle and all memory free; a GPU NVML cannot read is left out.
    """
    fake = [g for g in inventory.gpus if g.simulated]
    out = [GpuSample(g.uuid, 0, 0, g.memory_total_bytes) for g in fake]
    real = [g for g in inventory.gpus if not g.simulated]
    if not real:
        return out
    if nvml is None:
        nvml = _load_nvml()
    if nvml is None:
        return out
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return out
    try:
        for g in real:
            try:
                h = nvml.nvmlDeviceGetHandleByUUID(g.uuid)
                util = nvml.nvmlDeviceGetUtilizationRates(h)
                mem = nvml.nvmlDeviceGetMemoryInfo(h)
            except nvml.NVMLError:
                continue
            out.append(GpuSample(g.uuid, int(util.gpu), int(mem.used), int(mem.free)))
    finally:
        nvml.nvmlShutdown()
    return out


class HostFacts(msgspec.Struct, frozen=True):
    """CPU count, memory and hostname of this machine."""

    hostname: str
    cpu_count: int
    memory_bytes: int


def host_facts() -> HostFacts:
    """This machine's hostname, CPUs usable by this process and physical memory."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = 0
    return HostFacts(socket.gethostname(), cpus, memory)
