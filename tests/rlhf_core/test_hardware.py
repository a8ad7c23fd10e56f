"""The hardware facts a run is tagged with: strings, every key, read defensively."""

import pytest
import torch

from rlhf_core import hardware
from rlhf_core.hardware import hardware_facts

KEYS = {"cpu", "cpu_capability", "cpu_bf16", "cpu_cores", "threads", "torch", "cuda", "gpu",
        "gpu_count", "platform"}


@pytest.fixture
def threads_kept():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_every_fact_is_a_non_empty_string():
    facts = hardware_facts("cpu")
    assert set(facts) == KEYS
    assert all(isinstance(v, str) and v for v in facts.values()), facts
    assert facts["torch"] == torch.__version__
    assert facts["cuda"] == (torch.version.cuda or "none")
    assert facts["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert facts["cpu_bf16"] in ("amx", "avx512_bf16", "none")


@pytest.mark.parametrize("amx,avx512_bf16,expected", [
    (True, True, "amx"), (False, True, "avx512_bf16"), (False, False, "none")])
def test_bf16_units_are_read_from_torchs_cpu_probes(monkeypatch, amx, avx512_bf16, expected):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16,
                        raising=False)
    assert hardware.cpu_bf16_units() == expected


def test_a_torch_without_the_probes_has_no_bf16_units(monkeypatch):
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported", raising=False)
    assert hardware.cpu_bf16_units() == "none"


def test_threads_are_read_at_call_time(threads_kept):
    torch.set_num_threads(1)
    assert hardware_facts()["threads"] == "1"
    torch.set_num_threads(2)
    assert hardware_facts()["threads"] == "2"


def test_a_cpu_device_has_no_gpu():
    assert hardware_facts("cpu")["gpu"] == "none"
    assert hardware_facts(torch.device("cpu"))["gpu"] == "none"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
def test_without_cuda_no_device_has_a_gpu():
    for device in (None, "auto", "cuda"):
        facts = hardware_facts(device)
        assert facts["gpu"] == "none" and facts["gpu_count"] == "0"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_device_names_its_gpu():
    name = torch.cuda.get_device_name(0)
    assert hardware_facts("cuda:0")["gpu"] == name
    assert hardware_facts("auto")["gpu"] == torch.cuda.get_device_name()
    assert hardware_facts("cpu")["gpu"] == "none"
    assert int(hardware_facts()["gpu_count"]) == torch.cuda.device_count()


def test_the_cpu_model_is_read_from_cpuinfo(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\n"
                    "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t: fpu avx512f\n\n"
                    "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n")
    monkeypatch.setattr(hardware, "CPUINFO", info)
    assert hardware_facts()["cpu"] == "Intel(R) Xeon(R) Platinum 8480+"


def test_without_cpuinfo_the_cpu_is_the_platform_processor_else_unknown(tmp_path,
                                                                        monkeypatch):
    monkeypatch.setattr(hardware, "CPUINFO", tmp_path / "absent")
    monkeypatch.setattr(hardware.platform, "processor", lambda: "x86_64")
    assert hardware_facts()["cpu"] == "x86_64"
    (tmp_path / "arm").write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")  # no model name
    monkeypatch.setattr(hardware, "CPUINFO", tmp_path / "arm")
    monkeypatch.setattr(hardware.platform, "processor", lambda: "")
    assert hardware_facts()["cpu"] == "unknown"


def test_a_fact_that_cannot_be_read_is_unknown_not_an_error(monkeypatch):
    def broken():
        raise RuntimeError("no capability here")

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", broken)
    monkeypatch.setattr(hardware.os, "cpu_count", lambda: None)
    facts = hardware_facts("not a device")
    assert facts["cpu_capability"] == facts["cpu_cores"] == facts["gpu"] == "unknown"
    assert facts["threads"] == str(torch.get_num_threads())
