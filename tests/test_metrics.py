"""Metrics: every exported name is in common.metrics' docstring list (the dashboard's source)
and the other way round; /metrics parses; router counters move by the expected amounts."""
from __future__ import annotations

import re

import httpx
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from common import metrics
from fermium.local import LocalDispatcher
from fermium.stack import free_port
from tests.test_api_errors import MODEL, CountingRunner, make_app

SERVICES = {"router": metrics.RouterMetrics, "prefill": metrics.PrefillMetrics, "decode": metrics.DecodeMetrics}


def documented() -> set[str]:
    doc = metrics.__doc__
    names = set(re.findall(r"\b(fermium_[a-z0-9_]+)", doc))
    names |= {n.replace("_running", "_waiting") for n in names if n.endswith("_running")}
    return names


def exported(m) -> set[str]:
    out = set()
    for family in text_string_to_metric_families(generate_latest(m.registry).decode()):
        if family.name.startswith("fermium_") and not family.name.endswith("_created"):
            out.add(family.name + "_total" if family.type == "counter" else family.name)
    return out


def test_docstring_lists_exactly_the_exported_names():
    every = set()
    for name, cls in SERVICES.items():
        names = exported(cls())
        assert names <= documented(), f"{name} exports undocumented {sorted(names - documented())}"
        assert all(n.startswith("fermium_") for n in names)
        every |= names
    assert documented() <= every, f"documented but never exported: {sorted(documented() - every)}"


def test_metrics_endpoint_parses():
    m, port = metrics.DecodeMetrics(), free_port()
    m.serve(port, host="127.0.0.1")
    m.batch_size.observe(3)
    m.tokens.inc(5)
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"http://127.0.0.1:{port}/metrics").text)}
    assert families["fermium_decode_tokens"].samples[0].value == 5
    count = next(s for s in families["fermium_decode_batch_size"].samples if s.name.endswith("_count"))
    assert count.value == 1


def sample(m, name: str, **labels) -> float:
    return m.registry.get_sample_value(name, labels) or 0.0


def test_router_counters_move_per_request():
    app = make_app(LocalDispatcher(CountingRunner()))
    m = next(r.endpoint.__self__.engine.metrics for r in app.routes if r.path == "/v1/completions")
    with TestClient(app) as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "ab", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200
        c.post("/v1/completions", json={"model": "nope", "prompt": "ab"})
    assert sample(m, "fermium_requests_total", outcome="length") == 1
    assert sample(m, "fermium_prompt_tokens_total") == 2
    assert sample(m, "fermium_generation_tokens_total") == 4
    assert sample(m, "fermium_time_to_first_token_seconds_count") == 1
    assert sample(m, "fermium_inter_token_latency_seconds_count") == 3
    assert sample(m, "fermium_e2e_request_latency_seconds_count") == 1
    assert sample(m, "fermium_num_requests_running") == 0
