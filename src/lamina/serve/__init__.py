"""The local playground: a web page and a small HTTP API over one trained model.

    lamina serve RUN [--port 8000]      (binds 127.0.0.1; another host needs --allow-remote)

    from lamina.serve import Engine, Limits, create_app, server

The page (static/index.html, app.js, style.css: plain HTML and JavaScript shipped inside the
package, no build step, nothing fetched from the internet) has a prompt box, sampling controls,
text streamed token by token, and, once the text is complete, a clickable view: click a token
to see each head's attention from it and the model's top-k alternatives for it.

The HTTP API, for the page and for scripts alike:

    GET  /api/info        {"layers", "heads", "block_size", "vocab_size", "limits": {...}}
    POST /api/generate    {"prompt": str, "max_tokens": int, "temperature": float >= 0,
                           "top_k": int | null, "top_p": float in (0, 1] | null,
                           "seed": int | null}            (all but prompt optional)
        -> text/event-stream of server-sent events:
           event: start   data: {"prompt_tokens", "seed"}
           event: token   data: {"index", "id", "text"}   one per generated token ("text" is
                                  the new text; "" while a multi-byte character is incomplete)
           event: done    data: {"reason": "length" | "cancelled", "tokens", "text",
                                  "seconds", "tokens_per_s"}
           event: error   data: {"error"}                 (instead of done, if it failed)
    POST /api/attention   {"text": str}
        -> {"tokens": [labels], "ids", "cut": tokens dropped from the front (only the last
            min(block_size, limits.attention_tokens) are looked at), "layers", "heads",
            "maps": [layer][head][query][key <= query] (the causal rows, keys 0..query),
            "patterns": [layer][head] {"name", "score", "caption", "scores"},
            "table": [position] {"token", "top": [{"token", "id", "p"}], "actual", "p_actual"}}

Bad requests get 400 with {"error": "..."} naming the field (malformed JSON, unknown fields, a
prompt over the limit, negative temperature, max_tokens over the limit, characters outside the
vocabulary). The playground's jobs run one at a time on a worker thread; the OpenAI-compatible
/v1 API (`openai_api.py`, fields in `chat_service.py`, its JSON in `answers.py`, a stream's
pace in `pacing.py`) decodes its requests together in a
continuous batch (`batch.py`: `Limits.slots` KV-cache rows of `Limits.context` tokens), with
`response_format` grammars (`grammar.py`, llguidance) and tool calls (`tools.py`). At most
`Limits.queue` requests are admitted (running or waiting, both APIs) and further requests get
503 with Retry-After at once; uvicorn answers 503 past `Limits.max_connections` open
connections. A client that disconnects stops its generation at the next token.

Every request first passes `guard.Guard`: a Host header that is not a loopback name (DNS
rebinding) or an Origin of another site gets 403 {"error"}, unless `--allow-origin` or
LAMINA_ORIGINS (comma-separated, `*` wildcards) names that origin, as Ollama's OLLAMA_ORIGINS
does. Ctrl-C cancels every open stream, so each ends with its final event before the server
stops.

Why Starlette + uvicorn: small, well kept ASGI pieces (Starlette's streaming responses notice a
client leaving and cancel the stream, which is how generations stop), no template engine or ORM
to carry, and uvicorn has a connection limit built in. Optional: `pip install lamina[serve]`.

Layer: above generation and inspect (it uses both); below the command line. Deliberately
unaware of training and of how a run directory is laid out (the command loads the model).
"""

from lamina.serve.engine import Busy, Engine, GenerateRequest, Limits

__all__ = ["Busy", "Engine", "GenerateRequest", "Limits", "create_app", "server"]


def __getattr__(name: str):  # noqa: ANN202 - the app needs starlette, an optional extra
    if name in ("create_app", "server"):
        from lamina.serve import app

        return getattr(app, name)
    raise AttributeError(name)
