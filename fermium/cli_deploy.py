"""`fermium keys create` (CURVE key pairs for a deployment), `fermium deploy install` (systemd
units rendered for this machine) and `fermium deploy env` (their environment file)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

keys_app = typer.Typer(no_args_is_help=True, help="CURVE keys for services on several hosts.")
deploy_app = typer.Typer(no_args_is_help=True, help="Install Fermium as systemd services.")

NEXT_STEPS = """\
Next steps (as root):
  useradd --system --home-dir /var/lib/fermium --shell /usr/sbin/nologin {user}   # once
  install -d -m 0750 -g {user} {env_dir}
  {fermium} deploy env --out {env_file} --group {user}   # then edit it
  systemctl daemon-reload
  systemctl enable --now fermium.target
See deploy/README.md for GPU access, CPU placement and several hosts."""


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


@keys_app.command("create")
def keys_create(
    hosts: List[str] = typer.Argument(None, help="Host names to create client keys for (router, gpu, cpu1, ...)."),
    out: Path = typer.Option(Path("fermium-keys"), "--out", "-o", help="Key store: kept, extended on later runs."),
):
    """Create the deployment's server key and one client key per host; rebuild out/hosts/HOST.

    Copy out/hosts/HOST to HOST (e.g. /etc/fermium/curve, readable by the service user) and pass
    it as --curve-dir (FERMIUM_CURVE_DIR). Run again with a new host name to add one; delete
    out/clients/HOST.* and run again to revoke one, then copy the bundles out again.
    """
    from common.security import create_key_bundles
    try:
        bundles = create_key_bundles(out, list(hosts or []))
    except (ValueError, OSError) as e:
        _fail(str(e))
    if not bundles:
        _fail("name at least one host, e.g. `fermium keys create router gpu cpu1`")
    for host, path in bundles.items():
        typer.echo(f"{host}: {path}")
    typer.echo("Secret files are mode 0600: give them to the service user on each host (chown).")


@deploy_app.command("install")
def deploy_install(
    prefix: Path = typer.Option(Path("/opt/fermium"),
                                help="Fermium checkout or install (holds .venv/bin/fermium or bin/fermium)."),
    user: str = typer.Option("fermium", help="The dedicated user the services run as."),
    env_file: Path = typer.Option(Path("/etc/fermium/fermium.env"), help="EnvironmentFile of every unit."),
    output_dir: Path = typer.Option(Path("/etc/systemd/system"), help="Where the units are written."),
    decode_cpus: Optional[str] = typer.Option(
        None, help="CPUAffinity of the decode worker: one CPU per physical core, e.g. 0-7."),
    numa_interleave: bool = typer.Option(
        False, help="NUMAPolicy=interleave for prefill and decode (multi-socket hosts)."),
):
    """Render fermium-{router,prefill,decode}.service and fermium.target for this machine."""
    from fermium.deploy_units import UnitSettings, render_all
    try:
        settings = UnitSettings(prefix.absolute(), user, env_file, decode_cpus, numa_interleave)
        written = render_all(settings, output_dir)
    except (ValueError, OSError) as e:
        _fail(str(e))
    for path in written:
        typer.echo(f"wrote {path}")
    if not settings.executable.exists():
        typer.echo(f"warning: {settings.executable} does not exist yet; install Fermium there", err=True)
    typer.echo(NEXT_STEPS.format(user=user, env_dir=env_file.parent, env_file=env_file,
                                 fermium=settings.executable))


@deploy_app.command("env")
def deploy_env(
    out: Path = typer.Option(Path("/etc/fermium/fermium.env"), help="The environment file to write (mode 0640)."),
    group: Optional[str] = typer.Option(None, help="Group that may read it: the service user's, e.g. fermium."),
    force: bool = typer.Option(False, help="Replace an existing file (its worker token changes)."),
):
    """Write the units' environment file: deploy/fermium.env.example with a random worker token.

    Copy the same file (or at least its FERMIUM_WORKER_TOKEN) to every host of the deployment.
    """
    from common.worker_token import new_token
    from fermium.deploy_units import write_env
    try:
        write_env(out, new_token(), group=group, force=force)
    except (ValueError, OSError, LookupError) as e:
        _fail(str(e))
    typer.echo(f"wrote {out} with a new FERMIUM_WORKER_TOKEN; set FERMIUM_MODEL in it at least")
