"""The monitoring path end to end: the three services, started from the systemd units' command
lines and the example env file, and a real Prometheus server on loopback scraping them with
deploy/prometheus's jobs and rules; after real requests, every PromQL
expression of every dashboard panel is evaluated through Prometheus's HTTP API and must return
data. A panel over a metric the services do not export fails here."""
from __future__ import annotations

import concurrent.futures as cf
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from fermium.stack import free_port
from tests.conftest import REPO
from tests.deploy_helpers import system_tool, unit_command
from tests.stack_helpers import write_tiny_gguf
from tests.up_helpers import wait_healthy

DEPLOY = REPO / "deploy"
SCRAPE_S = 1                   # scrape and rule evaluation interval of the test server
RATE_INTERVAL = "1m"           # $__rate_interval: longer than the whole test, so every request counts
READY_TIMEOUT_S = 60           # three Python processes and Prometheus on a shared 2-core machine
SETTLE_S = 3 * SCRAPE_S        # scrapes after the last request, so rates see the final counts
PROMPTS = ["the cat", "ROMEO:", "To be, or not", "hello there"]
JOBS = {"fermium-router": "router", "fermium-prefill": "prefill", "fermium-decode": "decode"}


class UnitStack:
    """The three services started as their systemd units would start them: the ExecStart lines
    of deploy/systemd, the environment of the example env file with this machine's values."""

    def __init__(self, root: Path, overrides: dict[str, str]):
        self.env_file = (DEPLOY / "fermium.env.example").read_text() + "\n# this machine\n" + \
            "".join(f"{k}={v}\n" for k, v in overrides.items())
        self.url = f"http://127.0.0.1:{overrides['FERMIUM_PORT']}"
        self.root, self.procs = root, {}

    def start(self) -> "UnitStack":
        for service in JOBS.values():
            argv, env = unit_command((DEPLOY / "systemd" / f"fermium-{service}.service").read_text(), self.env_file)
            assert Path(argv[0]).name == "fermium", argv
            env = {"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1", **env}
            log = open(self.root / f"{service}.log", "wb")
            self.procs[service] = subprocess.Popen([sys.executable, "-m", "fermium", *argv[1:]], env=env,
                                                   cwd=self.root, stdout=log, stderr=subprocess.STDOUT)
            log.close()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            dead = {s: p.returncode for s, p in self.procs.items() if p.poll() is not None}
            assert not dead, f"{dead} exited; see {self.root}/*.log: " + \
                "".join((self.root / f"{s}.log").read_text()[-2000:] for s in dead)
            try:
                if len(httpx.get(f"{self.url}/health", timeout=2).json()["workers"]) == 2:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"the stack was not ready; see {self.root}/*.log"
            time.sleep(0.2)

    def stop(self) -> None:
        for p in self.procs.values():
            p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("monitoring-stack")
    workers = f"tcp://127.0.0.1:{free_port()}"
    ports = {service: free_port() for service in JOBS.values()}
    overrides = {"FERMIUM_MODEL": str(write_tiny_gguf(root / "tiny.gguf")), "FERMIUM_PORT": str(free_port()),
                 "FERMIUM_WORKERS": workers, "FERMIUM_ROUTER": workers, "FERMIUM_RUNNER": "reference",
                 "FERMIUM_LOG_LEVEL": "warning", "FERMIUM_SNAPSHOT_DIR": str(root / "snapshots"),
                 **{f"FERMIUM_{service.upper()}_METRICS_PORT": str(port) for service, port in ports.items()}}
    s = UnitStack(root, overrides).start()
    try:
        s.wait_ready()
        s.metrics_ports = ports
        yield s
    finally:
        s.stop()


def prometheus_config(stack, rules: str) -> dict:
    """deploy/prometheus/prometheus.yml with the test's targets, interval and rule path."""
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    cfg["global"].update(scrape_interval=f"{SCRAPE_S}s", evaluation_interval=f"{SCRAPE_S}s")
    cfg["rule_files"] = [rules]
    assert {job["job_name"] for job in cfg["scrape_configs"]} == set(JOBS)
    for job in cfg["scrape_configs"]:
        job["static_configs"] = [{"targets": [f"127.0.0.1:{stack.metrics_ports[JOBS[job['job_name']]]}"]}]
    return cfg


@pytest.fixture(scope="module")
def prometheus(stack, tmp_path_factory):
    root = tmp_path_factory.mktemp("prometheus")
    config = root / "prometheus.yml"
    config.write_text(json.dumps(prometheus_config(stack, str(DEPLOY / "prometheus" / "fermium-alerts.yml"))))
    port = free_port()
    log = open(root / "prometheus.log", "wb")
    proc = subprocess.Popen([system_tool("prometheus"), f"--config.file={config}",
                             f"--storage.tsdb.path={root / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, READY_TIMEOUT_S, (root / "prometheus.log").read_text, "prometheus", 0.2, "/-/ready")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def query(url: str, expr: str) -> list[dict]:
    r = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{expr}: {body.get('error', r.text)}"
    return body["data"]["result"]


def wait_for(url: str, expr: str, done, what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not done(query(url, expr)):
        assert time.monotonic() < deadline, f"Prometheus never saw {what} ({expr})"
        time.sleep(SCRAPE_S / 2)


@pytest.fixture(scope="module")
def traffic(stack, prometheus):
    """Requests through the router, some concurrent (decode batches) and some repeated (snapshots)."""
    wait_for(prometheus, 'up{job=~"fermium-.*"} == 1', lambda r: len(r) == len(JOBS), "all three services up")

    def one(prompt: str, stream: bool) -> None:
        body = {"model": "fermium", "prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": stream}
        with httpx.stream("POST", f"{stack.url}/v1/completions", json=body, timeout=60) as r:
            r.read()
            assert r.status_code == 200, r.text

    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        list(pool.map(one, PROMPTS, [True, False] * (len(PROMPTS) // 2)))
    for prompt in PROMPTS[:2]:
        one(prompt, stream=False)
    sent = len(PROMPTS) + 2
    wait_for(prometheus, 'sum(fermium_requests_total{job="fermium-router"})',
             lambda r: r and float(r[0]["value"][1]) >= sent, f"{sent} finished requests")
    time.sleep(SETTLE_S)
    return sent


def dashboard_targets() -> list[tuple[str, str]]:
    dash = json.loads((DEPLOY / "grafana" / "fermium-dashboard.json").read_text())
    return [(f"{p['title']} / {t['legendFormat']}", t["expr"])
            for p in dash["panels"] if p["type"] != "row" for t in p["targets"]]


def grafana_expr(expr: str) -> str:
    """The expression as Grafana sends it: its interval variable filled in."""
    out = expr.replace("$__rate_interval", RATE_INTERVAL)
    assert "$" not in out, f"{expr}: a dashboard variable this test does not know"
    return out


@pytest.mark.parametrize("name,expr", dashboard_targets(), ids=[n for n, _ in dashboard_targets()])
def test_dashboard_query_returns_data(prometheus, traffic, name, expr):
    result = query(prometheus, grafana_expr(expr))
    assert result, f"panel '{name}' has no data: {expr}"
    values = [float(s["value"][1]) for s in result]
    assert any(math.isfinite(v) for v in values), f"panel '{name}' returns only {values}: {expr}"


def test_alert_rules_load_and_evaluate(prometheus, traffic):
    groups = httpx.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert {r["name"] for r in rules} >= {"FermiumServiceDown", "FermiumTimeToFirstTokenHigh",
                                          "FermiumQueueGrowing", "FermiumSnapshotHitRateCollapsed"}
    deadline = time.monotonic() + READY_TIMEOUT_S
    while any(r.get("health") != "ok" for r in rules):
        bad = {r["name"]: r.get("lastError") or r.get("health") for r in rules if r.get("health") != "ok"}
        assert time.monotonic() < deadline and not any(r.get("health") == "err" for r in rules), bad
        time.sleep(SCRAPE_S)
        groups = httpx.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
    exprs = {r["name"]: r["query"] for r in rules}
    for name in ("FermiumServiceDown", "FermiumNoWorkers"):     # with everything up, their conditions are false
        assert query(prometheus, exprs[name]) == [], name
    assert query(prometheus, exprs["FermiumServiceDown"].replace("== 0", "== 1")), "the rule selects no target"


def test_generation_counts_match_the_requests(prometheus, traffic):
    (finished,) = query(prometheus, 'sum(fermium_requests_total{job="fermium-router", outcome=~"stop|length"})')
    assert float(finished["value"][1]) == traffic
    (tokens,) = query(prometheus, 'sum(fermium_generation_tokens_total{job="fermium-router"})')
    assert float(tokens["value"][1]) > 0
