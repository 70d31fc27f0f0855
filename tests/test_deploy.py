"""Deployment files: systemd units (systemd-analyze verify), Prometheus config and rules
(promtool), the environment file and the Grafana dashboard's shape."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fermium.deploy_units import UNITS, UnitSettings, render_all, render_unit
from tests.conftest import REPO, fermium_cli
from tests.deploy_helpers import system_tool

DEPLOY = REPO / "deploy"
PROM = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "fermium-dashboard.json"
MIN_SCHEMA_VERSION = 36        # Grafana 9+: datasource references are {type, uid} objects
# `systemd-analyze security` exposure x10 (0 best, 100 worst); 2.9-3.1 now; "OK" ends below 5.0.
# The rest is the network (they serve it), no syscall filter (untested with the CUDA driver)
# and writable executable memory (cffi closures, CUDA JIT).
MAX_EXPOSURE = 35


def venv_prefix() -> Path:
    return Path(sys.executable).parent.parent      # holds bin/fermium


def verify(units: list[Path]) -> None:
    r = subprocess.run([system_tool("systemd-analyze"), "verify", "--man=no", *map(str, units)],
                       capture_output=True, text=True)
    # verify exits 0 on most complaints (unknown keys, bad values); any output is a defect
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


@pytest.mark.parametrize("cpus,numa", [(None, False), ("0-1", True)])
def test_rendered_units_verify(tmp_path, cpus, numa):
    settings = UnitSettings(prefix=venv_prefix(), user="fermium", env_file=tmp_path / "fermium.env",
                            decode_cpus=cpus, numa_interleave=numa)
    written = render_all(settings, tmp_path / "units")
    verify(written)
    decode = (tmp_path / "units" / "fermium-decode.service").read_text()
    assert ("CPUAffinity=0-1" in decode.splitlines()) == bool(cpus)
    assert ("NUMAPolicy=interleave" in decode.splitlines()) == numa


@pytest.mark.parametrize("service", ["router", "prefill", "decode"])
def test_units_exposure_stays_low(tmp_path, service):
    render_all(UnitSettings(prefix=venv_prefix()), tmp_path)
    r = subprocess.run([system_tool("systemd-analyze"), "security", "--offline=yes", f"--threshold={MAX_EXPOSURE}",
                        str(tmp_path / f"fermium-{service}.service")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout.splitlines()[-1:] + [r.stderr]


def test_rendering_changes_only_the_chosen_values(tmp_path):
    s = UnitSettings(prefix=Path("/srv/fm"), user="llm", env_file=Path("/etc/fm/env"))
    for name in UNITS:
        original = (DEPLOY / "systemd" / name).read_text().splitlines()
        rendered = render_unit(name, s).splitlines()
        changed = {a.split("=", 1)[0] for a, b in zip(original, rendered) if a != b}
        assert len(original) == len(rendered)
        assert changed <= {"User", "Group", "EnvironmentFile", "ExecStart", "Documentation"}, (name, changed)
        assert "fermium" not in " ".join(line for line in rendered if line.startswith(("User=", "Group=")))
        if name.endswith(".service"):
            assert "EnvironmentFile=/etc/fm/env" in rendered
            assert any(line.startswith("ExecStart=/srv/fm/.venv/bin/fermium ") for line in rendered)


def _directives(name: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in (DEPLOY / "systemd" / name).read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


@pytest.mark.parametrize("service", ["router", "prefill", "decode"])
def test_units_are_hardened_and_restart(service):
    d = _directives(f"fermium-{service}.service")
    assert d["Restart"] == ["on-failure"]
    assert d["EnvironmentFile"] == ["/etc/fermium/fermium.env"]
    assert d["User"] == ["fermium"] and d["ProtectSystem"] == ["strict"]
    assert d["StateDirectory"] == ["fermium"] and d["NoNewPrivileges"] == ["yes"]
    assert d["CapabilityBoundingSet"] == [""]
    assert d["PartOf"] == ["fermium.target"] and d["WantedBy"] == ["fermium.target"]
    gpu = service == "prefill"
    assert d.get("PrivateDevices") == (["no"] if gpu else ["yes"])
    assert bool(d.get("DeviceAllow")) == gpu
    if gpu:
        assert d["DevicePolicy"] == ["closed"] and all("nvidia" in v for v in d["DeviceAllow"])
    assert d.get("LimitMEMLOCK") == (None if service == "router" else ["infinity"])


def test_target_wants_every_service():
    wants = " ".join(_directives("fermium.target")["Wants"])
    for service in ("router", "prefill", "decode"):
        assert f"fermium-{service}.service" in wants


def test_env_file_documents_every_variable():
    example = (DEPLOY / "fermium.env.example").read_text()
    documented = set(re.findall(r"^#?(FERMIUM_[A-Z_]+)=", example, re.M))
    cli = cli_envvars("router", "prefill", "decode")
    assert {"FERMIUM_MODEL", "FERMIUM_CURVE_DIR", "FERMIUM_API_KEY"} <= cli
    per_host = {"FERMIUM_LISTEN", "FERMIUM_ADVERTISE", "FERMIUM_METRICS_PORT", "FERMIUM_URL"}
    assert cli - per_host <= documented, f"undocumented: {sorted(cli - per_host - documented)}"
    assert all(v in example for v in per_host), "the env file says why the per-service names replace these"
    for name in UNITS:
        used = set(re.findall(r"\$\{(FERMIUM_[A-Z_]+)\}", (DEPLOY / "systemd" / name).read_text()))
        assert used <= documented, (name, used - documented)


def cli_envvars(*commands: str) -> set[str]:
    """Every environment variable the given `fermium` commands read."""
    import typer.main

    from fermium.cli import app
    group = typer.main.get_command(app)
    out: set[str] = set()
    for name in commands:
        for param in group.commands[name].params:
            out |= {param.envvar} if isinstance(param.envvar, str) else set(param.envvar or ())
    return out


def test_deploy_install_command(tmp_path):
    out = tmp_path / "units"
    r = fermium_cli("deploy", "install", "--prefix", venv_prefix(), "--user", "svc", "--env-file",
                    tmp_path / "f.env", "--output-dir", out, "--decode-cpus", "0,2")
    assert sorted(p.name for p in out.iterdir()) == sorted(UNITS), r.stdout
    assert "CPUAffinity=0,2" in (out / "fermium-decode.service").read_text()
    assert "systemctl enable --now fermium.target" in r.stdout
    bad = fermium_cli("deploy", "install", "--output-dir", out, "--decode-cpus", "all of them", check=False)
    assert bad.returncode != 0 and "--decode-cpus" in bad.stderr


def test_deploy_env_writes_a_random_worker_token(tmp_path):
    out = tmp_path / "etc" / "fermium.env"
    fermium_cli("deploy", "env", "--out", out)
    text = out.read_text()
    (token,) = re.findall(r"^FERMIUM_WORKER_TOKEN=([0-9a-f]+)$", text, re.M)
    assert len(token) == 64 and oct(out.stat().st_mode & 0o777) == "0o640"
    assert text.replace(token, "") == (DEPLOY / "fermium.env.example").read_text()   # nothing else changed
    again = fermium_cli("deploy", "env", "--out", out, check=False)
    assert again.returncode != 0 and "--force" in again.stderr and out.read_text() == text
    fermium_cli("deploy", "env", "--out", out, "--force")
    assert token not in out.read_text()


def test_router_stops_before_the_workers_and_outwaits_its_drain():
    """systemd stops units in reverse start order: the router, ordered after the workers, stops
    first and drains while they still serve; its stop timeout exceeds the drain timeout."""
    router = _directives("fermium-router.service")
    assert {"fermium-prefill.service", "fermium-decode.service"} <= set(" ".join(router["After"]).split())
    for worker in ("prefill", "decode"):
        assert "fermium-router.service" not in " ".join(_directives(f"fermium-{worker}.service")["After"])
    drain = float(re.search(r"^#?FERMIUM_DRAIN_TIMEOUT=(\S+)", (DEPLOY / "fermium.env.example").read_text(),
                            re.M).group(1))
    assert float(router["TimeoutStopSec"][0]) >= drain + 5


def test_keys_create_bundles_and_revoke(tmp_path):
    from common.security import CurveKeys
    fermium_cli("keys", "create", "--out", tmp_path, "router", "gpu")
    fermium_cli("keys", "create", "--out", tmp_path, "cpu1")
    bundles = {p.name: CurveKeys.load(p) for p in (tmp_path / "hosts").iterdir()}
    assert sorted(bundles) == ["cpu1", "gpu", "router"]
    assert len({k.server_public for k in bundles.values()}) == 1, "one server key for the deployment"
    assert len({k.client_public for k in bundles.values()}) == 3
    assert sorted(p.name for p in bundles["gpu"].authorized.iterdir()) == ["cpu1.key", "gpu.key", "router.key"]
    assert oct((tmp_path / "hosts" / "gpu" / "client.key_secret").stat().st_mode & 0o777) == "0o600"
    for f in (tmp_path / "clients").glob("cpu1.*"):
        f.unlink()
    fermium_cli("keys", "create", "--out", tmp_path)
    assert sorted(p.name for p in (tmp_path / "hosts").iterdir()) == ["gpu", "router"]
    assert not (tmp_path / "hosts" / "router" / "authorized" / "cpu1.key").exists()


def test_promtool_check_config_and_rules():
    promtool = system_tool("promtool")
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "fermium-alerts.yml"],
                 ["test", "rules", "fermium-alerts.test.yml"]):
        r = subprocess.run([promtool, *args], cwd=PROM, capture_output=True, text=True)
        assert r.returncode == 0, f"promtool {' '.join(args)}:\n{r.stdout}{r.stderr}"


def test_alert_rules_cover_the_issue():
    import yaml
    rules = yaml.safe_load((PROM / "fermium-alerts.yml").read_text())["groups"][0]["rules"]
    exprs = {r["alert"]: r["expr"] for r in rules}
    assert "up{" in exprs["FermiumServiceDown"]
    assert "fermium_time_to_first_token_seconds_bucket" in exprs["FermiumTimeToFirstTokenHigh"]
    assert "fermium_num_requests_waiting" in exprs["FermiumQueueGrowing"]
    assert "fermium_snapshot_hits_total" in exprs["FermiumSnapshotHitRateCollapsed"]


def dashboard_panels() -> list[dict]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def test_dashboard_shape():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["schemaVersion"] >= MIN_SCHEMA_VERSION
    (var,) = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    assert var["name"] == "datasource" and var["query"] == "prometheus"
    panels = dashboard_panels()
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and all(t["expr"] and t["datasource"]["uid"] == "${datasource}" for t in p["targets"])
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    for metric in ("fermium_requests_total", "fermium_time_to_first_token_seconds_bucket",
                   "fermium_inter_token_latency_seconds_bucket", "fermium_prompt_tokens_total",
                   "fermium_generation_tokens_total", "fermium_num_requests_waiting", "fermium_num_requests_running",
                   "fermium_decode_batch_size", "fermium_snapshot_hits_total", "fermium_snapshot_tokens_saved_total",
                   "fermium_prefill_weight_bytes_total", 'key="peak_device_bytes"', "process_cpu_seconds_total",
                   "process_resident_memory_bytes"):
        assert metric in exprs, f"no panel shows {metric}"
    for quantile in ("0.5", "0.95"):
        assert f"histogram_quantile({quantile}, sum by (le) (rate(fermium_inter_token_latency" in exprs


def test_ci_deps_script_is_idempotent_when_tools_exist():
    for tool in ("systemd-analyze", "promtool", "prometheus"):
        system_tool(tool)
    r = subprocess.run(["bash", str(REPO / "tools" / "ci_system_deps.sh")], capture_output=True, text=True,
                       env={**os.environ})
    assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr
