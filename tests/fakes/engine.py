"""An engine adapter for the search loop's tests: a real process (the
streaming server of ``tests.fakes.llm_server``) that starts in milliseconds.
Its space: a per-token delay, a flag that makes the start fail (as a config
the engine refuses) and a slot count the adapter refuses above 6."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qtune.engines.base import (
    Engine,
    Failure,
    LaunchSpec,
    Param,
    SpaceContext,
    classify_by_patterns,
)

ROOT = Path(__file__).parent.parent.parent


class FakeEngine(Engine):
    name = "fake"

    def space(self, ctx: SpaceContext) -> list[Param]:
        return [Param("delay_ms", "choice", choices=(1, 30)),
                Param("crash", "bool"),
                Param("slots", "int", low=1, high=8)]

    def baseline(self, ctx: SpaceContext) -> tuple[dict[str, Any], str | None]:
        return {}, None

    def check(self, params: Mapping[str, Any], ctx: SpaceContext) -> list[str]:
        return ["slots > 6 is refused"] if params.get("slots", 0) > 6 else []

    def launch_spec(self, params: Mapping[str, Any], ctx: SpaceContext, *, host: str,
                    port: int) -> LaunchSpec:
        argv = [sys.executable, "-m", "tests.fakes.llm_server", str(port),
                ctx.model.served_name, "--delay-ms", str(params.get("delay_ms", 10))]
        if params.get("crash"):
            argv.append("--crash")
        argv += ["--port", str(port)]  # verify rewrites --port
        return LaunchSpec(tuple(argv), {"PYTHONPATH": str(ROOT)}, host, port,
                          ctx.model.served_name)

    def leaves_out(self, name: str, value: Any) -> bool:
        return name == "slots"  # only check() reads it: never in the command

    def classify(self, log_text: str) -> Failure:
        return classify_by_patterns(log_text, [(r"No available memory", "oom")])
