"""The sm_90a machine code of a quack-compiled object, for tests that compare builds
without a GPU: the cubin inside quack's host object, disassembled by nvdisasm (which the
cutlass-dsl wheel brings as nvidia-cuda-nvdisasm)."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;")


def nvdisasm() -> Path:
    import nvidia

    found = [p for d in nvidia.__path__ for p in Path(d).glob("cu*/bin/nvdisasm")]
    if not found:
        raise FileNotFoundError("no nvdisasm in the environment (nvidia-cuda-nvdisasm, a dependency of the "
                                "cutlass-dsl wheel)")
    return found[0]


def sass_of(obj: Path, line_info: bool = False) -> str:
    """nvdisasm's text of the object's cubin: the second ELF header in quack's host object,
    NVIDIA's machine 190. line_info: each instruction's source line as nvdisasm -g prints it
    (objects built with CUTE_DSL_LINEINFO=1: bench.precompile --lineinfo)."""
    data = Path(obj).read_bytes()
    at = [i for i in range(1, len(data) - 20) if data[i:i + 4] == b"\x7fELF" and data[i + 18] == 190]
    if not at:
        raise ValueError(f"{obj}: no cubin inside")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(data[at[0]:])
        f.flush()
        return subprocess.run([str(nvdisasm()), *(["-g"] if line_info else []), "-c", f.name],
                              capture_output=True, text=True, check=True).stdout


def instructions(sass: str) -> list[str]:
    """The instruction stream, without addresses, encodings, labels or symbol names."""
    return _INSTRUCTION.findall(sass)
