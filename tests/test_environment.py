"""What a figure was made with (obliq/eval/results.py ``environment``): the CPU's model and instruction sets,
and how llama.cpp was built, beside the package versions (issue 54 §4)."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from obliq.eval.results import cpu, cpu_from_cpuinfo, environment, environment_text, llama_cpp_build, made_with

EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512dq avx512_bf16 avx512_vnni avx512vl
processor\t: 1
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512dq avx512_bf16 avx512_vnni avx512vl
"""
SAPPHIRE = "model name\t: Intel Xeon 8480+\nflags\t: avx2 avx_vnni avx512f avx512_vnni amx_tile amx_int8\n"


def test_cpuinfo_is_read_into_the_model_and_the_instruction_sets_that_decide_kernels():
    isa = ["AVX2", "AVX-512 F", "AVX-512 VNNI", "AVX-512 BF16"]
    assert cpu_from_cpuinfo(EPYC) == {"model": "AMD EPYC 9B14", "isa": isa}
    assert cpu_from_cpuinfo(SAPPHIRE)["isa"] == ["AVX2", "AVX-512 F", "AVX-512 VNNI", "AVX-VNNI", "AMX", "AMX-INT8"]
    assert cpu_from_cpuinfo("model name : Old\nflags : sse2 avx\n")["isa"] == []  # none: said, not unknown
    assert cpu_from_cpuinfo("processor : 0\n") == {"model": "unknown", "isa": "unknown"}
    assert cpu_from_cpuinfo("processor : 0\nFeatures : fp asimd sve\n")["isa"] == []  # Arm
    assert cpu_from_cpuinfo("") == {"model": "unknown", "isa": "unknown"}


@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="reads Linux's /proc/cpuinfo")
def test_this_machine_s_cpu_as_proc_cpuinfo_lists_it():
    """Checked against the file's own flags line (the first processor's), set by set."""
    text = Path("/proc/cpuinfo").read_text()
    flags = next(line for line in text.splitlines() if line.startswith("flags")).split(":", 1)[1].split()
    found = cpu()
    assert ("AVX2" in found["isa"]) == ("avx2" in flags)
    assert ("AVX-512 BF16" in found["isa"]) == ("avx512_bf16" in flags)
    assert ("AMX" in found["isa"]) == ("amx_tile" in flags)
    assert found["model"] in text


def test_every_report_line_names_the_cpu_and_the_llama_cpp_build():
    env = environment()
    line = made_with()
    assert line.startswith(f"Made with: Python {platform.python_version()} ({platform.machine()}); CPU ")
    assert env["cpu"]["model"] in line
    assert all(name in line for name in env["cpu"]["isa"]) if isinstance(env["cpu"]["isa"], list) else True
    if env["llama_cpp"] is not None:
        assert f"llama.cpp {env['llama_cpp']['build']} build (" in line
    old = {"python": "3.11.7", "machine": "x86_64", "obliq": "0.1.0", "packages": {"torch": "2.13.0"}}
    assert environment_text(old) == "Python 3.11.7 (x86_64); CPU unknown (unknown); obliq 0.1.0, torch 2.13.0"


def test_the_llama_cpp_build_is_read_from_the_installed_library():
    """llama.cpp's own system info: compiled features; one CPU library: the native build ``make install`` makes."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="the llamacpp extra (make install builds it)")
    built = llama_cpp_build()
    info = llama_cpp.llama_print_system_info().decode()
    assert built["features"] and all(f"{f} = 1" in info for f in built["features"])
    variants = list((Path(llama_cpp.__file__).parent / "lib").glob("libggml-cpu-*.so"))
    assert built["build"] == ("portable" if variants else "native")
