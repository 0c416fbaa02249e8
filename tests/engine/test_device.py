"""A worker's device set: what CUDA_VISIBLE_DEVICES (or the AMD variables) give it, and the
probed devices narrowed to it (the drivers' libraries list every device whatever it says)."""

from __future__ import annotations

import pytest

from specflow.engine import device
from specflow.engine.device import Device, owned, visible

GPUS = [Device("nvidia", "H200", 141 << 30, 140 << 30, "570", index=i, uuid=f"GPU-{i}aa")
        for i in range(4)]


def test_the_device_set_comes_from_the_first_visibility_variable_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in device.VISIBLE_ENV:
        monkeypatch.delenv(name, raising=False)
    assert owned() is None
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "3")
    assert owned() == ("3",)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 0")
    assert owned() == ("2", "0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert owned() == ()  # set and empty: no device at all


def test_probed_devices_are_narrowed_to_the_set_by_index_or_uuid() -> None:
    assert visible(GPUS, None) == GPUS
    assert [d.index for d in visible(GPUS, ("2", "0"))] == [2, 0]
    assert [d.index for d in visible(GPUS, ("GPU-3aa", "7"))] == [3]  # unknown ids dropped
    assert visible(GPUS, ()) == []


def test_a_worker_owning_fewer_devices_than_the_tensor_parallel_size_refuses_the_engine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from specflow.steps.measure import DevicesShort, check_devices

    ctx = SimpleNamespace(spec=SimpleNamespace(target=SimpleNamespace(tensor_parallel_size=2)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    with pytest.raises(DevicesShort, match=r"owns devices \[5\] \(1\); "
                                           r"target.tensor_parallel_size is 2"):
        check_devices(ctx)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    check_devices(ctx)  # two devices: an engine fits
    for name in device.VISIBLE_ENV:
        monkeypatch.delenv(name, raising=False)
    check_devices(ctx)  # no set given: every device is this worker's
