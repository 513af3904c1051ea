"""`testbed …`: a thin command line over the library (typer + rich).

Errors that testbed raises on purpose print as one line and exit with their code (2 for a
bad file); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional, Tuple

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from orchestrator.errors import TestbedError

app = typer.Typer(
    help="An emulated lab for distributed machine-learning networking research.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
images_app = typer.Typer(help="Build the lab images (no registry needed).", no_args_is_help=True)
app.add_typer(images_app, name="images")
out = Console()
err = Console(stderr=True)

LAB_HELP = "lab file (YAML) or a shorthand such as bcube,4,1 / fattree,8 / torus,4,2"


def main() -> None:
    try:
        app()
    except TestbedError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


# -- topology ---------------------------------------------------------------------------------
@app.command()
def topology(
    lab: str = typer.Argument(..., help=LAB_HELP),
    as_json: bool = typer.Option(False, "--json", help="print the whole topology as JSON"),
    routes: bool = typer.Option(False, "--routes", help="with --json: include every routing table"),
    route: Optional[Tuple[str, str]] = typer.Option(
        None, "--route", metavar="SRC DST", help="the node-by-node path routing takes"
    ),
    all_paths: bool = typer.Option(False, "--all-paths", help="with --route: every ECMP path"),
    png: Optional[Path] = typer.Option(None, "--png", help="draw the topology into this PNG file"),
) -> None:
    """Describe a lab's network: counts, diameter, NICs; JSON, routes and pictures."""
    from orchestrator import topology as topo_lib
    from orchestrator.spec import lab_from_argument
    from orchestrator.topology.describe import summary, to_json

    spec = lab_from_argument(lab)
    topo = topo_lib.from_lab(spec)
    if route:
        _print_route(topo, route, all_paths, as_json)
    elif as_json:
        print(json.dumps(to_json(topo, with_routes=routes), indent=1))
    else:
        facts = summary(topo)
        table = Table(title=f"{spec.name}: {topo.kind} {_params(topo.params)}", show_header=False)
        for key, value in facts.items():
            if key not in ("kind", "params"):
                table.add_row(key.replace("_", " "), str(value))
        out.print(table)
    if png is not None:
        from orchestrator.topology.draw import draw

        path = draw(topo, png)
        err.print(f"wrote {path}")


def _params(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def _print_route(topo, route: tuple[str, str], all_paths: bool, as_json: bool) -> None:
    src, dst = route
    topo.node(src)
    paths = topo.paths(src, dst) if all_paths else [topo.path(src, dst)]
    if as_json:
        print(json.dumps(paths if all_paths else paths[0]))
    else:
        for path in paths:
            out.print(" → ".join(path))
        if not all_paths:
            count = len(topo.paths(src, dst))
            if count > 1:
                err.print(f"(1 of {count} equal-cost paths; --all-paths lists them)")


# -- doctor -----------------------------------------------------------------------------------
@app.command()
def doctor(as_json: bool = typer.Option(False, "--json")) -> None:
    """Check this machine: root, tools, Docker, kernel features, firewall hazard."""
    from orchestrator.doctor import healthy, run_checks

    checks = run_checks()
    if as_json:
        print(json.dumps([c.__dict__ for c in checks], indent=1))
    else:
        table = Table(box=None, show_header=False, pad_edge=False)
        for check in checks:
            mark = "[green]ok[/]" if check.ok else ("[red]MISSING[/]" if check.required else "[yellow]absent[/]")
            fix = f" — {check.fix}" if not check.ok and check.fix else ""
            table.add_row(mark, check.name, check.detail + fix)
        out.print(table, highlight=False)
    if not healthy(checks):
        raise typer.Exit(1)


# -- labs -------------------------------------------------------------------------------------
@app.command()
def up(
    lab: str = typer.Argument(..., help=LAB_HELP),
    runtime: Optional[str] = typer.Option(None, help="override servers.runtime: docker | netns"),
    name: Optional[str] = typer.Option(None, help="override the lab's name"),
) -> None:
    """Make a lab live: servers, switches, shaped links, routes, management network."""
    from orchestrator.emulation import Lab
    from orchestrator.spec import lab_from_argument

    spec = lab_from_argument(lab, **{"servers.runtime": runtime, "name": name})
    with _progress() as progress:
        task = progress.add_task("checking", total=None)

        def report(stage: str, done: int, total: int) -> None:
            progress.update(task, description=stage[:60], completed=done, total=total or None)

        built = Lab.up(spec, report)
    summary = built.topology
    out.print(
        f"lab [bold]{spec.name}[/] is up: {len(summary.servers)} servers ({spec.servers.runtime}), "
        f"{len(summary.switches)} switches, {len(summary.links)} links; management "
        f"{built.plan.mgmt_subnet} on {built.plan.mgmt_bridge}",
        highlight=False,
    )


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description:<32}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err, transient=True,
    )


@app.command()
def down(name: str = typer.Argument(..., help="lab name")) -> None:
    """Remove a live lab completely."""
    from orchestrator.emulation import Lab

    Lab.attach(name).down()
    out.print(f"lab {name} is down")


@app.command()
def clean(name: Optional[str] = typer.Argument(None, help="lab name; all labs when omitted")) -> None:
    """Remove everything a lab (or every lab) left behind, even after a crash. Idempotent."""
    from orchestrator.emulation import cleanup

    removed = cleanup.clean_lab(name) if name else cleanup.clean_all()
    if removed:
        out.print("removed " + ", ".join(f"{count} {what}" for what, count in removed.items()))
    else:
        out.print("nothing to clean")


@app.command("ls")
def list_labs(as_json: bool = typer.Option(False, "--json")) -> None:
    """List live labs."""
    from orchestrator.emulation.journal import LabState

    rows = []
    for state in LabState.all():
        info, spec = state.state(), state.spec()
        rows.append(
            {
                "name": state.name,
                "status": info.get("status"),
                "topology": spec.get("topology"),
                "runtime": info.get("runtime"),
                "management": info.get("mgmt_subnet"),
            }
        )
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    if not rows:
        out.print("no labs")
        return
    table = Table("name", "status", "topology", "runtime", "management")
    for row in rows:
        table.add_row(row["name"], str(row["status"]), _params(row["topology"] or {}), str(row["runtime"]), str(row["management"]))
    out.print(table)


@app.command()
def status(name: str = typer.Argument(...), as_json: bool = typer.Option(False, "--json")) -> None:
    """Nodes, links (state, rate and MTU) and soft-RoCE devices of a live lab."""
    from orchestrator.emulation import Lab
    from orchestrator.units import format_rate

    report = Lab.attach(name).status()
    if as_json:
        print(json.dumps(report, indent=1))
        return
    alive = sum(n["alive"] for n in report["nodes"])
    up_links = sum(l["state"] == "up" for l in report["links"])
    out.print(
        f"[bold]{name}[/] {report['status']}: {report['topology']} {_params(report['params'])}, "
        f"{report['runtime']}; nodes {alive}/{len(report['nodes'])} alive, links "
        f"{up_links}/{len(report['links'])} up; management {report['management']['subnet']}",
        highlight=False,
    )
    table = Table("link", "state", "rate", "mtu", "tx bytes", "rx bytes")
    for link in report["links"]:
        rate = format_rate(link["rate_bps"]) if link["rate_bps"] else "-"
        table.add_row(f"{link['a']} – {link['b']}", link["state"], rate, str(link["mtu"] or "-"), str(link["tx_bytes"]),
                      str(link["rx_bytes"]))
    out.print(table)
    if report["rxe"]:
        for device in report["rxe"]:
            out.print(f"rxe {device['device']} on {device['netdev']}: {device['state']}")


@app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_command(
    name: str = typer.Argument(..., help="lab name"),
    node: str = typer.Argument(..., help="node name, e.g. h00"),
    command: List[str] = typer.Argument(..., help="the command, after --"),
) -> None:
    """Run a command on a node: `testbed exec LAB NODE -- CMD ARGS…`."""
    import subprocess

    from orchestrator.emulation import Lab, docker_engine

    lab = Lab.attach(name)
    lab.check_node(node)
    if lab.plan.in_container(node):
        code, _ = docker_engine.exec_in(
            lab.plan.container_name(node), command, stream=lambda chunk: sys.stdout.buffer.write(chunk) and sys.stdout.flush()
        )
    else:
        code = subprocess.call(lab.command_prefix(node) + command)
    raise typer.Exit(code)


@app.command("cli")
def mininet_cli(name: str = typer.Argument(..., help="lab name")) -> None:
    """Open Mininet's CLI on a live lab (pingall, h00 ping h33, link h00 l0s0 down, …)."""
    from mininet.cli import CLI
    from mininet.log import setLogLevel

    from orchestrator.emulation import Lab

    setLogLevel("info")
    lab = Lab.attach(name)
    net = lab.net
    try:
        CLI(net)
    finally:
        for node in net.values():
            node.terminate()


# -- images -----------------------------------------------------------------------------------
@images_app.command("build")
def images_build() -> None:
    """Build testbed/base and testbed/server if missing or out of date (quick otherwise)."""
    from orchestrator.emulation import images

    with _progress() as progress:
        task = progress.add_task("images", total=None)
        built = images.build_all(lambda line: progress.update(task, description=line[:60]))
    out.print("built " + ", ".join(built) if built else "images are up to date")


if __name__ == "__main__":
    main()
