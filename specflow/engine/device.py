"""What accelerators this machine has, through NVML or amdsmi when installed; never required."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class Device:
    """One accelerator as its driver reports it."""

    vendor: str
    name: str
    total_bytes: int
    free_bytes: int
    driver: str = ""


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
            out.append(Device("nvidia", name.decode() if isinstance(name, bytes) else name,
                              int(mem.total), int(mem.free),
                              driver.decode() if isinstance(driver, bytes) else driver))
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
        for handle in amdsmi.amdsmi_get_processor_handles():
            info = amdsmi.amdsmi_get_gpu_asic_info(handle)
            total = amdsmi.amdsmi_get_gpu_memory_total(handle, amdsmi.AmdSmiMemoryType.VRAM)
            used = amdsmi.amdsmi_get_gpu_memory_usage(handle, amdsmi.AmdSmiMemoryType.VRAM)
            out.append(Device("amd", str(info.get("market_name", "AMD GPU")), int(total),
                              int(total) - int(used)))
        return out
    finally:
        amdsmi.amdsmi_shut_down()


def probe() -> list[Device]:
    """Accelerators visible to this process; empty on CPU-only machines."""
    return _nvml() or _amdsmi()
