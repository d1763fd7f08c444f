"""Levers on lamina's eager bf16 step at shape A, each alone, interleaved with nanoGPT's step.

    python bench/step_levers.py [--levers a,b] [--rounds 40] [--steps 3]

Every lever is lamina's default step (bench/step.py's "lamina": `--dtype auto`, bf16 autocast,
fp32 fused attention while training, fused AdamW, clip 1.0) with one thing changed; none of
them is lamina's code (they patch a model built here), so a lever that wins can be measured
before it is built. The variants run in rounds of `--steps` steps each, in rotating order, so
that the machine's fast and slow windows meet them all; per variant the median ms/step, its
20th percentile (the fast windows) and both as ratios over nanoGPT's.

  +attn-node      the attention core (split, casts, fp32 flash forward and backward, cast
                  back) as one autograd Function: qkv (B, T, 3C) bf16 in, (B, T, C) bf16 out,
                  three casts in, one gradient buffer out (no cat), the same kernels
  +attn-node-1    the same, with one cast of the whole qkv before the split
  +attn-math      the attention as batched matmuls over all heads in fp32 with the causal
                  mask a constant (baddbmm, softmax, bmm; backward: four bmm and softmax's)
  +weights-once   the block weights cast to bf16 once a step by one foreach copy (their
                  gradients cast back by one), the fp32 master weights stepped as before
  +clip-foreach   clip_grad_norm_(..., foreach=True)
  +bf16-linears   bound, not a default: the blocks' Linear weights stored in bf16 (no casts,
                  bf16 gradients and AdamW state for them)
  +pure-bf16      bound, not a default: the whole model in bf16, no autocast
Gradients: +attn-node, +attn-node-1 and +weights-once give the default's bit for bit (checked
by --check); +attn-math differs by fp32 rounding.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import types

import step as S
import torch
from machine import cpu_line
from torch import Tensor

FWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
LEVERS = ("+attn-node", "+attn-node-1", "+attn-math", "+weights-once", "+clip-foreach",
          "+bf16-linears", "+pure-bf16")  # fmt: skip


class FlashNode(torch.autograd.Function):
    """qkv (B, T, 3 H hd) -> causal attention (B, T, H hd) in qkv's dtype, fp32 flash inside."""

    @staticmethod
    def forward(ctx, qkv: Tensor, heads: int, scale: float, one_cast: bool) -> Tensor:
        B, T, W = qkv.shape
        hd = W // (3 * heads)
        if one_cast:
            q, k, v = (p.transpose(1, 2) for p in qkv.float().view(B, T, 3, heads, hd).unbind(2))
        else:
            parts = qkv.view(B, T, 3, heads, hd).unbind(2)
            q, k, v = (p.transpose(1, 2).float() for p in parts)
        out, lse = FWD(q, k, v, 0.0, True, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale, ctx.dtype = scale, qkv.dtype
        return out.transpose(1, 2).reshape(B, T, heads * hd).to(qkv.dtype)

    @staticmethod
    def backward(ctx, g: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        B, H, T, hd = q.shape
        go = g.view(B, T, H, hd).transpose(1, 2).float()
        grads = BWD(go, q, k, v, out, lse, 0.0, True, scale=ctx.scale)
        d = torch.empty((B, T, 3, H, hd), dtype=ctx.dtype)
        for i, t in enumerate(grads):
            d[:, :, i].copy_(t.transpose(1, 2))
        return d.view(B, T, 3 * H * hd), None, None, None


class MathNode(torch.autograd.Function):
    """The same contract, as batched matmuls over the B H heads in fp32, P saved."""

    @staticmethod
    def forward(ctx, qkv: Tensor, heads: int, scale: float, mask: Tensor) -> Tensor:
        B, T, W = qkv.shape
        hd = W // (3 * heads)
        buf = torch.empty((3, B, heads, T, hd))
        buf.copy_(qkv.view(B, T, 3, heads, hd).permute(2, 0, 3, 1, 4))
        q, k, v = buf.view(3, B * heads, T, hd).unbind(0)
        with torch.autocast("cpu", enabled=False):  # fp32 matmuls, as the flash kernel's
            p = torch.softmax(torch.baddbmm(mask, q, k.transpose(1, 2), alpha=scale), -1)
            o = torch.bmm(p, v).view(B, heads, T, hd).transpose(1, 2)
        ctx.save_for_backward(buf, p)
        ctx.scale, ctx.dtype = scale, qkv.dtype
        return o.reshape(B, T, heads * hd).to(qkv.dtype)

    @staticmethod
    def backward(ctx, g: Tensor):
        buf, p = ctx.saved_tensors
        _, B, H, T, hd = buf.shape
        q, k, v = buf.view(3, B * H, T, hd).unbind(0)
        go = g.view(B, T, H, hd).transpose(1, 2).float().reshape(B * H, T, hd)
        with torch.autocast("cpu", enabled=False):
            dv = torch.bmm(p.transpose(1, 2), go)
            ds = torch._softmax_backward_data(torch.bmm(go, v.transpose(1, 2)), p, -1, p.dtype)
            ds.mul_(ctx.scale)
            grads = torch.stack((torch.bmm(ds, k), torch.bmm(ds.transpose(1, 2), q), dv))
        d = torch.empty((B, T, 3, H, hd), dtype=ctx.dtype)
        d.copy_(grads.view(3, B, H, T, hd).permute(1, 3, 0, 2, 4))
        return d.view(B, T, 3 * H * hd), None, None, None


def patch_attention(model: torch.nn.Module, lever: str) -> None:
    T = model.config.block_size
    mask = torch.full((T, T), float("-inf")).triu_(1)
    for block in model.blocks:

        def forward(self, x, padding_mask=None, need_weights=False, cache=None, rope=None):
            qkv = self.qkv(x)
            if lever == "+attn-math":
                return self.proj(MathNode.apply(qkv, self.n_heads, self.scale, mask)), None
            one = lever == "+attn-node-1"
            return self.proj(FlashNode.apply(qkv, self.n_heads, self.scale, one)), None

        block.attn.forward = types.MethodType(forward, block.attn)


class CastAll(torch.autograd.Function):
    """fp32 tensors -> bf16 copies in one foreach copy; gradients back to fp32 in one."""

    @staticmethod
    def forward(ctx, *ws: Tensor) -> tuple[Tensor, ...]:
        out = [torch.empty(w.shape, dtype=torch.bfloat16) for w in ws]
        torch._foreach_copy_(out, list(ws))
        return tuple(out)

    @staticmethod
    def backward(ctx, *gs: Tensor) -> tuple[Tensor, ...]:
        out = [torch.empty(g.shape, dtype=torch.float32) for g in gs]
        torch._foreach_copy_(out, list(gs))
        return tuple(out)


def build(name: str, s: dict) -> S.Step:
    if name in ("nanogpt", "lamina"):
        return S.build(name, s)
    m = S.lamina_model(s)
    lins = [mod for mod in m.modules() if isinstance(mod, torch.nn.Linear) and mod is not m.head]
    amp = S.bf16_autocast
    if name.startswith("+attn"):
        patch_attention(m, name)
    elif name == "+bf16-linears":
        for mod in lins:
            mod.weight.data = mod.weight.data.bfloat16()
    elif name == "+pure-bf16":
        m, amp = m.bfloat16(), None
    opt = S.build_optimizer(m, lr=1e-3)
    if name not in ("+weights-once", "+clip-foreach"):
        return S.stepper(m, S.full_loss, opt, amp or S.nullcontext)[0]
    weights = [mod.weight for mod in lins]
    foreach = name == "+clip-foreach"

    def step(x: Tensor, y: Tensor) -> float:
        with amp():
            if not foreach:
                for mod, w in zip(lins, CastAll.apply(*weights), strict=True):
                    mod._parameters["weight"] = w
            try:
                loss = S.full_loss(m, x, y)
            finally:
                for mod, w in zip(lins, weights, strict=True):
                    mod._parameters["weight"] = w
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0, foreach=True if foreach else None)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step


def check(s: dict, levers: list[str]) -> None:
    x, y = S.batches(s)

    def grads(name: str) -> dict[str, Tensor]:
        torch.manual_seed(0)
        m = S.lamina_model(s)
        if name.startswith("+attn"):
            patch_attention(m, name)
        with S.bf16_autocast():
            S.full_loss(m, x, y).backward()
        return {n: p.grad for n, p in m.named_parameters()}

    base = grads("lamina")
    for v in (v for v in levers if v.startswith("+attn")):
        g = grads(v)
        diff = max((g[n] - base[n]).abs().max().item() for n in base)
        print(f"{v}: largest gradient difference from the default {diff:.3g}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levers", default=",".join(LEVERS))
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--check", action="store_true", help="compare the attention levers' grads")
    args = p.parse_args()
    s = S.SHAPES["A"]
    levers = [v for v in args.levers.split(",") if v]
    print(f"machine: {cpu_line()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    if args.check:
        return check(s, levers)
    names = ["nanogpt", "lamina", *levers]
    x, y = S.batches(s)
    fns = {n: build(n, s) for n in names}
    for f in fns.values():
        f(x, y), f(x, y)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            for _ in range(args.steps):
                t0 = time.perf_counter()
                fns[n](x, y)
                times[n].append(time.perf_counter() - t0)
    p20 = {n: sorted(t)[len(t) // 5] for n, t in times.items()}
    med = {n: statistics.median(t) for n, t in times.items()}
    print(f"shape A, {args.rounds} rounds x {args.steps} steps, load {os.getloadavg()[0]:.1f}")
    print("| variant | ms/step (median) | vs nanoGPT | p20 ms | p20 vs nanoGPT |")
    print("|---|---:|---:|---:|---:|")
    for n in names:
        r, r20 = med["nanogpt"] / med[n], p20["nanogpt"] / p20[n]
        print(f"| {n} | {med[n] * 1e3:.1f} | {r:.2f}x | {p20[n] * 1e3:.1f} | {r20:.2f}x |")


if __name__ == "__main__":
    main()
