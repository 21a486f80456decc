"""`python -m engine serve SCENARIO [--size NAME] [--host H] [--port N] [--set k=v,...]`.

The harness calls this entry point on other git revisions too: keep its flags stable.
"""

from __future__ import annotations

import argparse
import logging
import sys

from engine.config import ConfigError, load_served, parse_overrides
from engine.env import EnvError, phase_timing_period


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start an API server and its worker")
    serve.add_argument("scenario", help="scenario name (scenarios/NAME.yaml) or a YAML path")
    serve.add_argument("--size", default=None, help="model size; default: by machine")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--set",
        dest="overrides",
        default=None,
        help="model and engine overrides, e.g. engine.mixing=true,engine.max_rows=64",
    )
    serve.add_argument("--server-id", default=None, help="label for span records")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        served = load_served(args.scenario, args.size, parse_overrides(args.overrides))
        period = phase_timing_period()  # read here once; the worker is handed it
    except (ConfigError, EnvError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from engine.serve import ServeError, serve

    try:
        return serve(served, args.host, args.port, args.server_id, period=period)
    except ServeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
