"""SIGTERM drains the server: nothing new admitted, running requests end, then the process exits 0.

SGLang 0.5.23 already drains on SIGTERM: `TokenizerManager.sigterm_handler` sets `gracefully_exit`,
`/health` and `/health_generate` answer 503 from then on (load balancers and SMG stop routing), and
`sigterm_watchdog` waits for the running requests, stops the schedulers and the HTTP server. Two gaps
are filled here:
- it still admits new requests while draining: `DrainGate` answers them 503 with Retry-After;
- it waits for running requests without bound: after `SGLANG_DFLASH_DRAIN_S` seconds the ones left
  are aborted (finish reason `abort`, a clean end for the client) so the pod ends within the
  Kubernetes grace period (deploy/base/deployment.yaml: terminationGracePeriodSeconds).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from sglang_dflash import env

logger = logging.getLogger(__name__)

POLL_S = 0.2
# After the aborts: the scheduler frees each aborted request at its next step.
ABORT_WAIT_S = 10.0
# A draining server never takes requests again; the client should retry soon, through the load
# balancer, which by then routes to another replica.
RETRY_AFTER_S = 1
# Read-only and control paths stay open while draining: probes, metrics, server info, and aborts of
# requests already running.
OPEN_POSTS = ("/abort_request",)


class DrainGate:
    """ASGI middleware: while the tokenizer manager drains, a request that could start work gets 503."""

    def __init__(self, app, tokenizer_manager):
        self.app, self.tokenizer_manager = app, tokenizer_manager

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.tokenizer_manager.gracefully_exit and admits_work(scope):
            body = json.dumps(
                {"error": {"message": "server is shutting down (SIGTERM); retry on another replica", "code": 503}}
            ).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"retry-after", str(RETRY_AFTER_S).encode()),
                (b"content-length", str(len(body)).encode()),
            ]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


def admits_work(scope) -> bool:
    return scope.get("method", "GET") not in ("GET", "HEAD", "OPTIONS") and scope.get("path") not in OPEN_POSTS


def setup_http_server(server_args, tokenizer_manager, *args, **kwargs):
    """BEFORE hook on http_server._setup_and_run_http_server: the gate goes on the app before it starts."""
    from sglang.srt.entrypoints.http_server import app

    app.add_middleware(DrainGate, tokenizer_manager=tokenizer_manager)


async def sigterm_watchdog(original, self):
    """AROUND hook on TokenizerManager.sigterm_watchdog: bound the drain, then SGLang's own shutdown
    (it finds no request left and stops the schedulers and the HTTP server at once)."""
    while not self.gracefully_exit:
        await asyncio.sleep(POLL_S)
    grace = env.DRAIN_S.get()
    deadline = time.monotonic() + grace
    while self.rid_to_state and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
    if self.rid_to_state:
        logger.warning(
            "Drain: %d requests still running after %s=%ss; aborting them (finish reason abort).",
            len(self.rid_to_state),
            env.DRAIN_S.name,
            grace,
        )
        self.abort_request(abort_all=True)
        deadline = time.monotonic() + ABORT_WAIT_S
        while self.rid_to_state and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        if self.rid_to_state:  # a request the scheduler never answered must not hold the pod
            logger.warning(
                "Drain: dropping %d unanswered requests: %s", len(self.rid_to_state), list(self.rid_to_state)
            )
            self.rid_to_state.clear()
    logger.info("Drain: no request left; shutting down.")
    return await original(self)
