"""The machine line every benchmark table prints: CPU model, its vector extensions, cores, load.

    from _machine import machine_line
    print(machine_line())   # CPU: AMD EPYC (avx2 avx512f avx512_bf16 ...), 2 cores; load 1.2 0.9 0.7

Figures from different CPUs do not compare (issue: the T5 ratios did not carry over between
machines), so each table says where it ran. Read from /proc/cpuinfo (Linux); elsewhere
`platform.processor()` and no extensions.
"""

from __future__ import annotations

import os
import platform

# The extensions that decide XLA:CPU / oneDNN / YNNPACK kernels, in print order.
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16")


def parse_cpuinfo(text: str) -> tuple[str, list[str]]:
    """(model name, the vector extensions among its flags: VECTOR_FLAGS in order, then any amx_*)."""
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    found = [f for f in VECTOR_FLAGS if f in flags] + sorted(f for f in flags if f.startswith("amx"))
    return model or platform.processor() or "unknown CPU", found


def cpu_description(cpuinfo_path: str = "/proc/cpuinfo") -> str:
    """`MODEL (ext ext ...)`, or `MODEL (no AVX2/AVX-512/AMX)`."""
    try:
        with open(cpuinfo_path) as f:
            model, found = parse_cpuinfo(f.read())
    except OSError:
        model, found = platform.processor() or "unknown CPU", []
    return f"{model} ({' '.join(found) if found else 'no AVX2/AVX-512/AMX'})"


def machine_line() -> str:
    """`CPU: <model> (<extensions>), <n> cores; load <1/5/15-minute averages>`."""
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    return f"CPU: {cpu_description()}, {os.cpu_count()} cores; load {load}"


LIBRARIES = ("models", "partitioning", "trainer", "evaluation", "datatasks", "tokenizers", "storage")
MALLOC_TUNABLES = "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"


def libraries_on_path() -> None:
    """Puts the repository's library folders in front of `sys.path` (a benchmark run as a script)."""
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [os.path.join(repo, d) for d in LIBRARIES]


def reexec_with_malloc_tuning() -> None:
    """Re-executes the script with `GLIBC_TUNABLES=MALLOC_TUNABLES` (one heap, no mmap, no trimming:
    a CPU step's fresh temporaries then cause no page faults; it cannot be set from inside Python),
    unless `--no-malloc-tuning` is given, it is set already, or this is not Linux."""
    import sys

    if "--no-malloc-tuning" in sys.argv or "GLIBC_TUNABLES" in os.environ or not sys.platform.startswith("linux"):
        return
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "GLIBC_TUNABLES": MALLOC_TUNABLES})
