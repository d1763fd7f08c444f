"""When a request's tokens leave the batch thread: the stream interval.

    Pace(post, n, every)          for one request of n choices; post(item) hands an item on
        .sink(i, kind, payload)   choice i's event from the batch (`Sequence`'s sink, on the
                                  batch thread)
    every_for(setting, batcher) -> (() -> int)    the interval to use now

Each event the batch thread hands to the event loop costs the loop a wake-up of the request's
coroutine, and each chunk a streamed reply writes wakes its client; with several streams
decoding, those wake-ups run on the same cores as the step. So a choice's tokens are held and
posted together, as one ("tokens", [Token, ...]) item, every `every()` tokens (1: each token
at once), as vLLM's and SGLang's `--stream-interval` do. The first token that has text is
posted at once (the time to the first token is unchanged), and whatever is held goes out
before a choice's "done", "error" or "busy" (nothing is lost when a sequence ends, fails or is
cancelled). A held group waits while its text is still empty (an incomplete character): its
tokens travel with the next. `every=None` holds everything after the first token until the
end (a reply that is not streamed, or sent whole because it may be a tool call).

`every_for(None, batcher)`, the default: 1 while at most one sequence decodes, `SHARED` while
several share the step (the cores are then the bottleneck, and what each wake-up costs comes
out of the step); an explicit setting is used as it is.

Deliberately unaware of HTTP and of OpenAI's shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lamina.errors import LaminaError
from lamina.serve.sequence import Token

SHARED = 4  # the default interval while several sequences decode together


def check_interval(value: Any) -> int | None:
    """A stream interval setting: None (adaptive) or an int >= 1; LaminaError otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LaminaError(
            f"stream_interval must be an integer >= 1 (1: every token), got {value!r}"
        )
    return value


def every_for(setting: int | None, batcher: Any) -> Callable[[], int]:
    """The interval to use now: `setting` (checked by `Limits`), or (None) 1 while at most one
    of `batcher`'s rows decodes and SHARED while several do."""
    if setting is not None:
        return lambda: setting
    return lambda: SHARED if batcher.decoding > 1 else 1


class Pace:
    """One request's held tokens; see the module docstring. Used on the batch thread only."""

    def __init__(
        self, post: Callable[[tuple[int, str, Any]], None], n: int, every: Callable[[], int] | None
    ) -> None:
        self.post, self.every = post, every
        self.held: list[list[Token]] = [[] for _ in range(n)]
        self.texty = [False] * n  # whether choice i's held tokens have text
        self.started = [False] * n  # whether choice i's first text went out

    def sink(self, i: int, kind: str, payload: Any) -> None:
        held = self.held[i]
        if kind == "token":
            held.append(payload)
            self.texty[i] = self.texty[i] or bool(payload.text)
            if not self.texty[i]:
                return
            if self.started[i] and (self.every is None or len(held) < self.every()):
                return
            self.started[i] = True
        self._send(i)
        if kind != "token":
            self.post((i, kind, payload))

    def _send(self, i: int) -> None:
        if self.held[i]:
            held, self.held[i], self.texty[i] = self.held[i], [], False
            self.post((i, "tokens", held))
