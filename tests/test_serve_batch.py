"""lamina serve's continuous batch: requests decode together, each as it would alone; n
choices; log-probabilities; bounded memory; a request that finds no slot in time gets 503."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("starlette")
openai = pytest.importorskip("openai")

import torch  # noqa: E402
from chat_fixtures import ChatMLChars, talkative  # noqa: E402
from serving import live_server, request  # noqa: E402

from lamina.models import GPT, GPTConfig  # noqa: E402
from lamina.serve import Engine, Limits  # noqa: E402
from lamina.serve.sequence import Sampling, Sequence  # noqa: E402

PROMPTS = ["Hi", "Tell me about the sea, please", "What?", "A much longer question here, yes?"]


def chat_engine(scheme: str = "fp32", **limits) -> Engine:
    tok = ChatMLChars()
    torch.manual_seed(0)
    config = GPTConfig.preset("llama-tiny", vocab_size=tok.vocab_size, block_size=256)
    model = talkative(GPT(config).eval(), tok)
    if scheme == "int4":  # a batch's engine lays these out in lanes (int8 inputs where VNNI)
        from lamina import quantize

        model = quantize(model, "int4", group_size=32)
    return Engine(model, tok, Limits(max_tokens=64, **limits))


@pytest.fixture(scope="module")
def server():
    engine = chat_engine(slots=4, context=256)
    with live_server(engine) as addr:
        client = openai.OpenAI(base_url=f"http://{addr[0]}:{addr[1]}/v1", api_key="none")
        yield engine, addr, client


def ask(client, text: str, **kw):
    return client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": text}], **kw
    )


def test_requests_decode_together_and_each_gets_what_it_gets_alone(server):
    engine, _, client = server
    alone = [
        ask(client, p, max_tokens=12, temperature=0).choices[0].message.content for p in PROMPTS
    ]
    steps = engine.batcher.steps
    got: dict[int, str] = {}

    def one(i: int) -> None:
        got[i] = ask(client, PROMPTS[i], max_tokens=12, temperature=0).choices[0].message.content

    # the batch thread waits until all four are queued, so they overlap however slowly the
    # clients' requests arrive (on a loaded machine one could finish before the next came)
    gate = threading.Event()
    engine.batcher.call(gate.wait)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    until = time.monotonic() + 30
    while len(engine.batcher._waiting) < len(PROMPTS) and time.monotonic() < until:
        time.sleep(0.01)
    queued = len(engine.batcher._waiting)
    gate.set()
    for t in threads:
        t.join(timeout=30)
    assert queued == len(PROMPTS)
    assert [got.get(i) for i in range(len(PROMPTS))] == alone
    assert engine.batcher.widest >= 2  # some steps decoded several requests at once
    assert engine.batcher.steps - steps < sum(len(a) for a in alone)


def test_n_choices_are_n_sequences_seeded_one_after_another(server):
    _, _, client = server
    r = ask(client, "Hi", max_tokens=12, temperature=1.0, seed=5, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.message.content for c in r.choices]
    for i in range(3):
        alone = ask(client, "Hi", max_tokens=12, temperature=1.0, seed=5 + i)
        assert alone.choices[0].message.content == texts[i]
    assert r.usage.completion_tokens == sum(len(t) for t in texts if t) or r.usage.completion_tokens
    greedy = ask(client, "Hi", max_tokens=8, temperature=0, n=2)
    assert greedy.choices[0].message.content == greedy.choices[1].message.content


def test_logprobs_are_the_models_log_softmax(server):
    engine, addr, client = server
    r = ask(client, "Hi", max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) == 3 for c in content)
    tok = engine.tokenizer
    ids = tok.render_chat([{"role": "user", "content": "Hi"}])
    with torch.no_grad():
        ref = torch.log_softmax(engine.model(torch.tensor([ids]))[0, -1], -1)
    first = content[0]
    assert first.token == r.choices[0].message.content[0]
    assert first.logprob == pytest.approx(float(ref.max()), abs=1e-4)
    assert [t.logprob for t in first.top_logprobs] == pytest.approx(
        ref.topk(3).values.tolist(), abs=1e-4
    )
    c = client.completions.create(model="x", prompt="Hi", max_tokens=3, temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == 3 and len(lp.top_logprobs[0]) <= 2 and lp.text_offset[0] == 0
    status, _, body = request(
        addr,
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2},
    )
    assert status == 400 and body["error"]["param"] == "top_logprobs"


def test_memory_is_the_configured_slots_and_context(server):
    engine, _, _ = server
    c = engine.model.config
    k = engine.batcher.caches[0].k
    assert tuple(k.shape) == (4, c.kv_heads, 256, c.head_dim)
    assert len(engine.batcher.caches) == c.n_layers


class Slow:
    """A constraint that allows every token but takes its time (holds a slot for a while)."""

    done = False

    def allowed(self, n):
        time.sleep(0.01)
        mask = torch.ones(n, dtype=torch.bool)
        mask[list(ChatMLChars().eot_ids)] = False  # never ends by itself
        return mask

    def consume(self, token):
        pass


def test_a_request_that_finds_no_free_slot_in_time_gets_503():
    engine = chat_engine(slots=1, context=256, wait=0.3)
    with live_server(engine) as addr:
        stop = threading.Event()
        ended = threading.Event()
        hold = Sequence(
            ChatMLChars().encode("Hi"),
            Sampling(max_tokens=200, temperature=1.0),
            lambda kind, _: ended.set() if kind != "token" else None,
            constraint=Slow(),
            cancel=stop,
        )
        engine.batcher.submit(hold)
        time.sleep(0.1)
        t0 = time.perf_counter()
        status, resp, body = request(
            addr, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}]}
        )
        waited = time.perf_counter() - t0
        stop.set()
        assert status == 503 and resp.getheader("retry-after") == "1", body
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert "slot" in body["error"]["message"] and 0.25 < waited < 5
        assert ended.wait(5)
        status, _, body = request(
            addr,
            "POST",
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "a"}], "max_tokens": 3},
        )
        assert status == 200 and body["choices"][0]["finish_reason"] in ("stop", "length")


def test_slots_that_cannot_fit_are_refused_at_start(tmp_path, capsys, monkeypatch):
    from serving import TEXT

    import lamina
    import lamina.serve.app
    from lamina.cli import main
    from lamina.tokenizers import CharTokenizer

    monkeypatch.setattr(lamina.serve.app, "server", lambda *a, **k: 1 / 0)
    tok = CharTokenizer.from_text(TEXT)
    lamina.save(tmp_path / "m", GPT(GPTConfig.preset("tiny", vocab_size=tok.vocab_size)), tok)
    args = ["serve", str(tmp_path / "m"), "--port", "0", "--slots", "10000000", "--context", "64"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "KV caches for 10000000 x 32" in err and "would take" in err  # context <= block


def test_the_pytorch_step_gives_each_row_what_it_gets_alone():
    """Where the native step does not run: rows at different lengths, masked, equal to alone
    and to lamina.generate's greedy tokens."""
    import lamina.cpu
    from lamina.generation import generate
    from lamina.serve.batch import Batcher

    engine = chat_engine()
    model, tok = engine.model, engine.tokenizer
    with lamina.cpu.using("torch"):
        batcher = Batcher(model, tok, slots=4, context=128)
    assert batcher._native is None
    assert batcher.caches[0].k.dtype == torch.float32  # float16 caches only for the native step
    prompts = [tok.render_chat([{"role": "user", "content": p}]) for p in PROMPTS]

    def run(group):
        done, outs = [], []
        for ids in group:
            ended, out = threading.Event(), []

            def sink(kind, x, ended=ended, out=out):
                if kind == "token" and x.id >= 0:
                    out.append(x.id)
                if kind != "token":
                    ended.set()

            batcher.submit(Sequence(ids, Sampling(max_tokens=10, temperature=0), sink))
            done.append(ended)
            outs.append(out)
        assert all(e.wait(30) for e in done)
        return outs

    try:
        alone = [run([ids])[0] for ids in prompts]
        assert run(prompts) == alone and batcher.widest >= 2
        with lamina.cpu.using("torch"):
            ref = generate(model, torch.tensor([prompts[1]]), 10, stop=list(tok.eot_ids))
        assert alone[1] == ref[0, len(prompts[1]) :].tolist()
    finally:
        batcher.close()


@pytest.mark.parametrize("scheme", ["fp32", "int4"])
def test_prompt_rests_that_ride_the_native_step_decode_as_alone(scheme):
    """Short prompt rests (a prompt's tail after a shared prefix) ride the native step as extra
    entries while a long rest goes through the PyTorch prefill: each request's greedy tokens
    equal what it gets alone, and the same as with every prompt prefilled by PyTorch. int4: the
    engine's linears in lanes, whose int8 inputs (decode.c's lanes8) round otherwise than the
    PyTorch prefill's; so the two paths' tokens agree only where no near-tie parts them: on
    this random model, greedy margins of 2e-4 to 1e-3 nats decide two of the tokens, and the
    float16 caches (the default) tip one of them, so int4 runs over float32 caches here (the
    float16 caches' batch independence: test_native_batch.py, and `fp32` here)."""
    from lamina import native
    from lamina.generation.conversation import common_prefix
    from lamina.serve.batch import Batcher

    engine = chat_engine(scheme)
    model, tok = engine.model, engine.tokenizer
    batcher = Batcher(model, tok, slots=4, context=160, ride=20, kv16=scheme == "fp32")
    if batcher._native is None:
        batcher.close()
        pytest.skip(f"native step not available here: {native.reason()}")
    assert batcher.caches[0].k.dtype == (torch.float16 if scheme == "fp32" else torch.float32)
    system = "You are a terse helper who answers about the sea. "
    prompts = [
        tok.render_chat([{"role": "user", "content": system + q}])
        for q in ("Hi", "Why?", "Tell me about waves, tides, currents and storms, at length")
    ]

    def run(group):
        done, outs = [], []
        for ids in group:
            ended, out = threading.Event(), []

            def sink(kind, x, ended=ended, out=out):
                if kind == "token" and x.id >= 0:
                    out.append(x.id)
                if kind != "token":
                    ended.set()

            batcher.submit(Sequence(ids, Sampling(max_tokens=10, temperature=0), sink))
            done.append(ended)
            outs.append(out)
        assert all(e.wait(30) for e in done)
        return outs

    try:
        first = run([prompts[0]])  # longer than `ride`: the PyTorch prefill
        assert batcher.rode == 0
        alone = [first[0], *(run([ids])[0] for ids in prompts[1:])]
        assert batcher.rode == len(prompts[1]) - common_prefix(prompts[0], prompts[1])
        rode = batcher.rode
        assert run(prompts) == alone and batcher.widest >= 2  # each finds its row: rests of 1
        assert batcher.rode > rode
        batcher.ride = 0  # every prompt through the PyTorch prefill
        for row in batcher.rows:
            row.ids.clear()  # nothing cached: each prompt prefilled whole
        assert run(prompts) == alone
    finally:
        batcher.close()


def _resident_mb() -> float:
    from pathlib import Path

    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def test_kv_rows_are_resident_only_as_they_fill():
    """lazy_caches: the caches make_caches gives (shapes, zeros), their memory committed by the
    OS as rows are written, not slots x context at once."""
    from pathlib import Path

    from lamina.serve.kv_rows import lazy_caches

    if not Path("/proc/self/status").exists():
        pytest.skip("needs Linux's /proc to read resident memory")
    config = GPTConfig(vocab_size=50, block_size=512, d_model=64, n_heads=4, n_layers=4)
    model = GPT(config).eval()
    ref = model.make_caches(2, 512)
    before = _resident_mb()
    caches = lazy_caches(model, 64, 512)  # 4 layers x 2 x 64 x 4 x 512 x 16 floats: 64 MiB
    assert _resident_mb() - before < 16
    assert len(caches) == len(ref) and caches[0].k.shape == (64, *ref[0].k.shape[1:])
    assert caches[0].k.dtype == ref[0].k.dtype and float(caches[0].v.abs().sum()) == 0.0
    for c in caches:
        c.k.fill_(1.0), c.v.fill_(1.0)
    assert _resident_mb() - before > 48
    assert float(caches[3].k[63, -1, -1, -1]) == 1.0
