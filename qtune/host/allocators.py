"""Which malloc replacements this host has (tcmalloc, jemalloc): a host
fact, offered by the engines that preload one (vLLM's CPU build:
``qtune.engines.vllm_cpubind``)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["find_allocators"]

# Where distributions put the allocators (Debian/Ubuntu multiarch, RHEL).
LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64",
            "usr/lib")
# In the order vLLM's docs prefer them; the first file found per allocator.
_ALLOCATORS = (("tcmalloc", ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")),
               ("jemalloc", ("libjemalloc.so.2",)))


def find_allocators(root: Path = Path("/")) -> dict[str, str]:
    """{allocator: absolute path of its shared library} found on the host."""
    out: dict[str, str] = {}
    for name, files in _ALLOCATORS:
        for d in LIB_DIRS:
            hit = next((f for f in files if (root / d / f).is_file()), None)
            if hit:
                out[name] = "/" + d + "/" + hit
                break
    return out
