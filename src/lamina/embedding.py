"""Layer 3, embedding: token ids -> vectors.

    x = token_table[ids] (* scale) + position_table[positions]; then dropout

The scale is sqrt(d_model) (the original Transformer: `scale=True`) or a given number (Gemma's
sqrt(d_model) as the model's dtype rounds it: the factor is cast to the table's dtype first).

Shapes: ids (B, T) integer -> (B, T, d_model). Positions are `pos_offset + arange(T)` by
default, so a generator that feeds one token at a time keeps the stream's positions; a batch with
left padding passes explicit per-row `positions` (B, T) instead.

The position table is learned (GPT-2), a fixed sinusoidal buffer (the original Transformer,
not a parameter) or absent ("none": rotary models put positions into attention instead; the
positions are still range-checked here, and `positions_for` gives them to whoever needs them). `tie_lm_head(head)` makes an output head share the token table's storage.

Deliberately unaware of tokenizers (lamina.tokenizers, layer 2), attention and everything above.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from lamina.errors import LaminaError

PositionKind = Literal["learned", "sinusoidal", "none"]


def sinusoidal_table(length: int, d_model: int) -> Tensor:
    """The fixed (length, d_model) table of "Attention Is All You Need": sin on even, cos on odd."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
    )
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq)[:, : d_model // 2]
    return table


def check_ids(ids: Tensor, vocab_size: int) -> None:
    """Raise `LaminaError` unless `ids` is an integer (B, T) tensor with values in [0, vocab_size).

    The range check costs two reductions; it runs on CPU tensors only, where it is cheap (on
    accelerators the embedding kernel itself reports out-of-range ids).
    """
    if not isinstance(ids, Tensor):
        raise LaminaError(f"ids must be a torch.Tensor, got {type(ids).__name__}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise LaminaError(f"ids must be an integer tensor, got dtype {ids.dtype}")
    if ids.dim() != 2:
        raise LaminaError(f"ids must have shape (B, T), got {tuple(ids.shape)}")
    if ids.device.type == "cpu" and ids.numel() > 0:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise LaminaError(f"token id {bad} is outside [0, vocab_size={vocab_size})")


class Embedding(nn.Module):
    """Token table + position table (+ optional scaling, padding row and dropout).

    Args:
        vocab_size: rows of the token table.
        block_size: number of positions (the longest sequence the model accepts).
        d_model: width of each vector.
        dropout: dropout on the sum, active only in training mode.
        positions: "learned" (a parameter), "sinusoidal" (a fixed buffer) or "none" (no table).
        scale: multiply token vectors by sqrt(d_model) (True: the original Transformer does) or
            by a given positive number (cast to the table's dtype first, as Gemma's is).
        padding_idx: a token id whose row stays zero and gets no gradient.
        init_std: standard deviation of the normal initialisation.
    """

    def __init__(
        self,
        vocab_size: int,
        block_size: int,
        d_model: int,
        *,
        dropout: float = 0.0,
        positions: PositionKind = "learned",
        scale: bool | float = False,
        padding_idx: int | None = None,
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        for name, value in (
            ("vocab_size", vocab_size),
            ("block_size", block_size),
            ("d_model", d_model),
        ):
            if not isinstance(value, int) or value <= 0:
                raise LaminaError(f"{name} must be a positive integer, got {value!r}")
        if not 0.0 <= dropout < 1.0:
            raise LaminaError(f"dropout must be in [0, 1), got {dropout!r}")
        if not isinstance(scale, bool) and not (isinstance(scale, (int, float)) and scale > 0):
            raise LaminaError(f"scale must be true, false or a positive number, got {scale!r}")
        if positions not in ("learned", "sinusoidal", "none"):
            raise LaminaError(
                f"positions must be 'learned', 'sinusoidal' or 'none', got {positions!r}"
            )
        self.vocab_size, self.block_size, self.d_model = vocab_size, block_size, d_model
        self.positions, self.scale, self.init_std = positions, scale, init_std
        # tables made empty and drawn by reset_parameters (nn.Embedding's own draw is skipped)
        self.wte = nn.Embedding(
            vocab_size, d_model, padding_idx=padding_idx, _weight=torch.empty(vocab_size, d_model)
        )
        if positions == "learned":
            self.wpe: nn.Embedding | None = nn.Embedding(
                block_size, d_model, _weight=torch.empty(block_size, d_model)
            )
        else:
            self.wpe = None
            if positions == "sinusoidal":
                table = sinusoidal_table(block_size, d_model)
                self.register_buffer("pe", table, persistent=False)
        self.drop = nn.Dropout(dropout)
        self.reset_parameters()

    def init_buffers(self) -> None:
        """Compute the buffers that are never stored (the sinusoidal table): a model built on
        the meta device and given its stored tensors calls this."""
        if self.positions == "sinusoidal":
            self.pe = sinusoidal_table(self.block_size, self.d_model)

    def reset_parameters(self) -> None:
        if self.wte.weight.is_meta:  # shapes only (a model about to be given stored tensors)
            return
        nn.init.normal_(self.wte.weight, mean=0.0, std=self.init_std)
        if self.wte.padding_idx is not None:
            with torch.no_grad():
                self.wte.weight[self.wte.padding_idx].zero_()
        if self.wpe is not None:
            nn.init.normal_(self.wpe.weight, mean=0.0, std=self.init_std)

    def position_vectors(self, positions: Tensor) -> Tensor | None:
        """Position vectors for integer positions of any shape -> (*shape, d_model); None when
        the embedding has no position table (positions="none")."""
        if self.wpe is not None:
            return self.wpe(positions)
        if self.positions == "none":
            return None
        return self.pe[positions]

    def positions_for(
        self,
        T: int,
        pos_offset: int = 0,
        positions: Tensor | None = None,
        device: torch.device | str | None = None,
    ) -> Tensor:
        """The positions of T tokens: `positions` checked to lie in [0, block_size), or
        `pos_offset + arange(T)` checked not to run past block_size. (T,) or (B, T)."""
        if positions is None:
            if pos_offset < 0 or pos_offset + T > self.block_size:
                raise LaminaError(
                    f"pos_offset + T = {pos_offset} + {T} = {pos_offset + T} exceeds "
                    f"block_size {self.block_size}"
                )
            return torch.arange(pos_offset, pos_offset + T, device=device)
        if positions.device.type == "cpu" and positions.numel() > 0:
            if int(positions.min()) < 0 or int(positions.max()) >= self.block_size:
                raise LaminaError(
                    f"positions must lie in [0, block_size={self.block_size}), got "
                    f"[{int(positions.min())}, {int(positions.max())}]"
                )
        return positions

    def forward(self, ids: Tensor, pos_offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """ids (B, T) -> (B, T, d_model).

        pos_offset: the position of ids[:, 0], so a stream continues where it stopped.
        positions: explicit (B, T) or (T,) positions (e.g. from a left-padding mask); overrides
        pos_offset.
        """
        check_ids(ids, self.vocab_size)
        positions = self.positions_for(ids.shape[1], pos_offset, positions, ids.device)
        return self.embed_checked(ids, positions)

    def embed_checked(self, ids: Tensor, positions: Tensor) -> Tensor:
        """The token + position sum for ids and positions already checked by the caller (no
        host sync: what a compiled decode step calls)."""
        tok = self.wte(ids)
        if self.scale is True:
            tok = tok * math.sqrt(self.d_model)
        elif self.scale:
            tok = tok * torch.tensor(self.scale, dtype=tok.dtype)
        table = self.position_vectors(positions)
        return self.drop(tok if table is None else tok + table.to(tok.dtype))

    def tie_lm_head(self, head: nn.Linear) -> nn.Linear:
        """Make `head.weight` the very same Parameter as the token table (shared storage)."""
        if tuple(head.weight.shape) != tuple(self.wte.weight.shape):
            raise LaminaError(
                f"cannot tie a head of shape {tuple(head.weight.shape)} to a token table of "
                f"shape {tuple(self.wte.weight.shape)}"
            )
        head.weight = self.wte.weight
        return head
