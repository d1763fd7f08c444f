"""decode.c's structs in ctypes, torch-free: what a runtime fills and the kernel reads.

    Lin, Layer, Model          the C structs (build.py compares their layout with decode.c's)
    LIN_*, GGML_KINDS, ACTIVATIONS    the kinds and activations decode.c numbers
    aligned_bytes(n)           a 64-byte aligned numpy buffer of n bytes (decode.c's vector loads)
    Keep()                     pointers into buffers for the structs, each buffer kept alive:
                               `keep.address(numpy_array)`, `keep.parts(n)` for LIN_PARTS

The structs hold pointers into a model's own buffers (read in place, no copy); a `Keep`
keeps every buffer (and every array of parts) it pointed at alive as long as it lives, so its
owner keeps it beside the structs. The torch side (a module's tensors -> a `Lin`) is
pointers.py; the numpy side (a GGUF file's blocks) is runtime.py's.

Deliberately unaware of torch, of which models the step covers (coverage.py) and of running it.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from lamina.native.build import expect_layout


def aligned_bytes(nbytes: int) -> np.ndarray:
    """A 64-byte aligned uint8 buffer of nbytes (a view into a slightly larger one)."""
    raw = np.empty(nbytes + 64, np.uint8)
    at = -raw.ctypes.data % 64
    return raw[at : at + nbytes]


LIN_F32, LIN_INT4, LIN_INT8, LIN_PARTS = 0, 1, 2, 9
# GGML's blocks as a GGUF file holds them (lamina.quant.kquant), read by decode.c as stored
GGML_KINDS = {"Q4_K": 3, "Q5_K": 4, "Q6_K": 5, "Q8_0": 6, "Q5_0": 7, "Q5_1": 8}
ACTIVATIONS = {"gelu": 0, "relu": 1, "relu2": 2, "swiglu": 3}
_p = ctypes.c_void_p


class Lin(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in ("kind", "n", "k", "gs")] + [
        ("w", _p),
        ("s", _p),
        ("mn", _p),
        ("bias", _p),
        ("lw", _p),  # int4: the weights in lanes (lm_pack16), or NULL; then w, s, mn NULL;
        # Q4_K: w itself where its rows are in lanes (lm_kq_pack16)
        ("ls", _p),
        ("lmn", _p),
    ]


class Layer(ctypes.Structure):
    _fields_ = [(n, _p) for n in ("n1w", "n1b", "n2w", "n2b", "qg", "kg")] + [
        ("qkv", Lin),
        ("proj", Lin),
        ("fc", Lin),
        ("out", Lin),
        ("kc", _p),
        ("vc", _p),
    ]


class Model(ctypes.Structure):
    _fields_ = (
        [
            (n, ctypes.c_int32)
            for n in ("n_layers", "d", "H", "Hkv", "hd", "ff", "vocab", "cache_len")
        ]
        + [(n, ctypes.c_int32) for n in ("norm", "act", "qk_norm", "rope")]
        + [(n, ctypes.c_float) for n in ("eps", "emb_scale", "softcap")]
        + [(n, ctypes.c_int32) for n in ("emb_kind", "emb_gs", "kv16")]
        + [(n, _p) for n in ("emb_w", "emb_s", "pos_table", "inv_freq", "nfw", "nfb")]
        + [("head", Lin), ("layers", ctypes.POINTER(Layer))]
    )


expect_layout(Lin=Lin, Layer=Layer, Model=Model)  # build.py compares decode.c's with these


class Keep:
    """Buffers the structs point into, kept alive here (`keep` for the buffers, `structs` for
    the arrays of parts of LIN_PARTS linears)."""

    def __init__(self) -> None:
        self.keep: list[Any] = []
        self.structs: list[ctypes.Array[Lin]] = []

    def address(self, a: Any) -> int | None:
        """The address of a C-contiguous numpy array's data (None for None), kept alive."""
        if a is None:
            return None
        if not a.flags.c_contiguous:
            raise ValueError("decode.c reads contiguous buffers only")
        self.keep.append(a)
        return int(a.ctypes.data)

    def parts(self, n: int) -> ctypes.Array[Lin]:
        """An array of n `Lin` (a LIN_PARTS linear's parts), kept alive."""
        array = (Lin * n)()
        self.structs.append(array)
        return array
