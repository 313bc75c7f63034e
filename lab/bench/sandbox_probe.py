"""Which parts of the runner's sandbox a GPU machine's CUDA driver survives: each variant
(no namespace; a user namespace; + network; + mount; + a read-only root; + a read-only root
with /dev, /dev/shm and /tmp writable again) in a fresh process, then torch.cuda.init().

    python3 lab/bench/sandbox_probe.py        (on the GPU machine; needs only torch)
"""

import subprocess
import sys

CHILD = r'''
import ctypes, os, sys
from pathlib import Path
libc = ctypes.CDLL(None, use_errno=True)
v = sys.argv[1]
NEWUSER, NEWNS, NEWNET = 0x10000000, 0x00020000, 0x40000000
flags = {"none": 0, "user": NEWUSER, "user+net": NEWUSER | NEWNET, "user+ns": NEWUSER | NEWNS,
         "user+ns+ro": NEWUSER | NEWNS, "user+ns+ro+dev": NEWUSER | NEWNS}[v]
uid, gid = os.getuid(), os.getgid()
if flags:
    assert libc.unshare(flags) == 0, os.strerror(ctypes.get_errno())
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
if v.startswith("user+ns+ro"):
    class A(ctypes.Structure):
        _fields_ = [("s", ctypes.c_uint64), ("c", ctypes.c_uint64), ("p", ctypes.c_uint64), ("u", ctypes.c_uint64)]
    libc.mount(None, b"/", None, 0x4000 | (1 << 18), None)
    keep = (b"/dev", b"/dev/shm", b"/tmp") if v.endswith("dev") else ()
    for d in keep:
        libc.mount(d, d, None, 4096 | 0x4000, None)
    assert libc.syscall(442, -100, b"/", 0x8000, ctypes.byref(A(1, 0, 0, 0)), 32) == 0
    for d in keep:
        libc.syscall(442, -100, d, 0x8000, ctypes.byref(A(0, 1, 0, 0)), 32)
try:
    import torch
    torch.cuda.init()
    print(v, "OK", torch.cuda.get_device_name(), flush=True)
except Exception as e:
    print(v, "FAIL", str(e)[:160], flush=True)
'''

for variant in ["none", "user", "user+net", "user+ns", "user+ns+ro", "user+ns+ro+dev"]:
    r = subprocess.run([sys.executable, "-c", CHILD, variant], capture_output=True, text=True, timeout=120)
    out = (r.stdout + r.stderr).strip()
    print(out.splitlines()[-1] if out else f"{variant} no output")
