"""`bench mock`: a mock OpenAI-compatible streaming server with a set TTFT, ITL and length."""

from __future__ import annotations

import typer

from harness.measure.mock.server import MockConfig, run
from harness.show.console import fail, notes


def main(
    port: int = typer.Option(8100, help="TCP port to listen on."),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    ttft_ms: float = typer.Option(20.0, help="Time from a request's arrival to its first token."),
    itl_ms: float = typer.Option(5.0, help="Time between tokens (0: all at once)."),
    output_tokens: int = typer.Option(
        256, help="Tokens per response unless the request sets max_tokens with ignore_eos."
    ),
    shards: int = typer.Option(
        1, help="Processes sharing the port (SO_REUSEPORT); /stats is per process."
    ),
    model: str = typer.Option("mock", help="Model name reported at /v1/models."),
    max_output: int | None = typer.Option(
        None,
        help="The most tokens a reply streams, whatever the request asks (0: a broken server"
        " that answers 200 with no tokens).",
    ),
) -> None:
    """Serve POST /v1/completions (SSE streaming), /health, /v1/models and /stats."""
    if ttft_ms < 0 or itl_ms < 0 or output_tokens < 0 or (max_output or 0) < 0:
        fail("--ttft-ms, --itl-ms, --output-tokens and --max-output must be >= 0")
    if shards < 1 or (shards > 1 and port == 0):
        fail("--shards must be >= 1, and sharding needs a fixed --port")
    config = MockConfig(ttft_ms, itl_ms, output_tokens, model, max_output)
    console = notes()

    def ready(server) -> None:
        console.print(
            f"mock: {server.url} (ttft {ttft_ms} ms, itl {itl_ms} ms, {output_tokens} tokens, "
            f"{shards} process(es))"
        )

    try:
        run(config, host, port, shards, ready)
    except OSError as e:
        fail(f"cannot listen on {host}:{port} ({e.strerror}); pick another --port")
