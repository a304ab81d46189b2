"""Prometheus metrics of one server (its own `CollectorRegistry`), served at GET /metrics.

Latencies follow what a client sees: TTFT = arrival → first streamed tokens, inter-token
latency = gap between token deliveries divided by the tokens delivered (a round commits
R = A + 1 tokens at once), e2e = arrival → last token. Speculation: committed tokens per
verify round (mean committed length R̄), the share of rounds that drafted (N > 0), and
the tree budget N of each round.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BUDGET_BUCKETS = (0, 1, 3, 7, 15, 31, 63, 127)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("cast_http_requests", "HTTP requests by endpoint and status code.",
                                ["endpoint", "status"], registry=r)
        self.finished = Counter("cast_requests_finished", "Generation requests by how they ended "
                                "(stop | length | error | cancelled).", ["reason"], registry=r)
        self.queue_depth = Gauge("cast_queue_depth", "Requests waiting for a batch slot.", registry=r)
        self.running = Gauge("cast_running_requests", "Requests in the running batch.", registry=r)
        self.prompt_tokens = Counter("cast_prompt_tokens", "Prompt tokens of admitted requests.", registry=r)
        self.generated_tokens = Counter("cast_generation_tokens", "Tokens generated.", registry=r)
        self.ttft = Histogram("cast_time_to_first_token_seconds", "Arrival to the first delivered tokens.",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("cast_inter_token_latency_seconds", "Gap between deliveries per delivered token.",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("cast_e2e_request_latency_seconds", "Arrival to the last token.",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.rounds = Counter("cast_rounds", "Verify rounds of all requests.", registry=r)
        self.drafted_rounds = Counter("cast_drafted_rounds", "Rounds that verified a drafted tree (N > 0).",
                                      registry=r)
        self.committed = Counter("cast_committed_tokens", "Tokens committed by verify rounds.", registry=r)
        self.mean_committed = Gauge("cast_mean_committed_length", "Committed tokens per round (R = A + 1), "
                                    "over every round so far.", registry=r)
        self.drafted_share = Gauge("cast_drafted_round_share", "Share of rounds that drafted.", registry=r)
        self.budget = Histogram("cast_budget_per_round", "Tree budget N (nonroot nodes) of each round.",
                                buckets=BUDGET_BUCKETS, registry=r)
        self._totals = [0, 0, 0]  # rounds, drafted rounds, committed tokens (for the two gauges)

    def record_rounds(self, accept_lengths: list[int], budgets: list[int], drafted_flags: list[bool]) -> None:
        """New rounds of one request: committed tokens, tree budget N and whether it drafted, per round."""
        if not accept_lengths:
            return
        drafted = sum(drafted_flags)
        self.rounds.inc(len(accept_lengths))
        self.drafted_rounds.inc(drafted)
        self.committed.inc(sum(accept_lengths))
        for n in budgets:
            self.budget.observe(n)
        totals = self._totals
        totals[0] += len(accept_lengths)
        totals[1] += drafted
        totals[2] += sum(accept_lengths)
        self.mean_committed.set(totals[2] / totals[0])
        self.drafted_share.set(totals[1] / totals[0])


class RequestCounter:
    """ASGI middleware: counts every HTTP request by endpoint and response status."""

    def __init__(self, app: Any, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # an app that raises before answering

        async def send_status(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            endpoint = scope["path"] if scope["path"] in ENDPOINTS else "other"
            self.metrics.requests.labels(endpoint, str(status)).inc()
