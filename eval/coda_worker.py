"""The `coda` baseline's worker: CODA's own kernels (coda-kernels 0.2), run in a process of
their own with their own quack, timed by eval.timing's procedure and answering the judge
over eval.channel (eval/coda.py starts it and says why it is apart).

    judge -> worker   {"op": "setup", "task", "dims", "scalars", "sets": [[TensorRef, ...], ...]}
                      {"op": "check", "set": j, "outputs": [TensorRef, ...]}   outputs of set j into these
                      {"op": "time", "set": j}                                -> {"us": ...}
                      {"op": "close"}
    worker -> judge   first {"versions": {...}} (or {"error": ...} when CODA does not import),
                      then one reply per request: {"ok": true, ...} or {"error": "..."}

Every tensor is the judge's (eval.channel's shared pool); the worker allocates only what
CODA's own functions allocate, the per-set operands derived from constant inputs (frequency
tables), and int32 copies of index inputs, refreshed before each timed call, outside its
events. Imports only torch, pydantic, eval.channel, eval.timing and CODA: never epiforge's
primitives or quack.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback

#: task -> (the CODA functions it calls, what differs from the task); eval/coda.py shows the text
CONVENTIONS = {
    "k3": "gemm_rope (CODA's RoPE epilogue): the same pairs and direction; its frequency operand is one value "
          "per output column, so q and k columns get inv_freq tiled over heads and v columns 0 (cos 1, sin 0: "
          "unchanged)",
    "k3hf": "gemm_rope as for k3, with the frequencies negated: CODA rotates by -positions * freq, this task by +",
    "k8": "gemm_swiglu: the same interleaved (gate, up) columns; stores z and out as the task does",
    "k9": "gemm_lse_select_logits (per-tile log-sum-exp and the target logit in the epilogue, then quack's "
          "cross_entropy_fwd_out folds the tiles): loss and lse as the task; it also returns the target logit; "
          "targets as int32 (converted before each timed call, outside its events)",
    "k9l": "gemm_lse (logits and per-row lse stored by the epilogue), then loss = lse - the stored logit at the "
           "target (a torch gather and subtract inside the timed call): the logit it reads is the rounded one, "
           "where the task's loss comes from the unrounded logits",
    "qkn": "gemm_qkv_sqsum (per-head sums of squares in the epilogue, the pre-norm projection stored) then "
           "qknorm_rope_fwd, a second kernel that reads it back, normalizes and rotates: not one fused epilogue. "
           "CODA has one norm weight for q and k heads, the task two: qknorm_rope_fwd runs once per half, each "
           "with its weight; frequencies negated (CODA rotates by -positions * freq) and tiled over heads; "
           "positions as int32 (converted before each timed call, outside its events)",
}


#: outputs CODA computes through an intermediate it rounds to the run's precision where the task
#: does not: task -> {output: what it rounds}. eval/coda.py holds them to a relative RMS bound
#: (ROUNDED_RMS) instead of the task's tolerance, and reports their error in the note.
ROUNDED = {
    "k9": {"loss": "lse minus the target logit rounded to the run's precision (CODA stores it so)"},
    "k9l": {"loss": "lse minus the stored (rounded) logit at the target"},
    "qkn": {"qk": "normalized and rotated from the pre-activation stored in the run's precision, where the "
                  "task's epilogue uses the unrounded accumulator"},
}


class _Mapping:
    """One input set's CODA call: `before()` (untimed: index conversions), `call()` -> outputs."""

    def __init__(self, task: str, x: dict, dims: dict, scalars: dict):
        import torch

        self.x, self.dims, self.scalars = x, dims, scalars
        self.int32 = {}
        self.task = task
        if task in ("k3", "k3hf"):
            d, hd = dims["d"], dims["head_dim"]
            inv = x["inv_freq"].float()
            sign = 1.0 if task == "k3" else -1.0
            per_col = inv.repeat_interleave(2).repeat(2 * d // hd) * sign  # q and k columns, pairs share one value
            self.freq = torch.cat([per_col, torch.zeros(d, dtype=torch.float32, device=inv.device)])
        elif task == "k9":  # CODA's select takes int32 targets (k9l's gather takes the task's own)
            self.int32["targets"] = torch.empty(x["targets"].shape, dtype=torch.int32, device=x["targets"].device)
        elif task == "qkn":
            d, hd = dims["d"], dims["head_dim"]
            self.heads = d // hd
            self.freq = (-x["inv_freq"].float()).repeat(self.heads).contiguous()
            self.int32["positions"] = torch.empty(x["positions"].shape, dtype=torch.int32,
                                                  device=x["positions"].device)
        elif task not in ("k8", "k9l"):
            raise ValueError(f"CODA has no kernel for task {task!r}")

    def before(self) -> None:
        for name, buf in self.int32.items():
            buf.copy_(self.x[name])

    def call(self) -> dict:
        from coda.core.gemm import functional as G

        x = self.x
        if self.task in ("k3", "k3hf"):
            return {"qkv": G.gemm_rope(x["a"], x["w_qkv"].mT, pos=x["positions"], freq=self.freq)}
        if self.task == "k8":
            z, out = G.gemm_swiglu(x["a"], x["w_gu"].mT)
            return {"z": z, "out": out}
        if self.task == "k9":
            loss, lse, _ = G.gemm_lse_select_logits(x["a"], x["w_lm"].mT, target=self.int32["targets"],
                                                    ignore_index=-100, return_lse=True)
            return {"loss": loss, "lse": lse}
        if self.task == "k9l":
            logits, lse = G.gemm_lse(x["a"], x["w_lm"].mT)
            picked = logits.gather(1, x["targets"][:, None]).squeeze(1)
            return {"loss": lse - picked.float(), "lse": lse, "logits": logits}
        from coda.core.elementwise.functional import qknorm_rope_fwd

        import torch

        d, hd, h = self.dims["d"], self.dims["head_dim"], self.heads
        s = G._sqsum_num_segments(hd)  # per-head partial sums, one per tile segment
        pre, ssq = G.gemm_qkv_sqsum(x["a"], x["w_qk"].mT, head_dim=hd, num_segments=s)
        qk = torch.empty_like(pre)
        for half, weight in ((0, x["q_norm_weight"]), (1, x["k_norm_weight"])):
            cols, segs = slice(half * d, (half + 1) * d), slice(half * h * s, (half + 1) * h * s)
            qknorm_rope_fwd(x=pre[:, cols], ssq=ssq[:, segs], gamma=weight, pos=self.int32["positions"],
                            freq=self.freq, head_dim=hd, num_heads_qk=h, num_segments=s,
                            eps=float(self.scalars["eps"]), y=qk[:, cols])
        return {"qk": qk}


def versions() -> dict:
    import importlib.metadata as m

    found = {}
    for name in ("coda-kernels", "quack-kernels", "nvidia-cutlass-dsl", "torch"):
        try:
            found[name] = m.version(name)
        except m.PackageNotFoundError:
            found[name] = None
    return found


def serve(sock: socket.socket) -> None:
    from epiforge.eval import channel
    from epiforge.eval.timing import timed_call

    import torch

    maps: list[_Mapping] = []
    while True:
        try:
            msg, fds = channel.receive(sock)
        except channel.ChannelClosed:
            return
        channel._close_all(fds)
        op = msg.get("op")
        try:
            if op == "close":
                channel.send(sock, {"ok": True})
                return
            if op == "setup":
                t0 = time.perf_counter()
                torch.empty(1, device="cuda")  # this thread's CUDA context, current before the IPC opens
                sets = [{r["name"]: channel.attach(channel.TensorRef(**r), []) for r in refs} for refs in msg["sets"]]
                maps = [_Mapping(msg["task"], x, msg["dims"], msg["scalars"]) for x in sets]
                for m in maps:  # the first call of each set: CODA's autotuning and compiles
                    m.before()
                    m.call()
                torch.cuda.synchronize()
                channel.send(sock, {"ok": True, "built_s": round(time.perf_counter() - t0, 3)})
            elif op == "check":
                m = maps[int(msg["set"])]
                m.before()
                got = m.call()
                for r in msg["outputs"]:
                    dst = channel.attach(channel.TensorRef(**r), [])
                    dst.copy_(got[r["name"]])
                torch.cuda.synchronize()
                channel.send(sock, {"ok": True})
            elif op == "time":
                m = maps[int(msg["set"])]
                m.before()
                torch.cuda.synchronize()
                channel.send(sock, {"ok": True, "us": timed_call(m.call)})
            else:
                channel.send(sock, {"error": f"unknown op {op!r}"})
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            channel.send(sock, {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]})


def main() -> int:
    import ctypes
    import signal

    try:  # die with the judge
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != int(sys.argv[2]):
        return 1
    sock = socket.socket(fileno=int(sys.argv[1]))
    from epiforge.eval import channel

    try:
        import coda.core.elementwise.functional  # noqa: F401
        import coda.core.gemm.functional  # noqa: F401
    except Exception as e:
        channel.send(sock, {"error": f"CODA does not import: {type(e).__name__}: {e}".splitlines()[0][:300],
                            "versions": versions()})
        return 2
    channel.send(sock, {"versions": versions()})
    serve(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
