"""The batch thread's hand-over pieces: `Mail` (events onto an event loop's queues from another
thread) and `_scan` (each row's max and argmax)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch

from lamina.serve.batch import _scan
from lamina.serve.workers import Mail


def test_mail_delivers_every_item_in_order_from_another_thread() -> None:
    async def main() -> list[tuple[str, int]]:
        loop = asyncio.get_running_loop()
        box = Mail(loop)
        a: asyncio.Queue = asyncio.Queue()
        b: asyncio.Queue = asyncio.Queue()

        def producer() -> None:
            for i in range(50):
                box.post(a if i % 2 else b, i)

        t = threading.Thread(target=producer)
        t.start()
        got = []
        for _ in range(50):
            done, _pending = await asyncio.wait(
                [asyncio.ensure_future(q.get()) for q in (a, b)],
                timeout=5,
                return_when=asyncio.FIRST_COMPLETED,
            )
            assert done, "an item did not arrive"
            got.extend(("a" if f.result() % 2 else "b", f.result()) for f in done)
            for q in (a, b):  # what else came
                while not q.empty():
                    got.append(("a" if q is a else "b", q.get_nowait()))
            if len(got) >= 50:
                break
        t.join()
        return got

    got = asyncio.run(main())
    values = [v for _, v in got]
    assert sorted(values) == list(range(50))
    for name in "ab":
        mine = [v for n, v in got if n == name]
        assert mine == sorted(mine)  # each queue's items in the order posted


def test_mail_refuses_once_its_loop_has_closed() -> None:
    loop = asyncio.new_event_loop()
    box = loop.run_until_complete(_make(loop))
    q: asyncio.Queue = asyncio.Queue()
    loop.close()
    with pytest.raises(RuntimeError):
        box.post(q, 1)


async def _make(loop: asyncio.AbstractEventLoop) -> Mail:
    return Mail(loop)


def test_scan_gives_numpys_max_and_first_argmax() -> None:
    nan, inf = float("nan"), float("inf")
    rows = torch.tensor(
        [[1.0, 3.0, 3.0, 2.0], [1.0, nan, 5.0, nan], [-inf, -inf, -inf, -inf], [0.0, inf, 1.0, 2.0]]
    )
    peaks, best = _scan(rows)
    ref = rows.numpy()
    np.testing.assert_array_equal(np.array(peaks), ref.max(-1))
    assert best == ref.argmax(-1).tolist() == [1, 1, 0, 1]
    peak, one = _scan(rows[0])
    assert (peak, one) == (3.0, 1)
    peaks, best = _scan(torch.randn(3, 1000, dtype=torch.bfloat16))
    assert len(peaks) == len(best) == 3
