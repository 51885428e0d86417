"""The device class: the vector extension read from /proc/cpuinfo, and the bf16-emulation warning."""

from __future__ import annotations

import pytest

from gate.device import bf16_emulation_note, cpu_isa, device_class, host_record, numerics_difference

AVX2_EPYC = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n"
ZEN4 = (
    "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
)
SAPPHIRE = "model name\t: Intel(R) Xeon(R)\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"
GRAVITON2 = "processor\t: 0\nFeatures\t: fp asimd\n"


@pytest.mark.parametrize("cpuinfo, isa", [(AVX2_EPYC, "avx2"), (ZEN4, "avx512-bf16"), (SAPPHIRE, "amx-bf16"),
                                          (GRAVITON3, "arm-bf16"), (GRAVITON2, "neon"), ("model name\t: x\n", "unknown")])  # fmt: skip
def test_the_best_extension_is_named(cpuinfo, isa):
    assert cpu_isa(cpuinfo) == isa


def test_two_hosts_with_one_model_name_are_two_device_classes(monkeypatch):
    """A VM prints "AMD EPYC" for both: the extension tells them apart (and their bf16 numbers)."""
    import gate.device as device

    classes = []
    for cpuinfo in (AVX2_EPYC, ZEN4):
        monkeypatch.setattr(device, "_cpuinfo", lambda c=cpuinfo: c)
        classes.append(device_class())
    assert classes[0]["cpu"] == classes[1]["cpu"] and classes[0]["isa"] != classes[1]["isa"]


def test_bf16_without_native_support_is_told():
    note = bf16_emulation_note(["float32", "bfloat16"], "avx2", [])
    assert note is not None and note.startswith(
        "warning: bf16 on a CPU without native bf16 or AVX-512 (avx2;"
    )
    assert "263 s on 2 AVX2 cores" in note and "may not hold here" in note
    assert bf16_emulation_note(["bf16"], "neon", []) is not None  # the short spelling too


@pytest.mark.parametrize("dtypes, isa, gpus", [
    (["float32", ""], "avx2", []),                  # nothing in bf16
    (["bfloat16"], "avx512-bf16", []),              # native
    (["bfloat16"], "amx-bf16", []),
    (["bfloat16"], "avx512", []),                   # converts in wide registers; not measured slow
    (["bfloat16"], "avx2", ["NVIDIA H200, 143771 MiB, 580.1"]),  # the engine and the trainer run on the GPU
])  # fmt: skip
def test_no_warning_where_bf16_is_native_or_absent(dtypes, isa, gpus):
    assert bf16_emulation_note(dtypes, isa, gpus) is None


_AMX = {"machine": "x86_64", "cpu": "AMD EPYC", "isa": "amx-bf16", "gpus": []}
_AVX512 = _AMX | {"isa": "avx512-bf16"}


@pytest.mark.parametrize("recorded, current, dtype, differs", [
    (_AVX512, _AMX, "bfloat16", True),       # measured: 2.7e-2 nats apart on SmolLM2
    (_AVX512, _AMX, "float16", True),
    (_AVX512, _AVX512 | {"cpu": "Intel Xeon"}, "bfloat16", False),  # the model name is only noted
    (_AVX512, _AMX, "float32", False),       # fp32: the thresholds' floors
    (_AVX512, _AMX | {"gpus": ["NVIDIA H100"]}, "bfloat16", False),  # GPU runs: calibrated noise
    (None, _AMX, "bfloat16", False),         # a baseline from before hosts were recorded
    ("amx-bf16", _AMX, "bfloat16", False),   # a run.json off a pull request: not the recorded shape
])  # fmt: skip
def test_bf16_numbers_carry_over_only_on_the_same_cpu_extension(recorded, current, dtype, differs):
    note = numerics_difference(recorded, current, dtype)
    assert (note is not None) == differs
    if differs:
        assert note.startswith(f"CPU class amx-bf16 != baseline avx512-bf16: {dtype} kernels")


def test_the_host_record_is_the_device_class_without_the_core_count():
    record = host_record()
    assert record.keys() == device_class().keys() - {"cpus"} and record["isa"] == cpu_isa()
