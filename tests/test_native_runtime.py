"""lamina.native.runtime: a GGUF model decoded by decode.c with no torch in the process, held
to the torch path's native engine (lamina.native.step on `lamina.open`'s model): a prompt's
logits, 32 greedy tokens, the real model's reply; what it covers, and its numpy sampling."""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import lamina
from lamina.generation.pick import pick as sample
from lamina.native.gguf_model import uncovered
from lamina.native.gguf_read import read_gguf
from lamina.native.runtime import Runtime

FIXTURES = Path(__file__).parent / "fixtures"
CONTEXT = 128
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]

pytestmark = pytest.mark.skipif(
    Runtime.uncovered(FIXTURES / "kquant-Q8_0.gguf") is not None,
    reason="the native runtime does not run here",
)


def _reference(model, ids: list[int], new: int) -> tuple[np.ndarray, list[int]]:
    """The torch path's native engine: the prompt's last logits and `new` greedy tokens."""
    from lamina.native.step import native_step

    caches = model.make_caches(1, CONTEXT, dtype=torch.float16)
    engine = native_step(model, caches)
    assert engine is not None
    n = len(ids)
    logits = engine.step_entries(ids, list(range(n)), [0] * n)[-1]
    for c in caches:
        c.pos = n
    first, tokens = logits.numpy().copy(), []
    for i in range(new):
        tokens.append(int(logits.argmax()))
        logits = engine.step([tokens[-1]], [n + i], [0])[0]
    return first, tokens


@contextlib.contextmanager
def _integer_kernels() -> Iterator[None]:
    """decode.c's integer kernels at every row count (lm_gemm_bf16(0)) and a chunk's attention
    in float (lm_patt_bf16(0)), on both sides: a prompt of 16 entries or more is otherwise
    multiplied in bf16 (~1e-2 of the largest logit; its own tests are test_native_gemm.py's
    and test_native_prefill.py's)"""
    lib = lamina.native.build.library()
    before = lib.lm_gemm_bf16(-1), lib.lm_patt_bf16(-1)
    lib.lm_gemm_bf16(0), lib.lm_patt_bf16(0)
    try:
        yield
    finally:
        lib.lm_gemm_bf16(before[0]), lib.lm_patt_bf16(before[1])


def _check(path: Path, ids: list[int], new: int = 32, model=None) -> Runtime:
    rt = Runtime.open(path, cache_len=CONTEXT, threads=1)
    model = lamina.open(path).model if model is None else model
    with _integer_kernels():
        want_logits, want_tokens = _reference(model, ids, new)
        got = rt.feed(ids)
        rt.forget(0)
        tokens = list(rt.generate(ids, new))
    scale = np.abs(want_logits).max()
    # the runtime reads a Q8_0 table and head as GGML's blocks where the torch path makes int8
    # rows of them, and feeds a prompt in chunks: the kernels round their inputs apart (~1e-3
    # of the largest logit on the real model, ~3e-5 on the fixtures)
    assert np.abs(got - want_logits).max() < 5e-3 * scale, np.abs(got - want_logits).max()
    assert tokens == want_tokens
    return rt


@pytest.mark.parametrize("qtype", ["Q4_K_M", "Q8_0"])
def test_a_chunks_head_runs_for_its_last_entries_alone(qtype: str) -> None:
    """lm_step_last: the head for a chunk's last `keep` entries only, the caches written as
    lm_step writes them (every entry's head), those entries' logits the same."""
    path = FIXTURES / f"kquant-{qtype}.gguf"
    ids = [5, 17, 200, 3, 99, 41, 7, 250, 1, 64, 12, 33, 8]
    n = len(ids)
    every, last, three = (Runtime.open(path, cache_len=CONTEXT, threads=2) for _ in range(3))
    full = every._call(ids, 0, keep=n).copy()
    assert np.array_equal(three._call(ids, 0, keep=3), full[-3:])  # several rows: one form
    got = last._call(ids, 0, keep=1)[0].copy()
    # one row: the head's one-row kernel, which rounds its inputs apart (~1e-7 of the largest)
    assert np.abs(got - full[-1]).max() < 1e-5 * np.abs(full[-1]).max()
    assert got.argmax() == full[-1].argmax()
    for (k1, v1), (k2, v2) in zip(every.weights.caches, last.weights.caches, strict=True):
        assert np.array_equal(k1, k2) and np.array_equal(v1, v2)
    assert k2[0, :, n - 1].any() and not k2[0, :, n].any()  # the chunk's slots, and no more
    every.cached, last.cached = list(ids), list(ids)
    after = [list(rt.generate([*ids, int(got.argmax())], 6)) for rt in (every, last)]
    assert after[0] == after[1]
    with pytest.raises(lamina.LaminaError, match="native step failed"):
        last._call(ids, 0, keep=0)  # decode.c's refusal
    with pytest.raises(lamina.LaminaError, match="1..n logits"):
        last._call(ids, 0, keep=n + 1)


@pytest.fixture(scope="module")
def real(smollm2_gguf: Path) -> Runtime:
    return Runtime.open(smollm2_gguf, cache_len=CONTEXT, threads=1)


@pytest.fixture(scope="module")
def bundle(smollm2_gguf: Path):
    """The torch path's reading of the real model, once for the module."""
    return lamina.open(smollm2_gguf)


@pytest.mark.parametrize("qtype", ["Q4_K_M", "Q8_0", "Q6_K", "Q5_K_M"])
def test_kquant_fixtures_match_the_torch_paths_engine(qtype: str) -> None:
    path = FIXTURES / f"kquant-{qtype}.gguf"
    _check(path, [5, 17, 200, 3, 99, 41, 7, 250, 1, 64, 12])


def test_the_real_model_matches_the_torch_paths_engine(real: Runtime, bundle, smollm2_gguf) -> None:
    ids = real.render_chat(MESSAGES)
    rt = _check(
        smollm2_gguf, ids, model=bundle.model
    )  # Q4_1 as int4 rows, a Q8_0 table read in place
    # a prompt in several chunks is the same causal prefill
    with _integer_kernels():
        rt.forget(0)
        whole = rt.feed(ids)
        rt.forget(0)
        parts = rt.feed(ids, chunk=5)
    assert np.allclose(whole, parts, atol=1e-3 * np.abs(whole).max())


def test_the_real_models_reply_is_lamina_opens(real: Runtime, bundle) -> None:
    from lamina.generation import generate

    ids = real.render_chat(MESSAGES)
    assert ids == bundle.tokenizer.render_chat(MESSAGES, add_generation_prompt=True)
    assert (real.bos_id, real.eos_id, real.eot_ids) == (
        bundle.bos_id,
        bundle.eos_id,
        bundle.eot_ids,
    )
    want = generate(bundle.model, torch.tensor([ids]), 24, temperature=0)[0, len(ids) :]
    got = list(real.generate(ids, 24, stop=set(real.eot_ids)))
    assert got == want[: len(got)].tolist() and got[-1] in real.eot_ids
    assert "Paris" in real.tokenizer.decode(got)
    # a second turn keeps the cached prefix: only the new ids run
    more = [*ids, *got, *real.tokenizer.encode("\nThanks")]
    before = len(real.cached)
    next(real.generate(more, 1))
    assert before == len(ids) + len(got) - 1 and len(real.cached) == len(more)


def test_the_runtime_never_imports_torch(smollm2_gguf) -> None:
    code = (
        "import sys\n"
        "from lamina.native.runtime import Runtime\n"
        f"rt = Runtime.open({str(smollm2_gguf)!r}, cache_len=64, threads=1)\n"
        "ids = rt.render_chat([{'role': 'user', 'content': 'Hi'}])\n"
        "print(len(list(rt.generate(ids, 4))))\n"
        "from lamina.cli import main\n"  # and `lamina sample` on the default path
        f"main(['sample', {str(smollm2_gguf)!r}, '--prompt', 'Hi', '--max-new-tokens', '4'])\n"
        "assert 'torch' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("4\nHi") and done.stderr == ""


def test_what_it_does_not_cover_is_named() -> None:
    c = read_gguf(FIXTURES / "kquant-Q8_0.gguf")
    assert uncovered(c) is None
    scaled = {**c.metadata, "llama.rope.scaling.type": "linear"}
    assert "rope.scaling.type" in uncovered(dataclasses.replace(c, metadata=scaled))
    gemma = {**c.metadata, "general.architecture": "gemma2"}
    assert "gemma2" in uncovered(dataclasses.replace(c, metadata=gemma))
    bias = next(iter(c.tensors.values()))
    tensors = {**c.tensors, "blk.0.attn_q.bias": bias}
    assert "attn_q.bias" in uncovered(dataclasses.replace(c, tensors=tensors))
    assert Runtime.uncovered(FIXTURES / "make_kquants.py") is not None  # not a GGUF file
    with pytest.raises(lamina.LaminaError, match="not covered"):
        Runtime(dataclasses.replace(c, metadata=gemma), lamina.native.build.library())


def test_sampling_keeps_to_the_torch_rule() -> None:
    from lamina.generation.sampling import probabilities

    rng = np.random.default_rng(0)
    logits = rng.standard_normal(50).astype(np.float32) * 3
    assert sample(logits) == int(logits.argmax())
    assert sample(logits, 0.7, top_k=1, rng=rng) == int(logits.argmax())
    for temperature, top_k, top_p in ((1.0, 5, None), (0.8, None, 0.5), (1.3, 10, 0.9)):
        allowed = probabilities(torch.from_numpy(logits)[None], temperature, top_k, top_p)[0] > 0
        drawn = {sample(logits, temperature, top_k, top_p, rng) for _ in range(300)}
        assert drawn <= set(np.flatnonzero(allowed.numpy()).tolist())
        assert len(drawn) > 1
    with pytest.raises(lamina.LaminaError):
        sample(logits, -1.0)


def test_lamina_sample_prints_on_the_runtime_what_the_torch_path_prints(smollm2_gguf, capsys):
    from lamina.cli import main

    flags = ["--prompt", "The capital of France is", "--temperature", "0", "--num-samples", "2"]
    printed = []
    for engine in ("runtime", "torch"):
        args = ["sample", str(smollm2_gguf), *flags, "--max-new-tokens", "12", "--engine", engine]
        assert main(args) == 0
        out = capsys.readouterr()
        printed.append(out.out)
        assert "note" not in out.err
    assert printed[0] == printed[1] and printed[0].startswith("The capital of France is")
    first, second = printed[0].split("-" * 40)  # the second sample reused the cached prompt
    assert first.strip() == second.strip()


def test_the_engine_is_chosen_by_file_and_flags(capsys, tmp_path) -> None:
    from argparse import Namespace

    from lamina.cli.engine import open_runtime

    path = FIXTURES / "kquant-Q8_0.gguf"
    auto, forced = Namespace(engine="auto"), Namespace(engine="runtime")
    assert isinstance(open_runtime(auto, "sample", path, {"--compile": False}), Runtime)
    assert open_runtime(auto, "sample", path, {"--compile": True}) is None
    note = "lamina sample: note: the torch path runs the model: --compile needs the torch path\n"
    assert capsys.readouterr().err == note
    with pytest.raises(lamina.LaminaError, match="--engine runtime: --compile needs"):
        open_runtime(forced, "sample", path, {"--compile": True})
    assert open_runtime(Namespace(engine="torch"), "chat", path, {}) is None
    assert open_runtime(auto, "chat", tmp_path, {}) is None  # a folder: the torch path, no note
    assert capsys.readouterr().err == ""
    with pytest.raises(lamina.LaminaError, match="reads GGUF files only"):
        open_runtime(forced, "chat", tmp_path, {})
    uncovered_file = tmp_path / "x.gguf"
    uncovered_file.write_bytes(b"GGUF")  # a header cut short: named, the torch path runs
    assert open_runtime(auto, "chat", uncovered_file, {}) is None
    assert "does not cover this file" in capsys.readouterr().err
