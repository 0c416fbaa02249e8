"""What accelerators this machine has, through NVML or amdsmi when installed; never required."""

from __future__ import annotations

import os
from dataclasses import dataclass

GIB = 1024**3

VISIBLE_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
"""Where a worker is given its device set (the first one set counts)."""


@dataclass(frozen=True)
class Device:
    """One accelerator as its driver reports it."""

    vendor: str
    name: str
    total_bytes: int
    free_bytes: int
    driver: str = ""
    index: int = 0
    """The driver's index of the device (what CUDA_VISIBLE_DEVICES lists)."""
    uuid: str = ""


def owned() -> tuple[str, ...] | None:
    """The device ids this process was given (CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES or
    ROCR_VISIBLE_DEVICES, the first set); None when none is set (every device is visible)."""
    for name in VISIBLE_ENV:
        value = os.environ.get(name)
        if value is not None:
            return tuple(x.strip() for x in value.split(",") if x.strip())
    return None


def visible(devices: list[Device], ids: tuple[str, ...] | None) -> list[Device]:
    """The devices `ids` names (by index or UUID), in its order; all of them for None. The
    drivers' libraries list every device whatever the variables say, the engine sees these."""
    if ids is None:
        return devices
    by_id = {**{str(d.index): d for d in devices}, **{d.uuid: d for d in devices if d.uuid}}
    return [by_id[i] for i in ids if i in by_id]


def _nvml() -> list[Device]:
    try:
        import pynvml  # provided by nvidia-ml-py
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound / DriverNotLoaded: no NVIDIA GPU here
        return []
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            out.append(Device("nvidia", name.decode() if isinstance(name, bytes) else name,
                              int(mem.total), int(mem.free),
                              driver.decode() if isinstance(driver, bytes) else driver, i,
                              uuid.decode() if isinstance(uuid, bytes) else uuid))
        return out
    finally:
        pynvml.nvmlShutdown()


def _amdsmi() -> list[Device]:
    try:
        import amdsmi
    except ImportError:
        return []
    try:
        amdsmi.amdsmi_init()
    except Exception:  # noqa: BLE001 - AmdSmiLibraryException: no AMD GPU or driver here
        return []
    try:
        out = []
        for i, handle in enumerate(amdsmi.amdsmi_get_processor_handles()):
            info = amdsmi.amdsmi_get_gpu_asic_info(handle)
            total = amdsmi.amdsmi_get_gpu_memory_total(handle, amdsmi.AmdSmiMemoryType.VRAM)
            used = amdsmi.amdsmi_get_gpu_memory_usage(handle, amdsmi.AmdSmiMemoryType.VRAM)
            out.append(Device("amd", str(info.get("market_name", "AMD GPU")), int(total),
                              int(total) - int(used), index=i))
        return out
    finally:
        amdsmi.amdsmi_shut_down()


def detect() -> list[Device]:
    """Accelerators visible to this process (its device set, when it was given one); empty on
    CPU-only machines."""
    return visible(_nvml() or _amdsmi(), owned())
