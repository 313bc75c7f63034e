"""The wire between the judge and the kernel runner: framed JSON over a Unix socket, and
tensors in memory both processes map (never pickled, never copied through the socket).

Frames: a 4-byte big-endian length, then that many bytes of JSON (at most MAX_FRAME).
A frame may carry file descriptors (SCM_RIGHTS) with its first bytes.

Tensors: each shared tensor is its own allocation, described by a `TensorRef`:
  CPU   a memfd the judge creates and sends with the frame; both sides mmap it
  CUDA  a CUDA IPC handle of a judge allocation (the driver's cuIpcGetMemHandle, without
        pickle) and the tensor's offset in it. The judge allocates shared tensors from a
        private memory pool (MemPool), so a runner that maps a handle's whole segment finds
        only other shared tensors there, never the judge's references.
The judge owns every shared tensor (inputs it fills, output buffers the runner fills);
the runner only attaches. Nothing the runner sends is unpickled or executed: replies are
JSON checked against pydantic models by the judge (eval/remote.py).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import socket
import struct
import time

import torch
from pydantic import BaseModel, ConfigDict, Field

MAX_FRAME = 4 * 2**20
MAX_FDS = 64
_HEADER = struct.Struct(">I")

#: dtypes that may travel (by name); anything else in a message is refused
DTYPES = {
    "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64,
    "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
    "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class ChannelClosed(ConnectionError):
    """The other side closed the socket (or died)."""


class ChannelTimeout(TimeoutError):
    """No whole frame arrived before the deadline."""


class ChannelError(ValueError):
    """A frame that is not one of ours: too long, not JSON, not an object."""


# ---- frames -----------------------------------------------------------------------------------


def send(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_FRAME:
        raise ChannelError(f"a frame of {len(data)} bytes is over the {MAX_FRAME}-byte limit")
    payload = _HEADER.pack(len(data)) + data
    try:
        if fds:
            sent = socket.send_fds(sock, [payload], list(fds))
            sock.sendall(payload[sent:])
        else:
            sock.sendall(payload)
    except (BrokenPipeError, ConnectionResetError) as e:
        raise ChannelClosed(str(e)) from None


def receive(sock: socket.socket, deadline: float | None = None) -> tuple[dict, list[int]]:
    """One frame: (message, received fds). Raises ChannelClosed, ChannelTimeout, ChannelError."""
    fds: list[int] = []
    header = _read(sock, _HEADER.size, deadline, fds)
    (length,) = _HEADER.unpack(header)
    if length > MAX_FRAME:
        _close_all(fds)
        raise ChannelError(f"a frame announced {length} bytes, over the {MAX_FRAME}-byte limit")
    body = _read(sock, length, deadline, fds)
    try:
        message = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        _close_all(fds)
        raise ChannelError("a frame that is not JSON") from None
    if not isinstance(message, dict):
        _close_all(fds)
        raise ChannelError("a frame that is not a JSON object")
    return message, fds


def _read(sock: socket.socket, n: int, deadline: float | None, fds: list[int]) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChannelTimeout("no reply in time")
            sock.settimeout(remaining)
        else:
            sock.settimeout(None)
        try:
            data, new_fds, flags, _ = socket.recv_fds(sock, n - got, MAX_FDS)
        except socket.timeout:
            raise ChannelTimeout("no reply in time") from None
        except (ConnectionResetError, OSError) as e:
            raise ChannelClosed(str(e)) from None
        fds.extend(new_fds)
        if flags & getattr(socket, "MSG_CTRUNC", 0):
            _close_all(fds)
            raise ChannelError(f"more than {MAX_FDS} descriptors on one frame")
        if not data:
            _close_all(fds)
            raise ChannelClosed("the other side closed the channel")
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


# ---- shared tensors ---------------------------------------------------------------------------


class TensorRef(BaseModel):
    """Where a shared tensor lives and what it is. CPU: `fd` indexes the frame's
    descriptors. CUDA: `ipc` holds torch's IPC tuple (bytes as hex)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=200)
    dtype: str
    shape: list[int] = Field(max_length=8)
    device: str = Field(pattern=r"^(cpu|cuda)$")
    fd: int | None = None
    ipc: list | None = None


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


_POOL = None


def _pool():
    """The judge's private CUDA memory pool for shared tensors (see the module docstring)."""
    global _POOL
    if _POOL is None:
        _POOL = torch.cuda.MemPool()
    return _POOL


class _CudaIpc:
    """CUDA IPC through the driver API (libcuda), not torch's: torch's pairs every shared
    storage with a reference-count file the consumer must open (root-only when the judge is
    root and the runner is not) and keeps a producer's block until its consumer lets go."""

    class Handle(ctypes.Structure):
        _fields_ = [("reserved", ctypes.c_char * 64)]

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.opened: dict[str, int] = {}

    def _ok(self, code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"{what} failed (CUresult {code})")

    def export(self, ptr: int) -> tuple[str, int]:
        """(handle of the allocation holding ptr, ptr's offset in it)."""
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        self._ok(self.lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)),
                 "cuMemGetAddressRange")
        handle = self.Handle()
        self._ok(self.lib.cuIpcGetMemHandle(ctypes.byref(handle), base), "cuIpcGetMemHandle")
        return ctypes.string_at(ctypes.addressof(handle), 64).hex(), ptr - base.value

    def open(self, handle_hex: str) -> int:
        """The base address of another process's allocation in this one (opened once)."""
        if handle_hex not in self.opened:
            handle = self.Handle()
            ctypes.memmove(ctypes.addressof(handle), bytes.fromhex(handle_hex), 64)
            ptr = ctypes.c_uint64()
            self._ok(self.lib.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), handle, ctypes.c_uint(1)), "cuIpcOpenMemHandle")
            self.opened[handle_hex] = ptr.value
        return self.opened[handle_hex]


_IPC: _CudaIpc | None = None


def _ipc() -> _CudaIpc:
    global _IPC
    if _IPC is None:
        _IPC = _CudaIpc()
    return _IPC


class _DeviceMemory:
    """A raw device range as torch sees one (__cuda_array_interface__: no copy, no ownership)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def shared_empty(shape, dtype: torch.dtype, device: str):
    """A new tensor the other process can map. Returns (tensor, handle): on the CPU the
    handle is the memfd (keep it to send; the mapping stays valid after it is closed)."""
    shape = tuple(int(s) for s in shape)
    nbytes = max(1, _numel(shape) * dtype.itemsize)
    if device == "cpu":
        fd = os.memfd_create("epiforge-tensor", os.MFD_CLOEXEC)
        os.ftruncate(fd, nbytes)
        buf = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        flat = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes)
        return flat[: _numel(shape) * dtype.itemsize].view(dtype).view(shape), fd
    with torch.cuda.use_mem_pool(_pool()):
        t = torch.empty(shape, dtype=dtype, device="cuda")
    return t, None


def describe(name: str, tensor: torch.Tensor, fd: int | None, fd_index: int | None) -> TensorRef:
    """The TensorRef of a tensor made by shared_empty."""
    base = dict(name=name, dtype=DTYPE_NAMES[tensor.dtype], shape=list(tensor.shape))
    if tensor.device.type == "cpu":
        return TensorRef(**base, device="cpu", fd=fd_index)
    if tensor.numel() == 0:
        return TensorRef(**base, device="cuda", ipc=None)
    handle, offset = _ipc().export(tensor.data_ptr())
    return TensorRef(**base, device="cuda", ipc=[handle, offset])


def attach(ref: TensorRef, fds: list[int]) -> torch.Tensor:
    """The runner's view of a shared tensor (its memory is the judge's)."""
    dtype = DTYPES[ref.dtype]
    n = _numel(ref.shape)
    if ref.device == "cpu":
        fd = fds[ref.fd]
        nbytes = max(1, n * dtype.itemsize)
        buf = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        flat = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes)
        return flat[: n * dtype.itemsize].view(dtype).view(ref.shape)
    if ref.ipc is None or n == 0:
        return torch.empty(ref.shape, dtype=dtype, device="cuda")
    handle, offset = str(ref.ipc[0]), int(ref.ipc[1])
    torch.cuda.init()
    base = _ipc().open(handle)
    flat = torch.as_tensor(_DeviceMemory(base + offset, n * dtype.itemsize), device="cuda")
    return flat.view(dtype).view(ref.shape)
