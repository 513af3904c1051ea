"""`testbed …`: a thin command line over the library (typer + rich).

Errors that testbed raises on purpose print as one line and exit with their code (2 for a
bad file); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from orchestrator.errors import BadUsage, MonitorError, TestbedError

app = typer.Typer(
    help="An emulated lab for distributed machine-learning networking research.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
images_app = typer.Typer(help="Build the lab images (no registry needed).", no_args_is_help=True)
app.add_typer(images_app, name="images")
monitor_app = typer.Typer(help="A Prometheus per lab scraping its agents (127.0.0.1 only).", no_args_is_help=True)
app.add_typer(monitor_app, name="monitor")
grafana_app = typer.Typer(help="Grafana dashboards of the labs, built from code.", no_args_is_help=True)
app.add_typer(grafana_app, name="grafana")
hosts_app = typer.Typer(help="The hosts a lab may be split over: a worker on each, a scheduler here.",
                        no_args_is_help=True)
app.add_typer(hosts_app, name="hosts")
out = Console()
err = Console(stderr=True)

LAB_HELP = "lab file (YAML) or a shorthand such as bcube,4,1 / fattree,8 / torus,4,2"
PLUGIN_HELP = ("a .py file registering algorithms (orchestrator.collectives.register) or topology kinds "
               "(orchestrator.spec.register_topology), as mn --custom; repeatable")


def _load_plugins(files: List[Path]) -> None:
    """--plugin files and installed `testbed.algorithms` entry points, before any name or kind is looked up."""
    from orchestrator import plugins

    plugins.load_entry_points()
    for file in files:
        plugins.load_file(file)


def main() -> None:
    try:
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except typer.Abort:
        err.print("interrupted")
        sys.exit(130)
    except TestbedError as exc:
        err.print(Text("error: ", style="bold red") + Text(str(exc)), highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as exc:
        # click's usage errors (typer ≥ 0.22 carries its own click): one line, like every
        # other error, instead of a box of help
        if not (hasattr(exc, "format_message") and isinstance(getattr(exc, "exit_code", None), int)):
            raise
        ctx = getattr(exc, "ctx", None)
        command = ctx.command_path if ctx is not None else "testbed"
        if not exc.format_message():  # `testbed` alone: the help is already printed
            sys.exit(exc.exit_code)
        err.print(Text("error: ", style="bold red") + Text(f"{command}: {exc.format_message()} (see --help)"),
                  highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)


# -- hosts ------------------------------------------------------------------------------------
@hosts_app.command("up")
def hosts_up(file: Path = typer.Argument(..., help="a hosts file (README: Labs over several hosts)")) -> None:
    """Start the engine's scheduler here and install a supervised worker on every host
    (Ansible, mutual TLS); wait until every host has joined. Idempotent."""
    from orchestrator.hosts import workers
    from orchestrator.spec.hosts import HostsSpec
    from orchestrator.spec.loader import load

    spec = load(HostsSpec, file)
    with _progress() as progress:
        done = workers.up(spec, _reporter(progress, "hosts"))
    out.print(f"hosts {', '.join(done['hosts'])} are up, scheduler {done['address']} "
              f"({done['changed']} changes, {done['seconds']} s)", highlight=False)


@hosts_app.command("status")
def hosts_status(as_json: bool = typer.Option(False, "--json")) -> None:
    """The scheduler, and each host: joined or missing, and the labs it holds a share of."""
    from orchestrator.hosts import workers

    report = workers.status()
    if as_json:
        print(json.dumps(report, indent=1))
        return
    if not report["up"]:
        out.print("no hosts are up")
        return
    running = "running" if report["scheduler_running"] else "[red]not running[/]"
    out.print(f"scheduler {report['address']}: {running}")
    table = Table("host", "address", "worker", "labs")
    for name, host in report["hosts"].items():
        table.add_row(name, host["address"], "joined" if host["joined"] else "[red]missing[/]",
                      ", ".join(host["labs"]) or "-")
    out.print(table)


@hosts_app.command("down")
def hosts_down(force: bool = typer.Option(False, "--force", help="clean the labs the hosts hold first")) -> None:
    """Stop and remove every host's worker and the scheduler (refused while a host holds a lab,
    unless --force)."""
    from orchestrator.hosts import workers

    with _progress() as progress:
        done = workers.down(_reporter(progress, "hosts"), force=force)
    if "removed" in done:
        out.print(f"removed an unreadable hosts record ({done['removed']}): stop what it started by hand")
        return
    if not done["stopped"] and not done.get("unreached"):
        out.print("no hosts were up")
        return
    out.print(f"hosts {', '.join(done['stopped']) or 'none'} are down")
    for host in done.get("unreached", []):
        err.print(f"host {host} could not be reached: its worker may still run there (bring the hosts up and down "
                  "again once it is reachable)")


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
    plugin: List[Path] = typer.Option([], "--plugin", help=PLUGIN_HELP),
    hosts: Optional[Path] = typer.Option(None, "--hosts", help="a hosts file: how the lab would be split over them"),
    algorithm: Optional[str] = typer.Option(None, "--algorithm", "-a", help="with --hosts: cut where this "
                                            "algorithm's predicted bytes are fewest (default: by link rates)"),
    size: str = typer.Option("25MB", help="with --algorithm: the gradient it predicts"),
) -> None:
    """Describe a lab's network: counts, diameter, NICs; JSON, routes and pictures."""
    from orchestrator import topology as topo_lib
    from orchestrator.spec import lab_from_argument
    from orchestrator.topology.describe import summary, to_json

    _load_plugins(plugin)
    if png is not None and not png.parent.is_dir():
        raise BadUsage(f"--png {png}: directory {png.parent} does not exist: create it or pick another path")
    spec = lab_from_argument(lab)
    topo = topo_lib.from_lab(spec)
    if algorithm is not None and hosts is None:
        raise BadUsage("--algorithm: weighs the cut of --hosts: give --hosts FILE too")
    if hosts is not None:
        _print_placement(spec, topo, hosts, as_json, algorithm, size)
    elif route:
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

        try:
            path = draw(topo, png)
        except OSError as exc:
            raise BadUsage(f"--png {png}: cannot write it: {exc.strerror or exc}") from None
        err.print(f"wrote {path}")


def _params(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def _print_placement(spec, topo, path: Path, as_json: bool, algorithm: Optional[str], size: str) -> None:
    """Which host each node would live on, and what crosses between hosts (topology/partition.py);
    with `algorithm`, the cut weighed by the bytes the model predicts it sends over each link."""
    from orchestrator.errors import TopologyError
    from orchestrator.spec import load
    from orchestrator.spec.hosts import HostsSpec
    from orchestrator.topology.partition import check_underlay, place
    from orchestrator.units import format_rate

    listed = load(HostsSpec, path)
    hosts = [host.host() for host in listed.hosts]
    weights = None
    if algorithm is not None:
        from orchestrator.cost.report import predict_lab
        from orchestrator.units import parse_size

        try:
            gradient = parse_size(size)
        except ValueError as exc:
            raise BadUsage(f"--size: {exc}") from None
        loads = predict_lab(spec, algorithm, gradient).prediction.link_bytes
        weights = {tuple(name.split("→")): value for name, value in loads.items()}
    try:
        placement = place(topo, hosts, weights=weights, default_bps=spec.links.bandwidth)
        shares = check_underlay(topo, placement, spec.links.bandwidth, spec.links.mtu)
    except TopologyError as exc:
        raise TopologyError(f"{path}: {exc}") from None
    if as_json:
        print(json.dumps({"method": placement.method, "host_of": dict(placement.host_of),
                          "hosts": [dataclasses.asdict(share) for share in shares],
                          "crossing": [[link.a.node, link.b.node] for link in placement.crossing(topo)]}, indent=1))
        return
    nic = {host.name: host.nic_bps for host in hosts}
    weighed = f", weighed by {algorithm}'s predicted bytes" if algorithm and placement.method == "kernighan-lin" else ""
    table = Table(title=f"{spec.name} over {len(shares)} hosts ({placement.method}{weighed})")
    for column in ("host", "servers", "switches", "crossing links", "at most out / in", "NIC"):
        table.add_column(column, justify="left" if column == "host" else "right", no_wrap=True)
    for share in shares:
        table.add_row(share.host, str(share.servers), str(share.switches), str(share.crossing),
                      f"{format_rate(float(f'{share.out_bps:.3g}'))} / {format_rate(float(f'{share.in_bps:.3g}'))}",
                      format_rate(nic[share.host]) if nic[share.host] else "?")
    out.print(table)
    err.print("at most: every crossing link busy at its rate, with VXLAN's 50 bytes a packet")


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
    hosts: Optional[Path] = typer.Option(None, "--hosts", help="a hosts file whose hosts are up (testbed hosts "
                                         "up): the lab split over them"),
    plugin: List[Path] = typer.Option([], "--plugin", help=PLUGIN_HELP),
) -> None:
    """Make a lab live: servers, switches, shaped links, routes, management network."""
    from orchestrator.emulation import Lab
    from orchestrator.spec import lab_from_argument

    _load_plugins(plugin)
    spec = lab_from_argument(lab, **{"servers.runtime": runtime, "name": name})
    if hosts is not None:
        _split_up(spec, hosts)
        return
    with _progress() as progress:
        built = Lab.up(spec, _reporter(progress, "checking"))
    summary = built.topology
    out.print(
        f"lab [bold]{spec.name}[/] is up: {len(summary.servers)} servers ({spec.servers.runtime}), "
        f"{len(summary.switches)} switches, {len(summary.links)} links; management "
        f"{built.plan.mgmt_subnet} on {', '.join(built.plan.mgmt_bridges())}",
        highlight=False,
    )


@contextmanager
def _split_maker(path: Path) -> Iterator:
    """(make_lab(spec, progress) splitting a lab over the hosts of hosts file `path`, which
    must be up, the hosts file), with the hosts' engine connected meanwhile."""
    from orchestrator.hosts import split, workers
    from orchestrator.spec.hosts import HostsSpec
    from orchestrator.spec.loader import load

    listed = load(HostsSpec, path)
    engine, running = workers.connect()
    try:
        _check_up(path, listed, running)
        hosts, underlay = [host.host() for host in listed.hosts], {host.name: host.address for host in listed.hosts}
        yield (lambda spec, progress=lambda *_: None: split.up(spec, engine, hosts, underlay, progress)), listed
    finally:
        engine.close()


def _check_up(path: Path, listed, running) -> None:
    """BadUsage naming the first host of hosts file `path` (`listed`) that is not among the
    hosts up (`running`)."""
    known = {host.name: host.address for host in running.hosts}
    for index, host in enumerate(listed.hosts):
        if known.get(host.name) != host.address:
            raise BadUsage(f"hosts.{index}: host {host.name} at {host.address} is not up: "
                           f"`testbed hosts up {path}` first")


def _split_machines(path: Path, dry_run: bool):
    """The machines a run split over the hosts of `path` puts its agents on, with the memory
    and threads each has, as their workers report them (experiment/machines.py). On a dry
    run with the hosts not up, what they have is not known and not checked (said so)."""
    from orchestrator.experiment.machines import Machines
    from orchestrator.hosts import parts, workers
    from orchestrator.spec.hosts import HostsSpec
    from orchestrator.spec.loader import load

    listed = load(HostsSpec, path)
    hosts = [host.host() for host in listed.hosts]
    try:
        engine, running = workers.connect()
    except workers.HostsError:
        if not dry_run:
            raise BadUsage(f"{path}: no hosts are up: `testbed hosts up {path}` first") from None
        err.print(Text(f"note: the hosts of {path} are not up: their memory and threads are not checked"),
                  highlight=False, soft_wrap=True)
        return Machines.of_hosts(hosts, {host.name: {"machine": host.name} for host in hosts})
    try:
        _check_up(path, listed, running)
        limits = {host.name: engine.run_on(host.name, parts.limits_part, "limits", timeout=60) for host in hosts}
    finally:
        engine.close()
    return Machines.of_hosts(hosts, limits)


def _split_up(spec, path: Path) -> None:
    """`testbed up --hosts FILE`: the lab over hosts that are up, each building its share."""
    with _split_maker(path) as (make_lab, listed), _progress() as progress:
        built = make_lab(spec, _reporter(progress, "hosts"))
    shares = {host.name: sum(1 for s in built.topology.servers if built.placement.host_of[s.name] == host.name)
              for host in listed.hosts}
    out.print(f"lab [bold]{spec.name}[/] is up over {len(shares)} hosts ("
              + ", ".join(f"{h}: {n} servers" for h, n in shares.items())
              + f"), {len(built.wires)} VXLAN wires; management {built.plan.mgmt_subnet}", highlight=False)


def _reporter(progress: Progress, first: str):
    """A step callback (stage, done, total) that moves one bar of `progress`, named `first` at
    the start."""
    task = progress.add_task(first, total=None)
    return lambda stage, done, total: progress.update(task, description=stage[:60], completed=done, total=total or None)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description:<32}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err, transient=True,
    )


@app.command()
def down(name: str = typer.Argument(..., help="lab name")) -> None:
    """Remove a live lab completely (a crashed build too)."""
    from orchestrator.emulation import Lab
    from orchestrator.hosts import split

    if split.exists(name):
        left = [host for host, result in _split_clean(name).items() if result.get("lost")]
        if left:
            raise TestbedError(f"lab {name}: hosts {', '.join(left)} are out of reach: their share stays until "
                               f"`testbed clean {name}` reaches them")
    else:
        Lab.attach(name, crashed_ok=True).down()
    out.print(f"lab {name} is down")


@contextmanager
def _live_lab(name: str) -> Iterator:
    """The live lab `name`: on this machine, or split over hosts (with the hosts' engine
    connected while it is used)."""
    from orchestrator.emulation import Lab
    from orchestrator.hosts import split, workers

    if not split.exists(name):
        yield Lab.attach(name)
        return
    engine, _ = workers.connect()
    try:
        yield split.attach(name, engine)
    finally:
        engine.close()


def _split_clean(name: str) -> dict:
    """A split lab's record cleaned: here, and on every host the engine reaches."""
    from orchestrator.hosts import split, workers

    try:
        engine, _ = workers.connect(timeout=10.0)
    except TestbedError as exc:
        err.print(f"the hosts' engine is out of reach ({exc}): cleaning this machine's side only")
        return split.clean(name, None)
    try:
        return split.clean(name, engine)
    finally:
        engine.close()


@app.command()
def clean(
    name: Optional[str] = typer.Argument(None, help="lab name (exactly that lab)"),
    every: bool = typer.Option(False, "--all", help="every lab, and orphans of testbed's naming"),
) -> None:
    """Remove everything a lab (or, with --all, every lab) left behind, even after a crash.
    Idempotent. A lab another process is building is left alone."""
    from orchestrator.emulation import cleanup

    if name is not None and every:
        raise BadUsage("clean takes a lab name or --all, not both")
    if name is None and not every:
        raise BadUsage("clean needs a lab name (testbed ls lists them), or --all for every lab")
    from orchestrator.hosts import split

    busy: list[str] = []
    for lab in split.names() if every else [name] if split.exists(name) else []:
        for where, result in _split_clean(lab).items():
            if result.get("lost"):
                err.print(f"lab {lab}: host {where} is out of reach: its share stays until it is cleaned")
            elif any(result.values()):
                place = "this machine" if where == "here" else f"host {where}"
                out.print(f"lab {lab} on {place}: removed " + ", ".join(f"{n} {what}" for what, n in result.items()))
    if every:
        removed, busy = cleanup.clean_all()
    else:
        removed = cleanup.clean_lab(name)
    if removed:
        out.print("removed " + ", ".join(f"{count} {what}" for what, count in removed.items()))
    else:
        out.print("nothing to clean")
    for lab in busy:
        err.print(f"left lab {lab} alone: another process is building it")


@app.command("ls")
def list_labs(as_json: bool = typer.Option(False, "--json")) -> None:
    """List live labs."""
    from orchestrator.emulation.journal import LabState

    rows = []
    for state in LabState.all():
        info, spec = state.state(), state.spec()
        status = info.get("status", "building")
        if state.crashed():
            status = f"crashed — run testbed clean {state.name}"
        rows.append(
            {
                "name": state.name,
                "status": status,
                "topology": spec.get("topology"),
                "runtime": info.get("runtime"),
                "management": info.get("mgmt_subnet"),
            }
        )
    rows += _split_rows()
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


def _split_rows() -> list[dict]:
    """`testbed ls` rows of the split labs recorded here."""
    from orchestrator.hosts import split

    rows = []
    for lab in split.names():
        try:
            data = split.read_record(lab)
            spec, hosts = data["spec"], [host["name"] for host in data["hosts"]]
            rows.append({"name": lab, "status": f"{data['status']} over hosts {', '.join(hosts)}",
                         "topology": spec.get("topology"), "runtime": spec.get("servers", {}).get("runtime"),
                         "management": spec.get("management", {}).get("subnet")})
        except (TestbedError, KeyError, TypeError, AttributeError):
            rows.append({"name": lab, "status": f"unreadable — run testbed clean {lab}", "topology": None,
                         "runtime": None, "management": None})
    return rows


@app.command()
def status(name: str = typer.Argument(...), as_json: bool = typer.Option(False, "--json")) -> None:
    """Nodes, links (state, rate and MTU) and soft-RoCE devices of a live lab."""
    from orchestrator.units import format_rate

    with _live_lab(name) as lab:
        report = lab.status()
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
    with _live_lab(name) as lab:
        code = lab.runtime_of(node).call(lab, node, command)
    raise typer.Exit(code)


@app.command("cli")
def mininet_cli(name: str = typer.Argument(..., help="lab name")) -> None:
    """Open Mininet's CLI on a live lab (pingall, h00 ping h33, link h00 l0s0 down, …); on a
    lab split over hosts each command line runs on its node's host."""
    from mininet.cli import CLI
    from mininet.log import setLogLevel

    from orchestrator.emulation.mininet_attach import attach
    from orchestrator.faults import set_link_status

    setLogLevel("info")
    with _live_lab(name) as lab:
        net = attach(lab)
        # `link A B down|up` goes through the fault path: journalled, and the routes react
        net.link_status = lambda a, b, up: set_link_status(lab, a, b, up)
        try:
            CLI(net)
        finally:
            for node in net.values():
                node.terminate()


# -- faults -----------------------------------------------------------------------------------
FAULT_ACTIONS = ("link-down, link-up, link-flap, link-degrade, switch-down, server-crash, server-restart, "
                 "server-pause, server-slow, partition")


@app.command("fault")
def fault(
    name: str = typer.Argument(..., help="lab name"),
    action: str = typer.Argument(..., help=f"{FAULT_ACTIONS}; or list, or heal"),
    target: Optional[str] = typer.Argument(
        None, help="a link A-B, a switch, a server, or servers A,B,… (partition); heal: a fault id (default: all)"),
    duration: Optional[str] = typer.Option(
        None, "--for", help="undo after this long, e.g. 5s: the command waits, and Ctrl-C undoes at once"),
    rate: Optional[str] = typer.Option(None, help="link-degrade: the link's rate, e.g. 10Mbit"),
    delay: Optional[str] = typer.Option(None, help="link-degrade: added delay, e.g. 5ms (needs sch_netem)"),
    jitter: Optional[str] = typer.Option(None, help="link-degrade: jitter, e.g. 1ms (needs sch_netem)"),
    loss: Optional[str] = typer.Option(None, help="link-degrade: loss percentage, e.g. 1% (needs sch_netem)"),
    period: Optional[str] = typer.Option(None, help="link-flap: one down+up cycle, e.g. 1s (default 1s)"),
    count: Optional[str] = typer.Option(None, help="link-flap: cycles (default 3, or as many as --for holds)"),
    direction: Optional[str] = typer.Option(None, help="partition: both (default), in or out (as the set sees it)"),
    cpus: Optional[str] = typer.Option(None, help="server-slow: the share of one core it may use, e.g. 0.25"),
    as_json: bool = typer.Option(False, "--json", help="list: print the fault events as JSON"),
) -> None:
    """Inject a fault into a live lab, list its faults, or heal them (see README, Faults).

    `testbed fault LAB link-down h00-l0s0 [--for 5s]`, `testbed fault LAB list`,
    `testbed fault LAB heal [ID]`."""
    with _live_lab(name) as lab:
        _fault(lab, name, action, target, duration, as_json,
               {"rate": rate, "delay": delay, "jitter": jitter, "loss": loss, "period": period, "count": count,
                "direction": direction, "cpus": cpus})


def _fault(lab, name: str, action: str, target: Optional[str], duration: Optional[str], as_json: bool,
           options: dict) -> None:
    from orchestrator.faults import Injector

    injector = Injector(lab)
    if action == "list":
        _list_faults(lab, as_json)
        return
    if action == "heal":
        if target is not None:
            injector.undo(target)
            out.print(f"fault {target} undone")
        else:
            healed = injector.heal()
            out.print(f"undid {len(healed)} fault{'s' * (len(healed) != 1)} of lab {name}")
        return
    if target is None:
        raise BadUsage(f"testbed fault {name} {action} needs a TARGET (a link A-B, a switch, a server, or servers A,B)")
    seconds = _fault_duration(duration)
    from orchestrator.faults import ACTIONS

    lasting = action not in ACTIONS or ACTIONS[action].lasting
    if seconds is not None and action in ACTIONS and not ACTIONS[action].takes_duration:
        raise BadUsage(f"{action} is done at once: --for does not apply to it")
    done = injector.inject(action, target, options, duration=None if lasting else seconds)
    fault_id, what = done.fault.id, f"{action} {done.fault.target.text}"
    if not lasting:
        out.print(f"{what}: done in {done.seconds * 1000:.0f} ms (fault {fault_id})", highlight=False)
        return
    out.print(f"fault {fault_id}: {what} applied in {done.seconds * 1000:.0f} ms", highlight=False)
    if seconds is None:
        out.print(f"undo it with: testbed fault {name} heal {fault_id}", highlight=False)
        return
    _wait_then_undo(injector, fault_id, what, seconds)


def _fault_duration(text: Optional[str]) -> Optional[float]:
    from orchestrator.units import parse_interval

    if text is None:
        return None
    try:
        return parse_interval(text)
    except ValueError as exc:
        raise BadUsage(f"--for {exc}") from None


def _wait_then_undo(injector, fault_id: str, what: str, seconds: float) -> None:
    """Hold the fault for `seconds` behind a progress bar, then undo it; Ctrl-C, SIGTERM or
    SIGHUP undo it at once. (A SIGKILL leaves it active: `testbed fault LAB heal` undoes it.)"""
    import time

    from orchestrator.emulation.interrupts import terminate_as_interrupt

    try:
        with terminate_as_interrupt(), _progress() as progress:
            task = progress.add_task(what[:32], total=seconds)
            end = time.monotonic() + seconds
            while (left := end - time.monotonic()) > 0:
                time.sleep(min(0.1, left))
                progress.update(task, completed=seconds - max(0.0, end - time.monotonic()))
    except KeyboardInterrupt:
        err.print("interrupted: undoing the fault now")
    finally:
        if any(f.id == fault_id for f in injector.active()):
            injector.undo(fault_id)
            out.print(f"fault {fault_id} undone", highlight=False)
        else:
            out.print(f"fault {fault_id} was already undone (healed elsewhere)", highlight=False)


def _list_faults(lab, as_json: bool) -> None:
    import datetime

    events = lab.state.fault_events()
    if as_json:
        print(json.dumps(events, indent=1))
        return
    if not events:
        out.print(f"lab {lab.name} has had no faults")
        return
    clock = lambda t: datetime.datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3] if t else "-"
    table = Table("id", "action", "target", "params", "planned", "applied", "undone", "state")
    for event in events:
        params = " ".join(f"{k}={v}" for k, v in event["params"].items())
        state = "active" if event["undone"] is None else "undone"
        table.add_row(event["id"], event["action"], event["target"], params, clock(event["planned"]),
                      clock(event["applied"]), clock(event["undone"]), state)
    out.print(table, highlight=False)


# -- check-algorithm --------------------------------------------------------------------------
@app.command("check-algorithm")
def check_algorithm(
    target: str = typer.Argument(..., help="an algorithm's name, or a plugin file (.py) whose algorithms to check"),
    plugin: List[Path] = typer.Option([], "--plugin", help=PLUGIN_HELP),
    option: List[str] = typer.Option([], "--option", "-o", metavar="KEY=VALUE", help="algorithm option"),
    agents: bool = typer.Option(True, "--agents/--no-agents", help="also run real agents on loopback"),
) -> None:
    """Check an algorithm as the project checks its own: exact reduction over generated rank
    counts, sizes and partitionings (in process), its prediction beside its closed form, and
    a run of real agents on loopback. Exit 1 when a check fails (it names rank, step and bytes)."""
    from orchestrator.collectives import registry
    from orchestrator.cost.report import parse_options
    from orchestrator.experiment import check_algorithm as checking

    _load_plugins(plugin)
    names = checking.names_of(target)
    failed = False
    for name in names:
        origin = registry.get(name).origin
        out.print(Text(f"{name} ({origin})", style="bold"), highlight=False, soft_wrap=True)
        with err.status("") as status:
            verdict = checking.check(name, parse_options(option), agents, progress=lambda line: status.update(line))
        for line in verdict.lines:
            style = "red" if line.startswith("FAIL") else None
            out.print(Text("  " + line, style=style), highlight=False, soft_wrap=True)
        failed |= verdict.failed
    if failed:
        raise typer.Exit(1)


# -- predict ----------------------------------------------------------------------------------
@app.command()
def predict(
    lab: str = typer.Argument(..., help=LAB_HELP),
    algorithm: str = typer.Option(..., "--algorithm", "-a", help="ring, mesh, ps, hips, bml, hdrm, …"),
    size: str = typer.Option("25MB", help="gradient bytes, e.g. 25MB, 100M, 1G (binary multiples)"),
    workers: Optional[int] = typer.Option(None, help="workers (default: every server); ps servers come after them"),
    option: List[str] = typer.Option([], "--option", "-o", metavar="KEY=VALUE",
                                     help="algorithm option, e.g. -o shards=4 -o colocated=true"),
    partition_bytes: Optional[str] = typer.Option(None, help="ByteScheduler partitions of at most this size"),
    credit_bytes: Optional[str] = typer.Option(None, help="bytes of partitions in flight per rank (default: all)"),
    bandwidth: Optional[str] = typer.Option(None, help="override links.bandwidth, e.g. 100Mbit"),
    latency: str = typer.Option("measured", help="α: per-message latency, e.g. 50us; 'measured': as measured "
                                "on this lab (testbed calibrate, or a run), else 0"),
    efficiency: Optional[float] = typer.Option(None, help="payload share of a link (default: TCP's at the MTU, 0.956 at 1500)"),
    top: int = typer.Option(8, help="busiest link directions to list (0: none)"),
    transport: str = typer.Option("tcp", help="the agents' transport (tcp, grpc): its chunks and CPU cost"),
    as_json: bool = typer.Option(False, "--json", help="print the prediction as JSON"),
    plugin: List[Path] = typer.Option([], "--plugin", help=PLUGIN_HELP),
    hosts: Optional[Path] = typer.Option(None, "--hosts", help="a hosts file: the lab split over them, their "
                                         "NICs shared by what crosses"),
) -> None:
    """Predict an allreduce's time on a lab from the schedule the agents would run (no root),
    and, once `testbed calibrate` has run, the CPU it needs of this machine."""
    _load_plugins(plugin)
    from orchestrator.agent.plan import chunk_bytes
    from orchestrator.cost.report import parse_options, predict_lab, render
    from orchestrator.spec import lab_from_argument
    from orchestrator.units import parse_duration, parse_size

    def parsed(flag: str, value: Optional[str], parse):
        try:
            return None if value is None else parse(value)
        except ValueError as exc:
            raise BadUsage(f"{flag}: {exc}") from None

    if top < 0:
        raise BadUsage(f"--top {top}: a count of link directions is 0 or more (0 lists none)")
    chosen = _check_transport("--transport", transport)
    spec = lab_from_argument(lab, **{"links.bandwidth": bandwidth})
    alpha, cores, peer, note = _measured_latency(spec, transport) if latency == "measured" else \
        (parsed("--latency", latency, parse_duration), None, 0.0, None)
    report = predict_lab(
        spec, algorithm, parsed("--size", size, parse_size), workers=workers, options=parse_options(option),
        partition_bytes=parsed("--partition-bytes", partition_bytes, parse_size),
        credit_bytes=parsed("--credit-bytes", credit_bytes, parse_size) or 0,
        chunk_bytes=lambda schedules, credit: chunk_bytes(schedules, credit, transport=transport),
        efficiency=efficiency, latency=alpha, cores=cores, peer_latency=peer,
        send_buffer_bytes=chosen.send_buffer, rendezvous=chosen.rendezvous, hosts=_hosts(hosts),
    )
    if note and not as_json:  # once the prediction stands: bad input stays one line
        err.print(Text(note), highlight=False, soft_wrap=True)
    cpu = _cpu_need(report.prediction, spec, transport) if hosts is None else None  # this machine's: not a split's
    if as_json:
        document = report.to_json()
        document["latency"] = {"alpha_s": alpha, "peer_s": peer, "cores": cores,
                               "source": "given" if latency != "measured" else
                               "measured on this lab" if note is None else note}
        if cpu is not None and not isinstance(cpu, str):
            document["cpu"] = {"cores": cpu.cores, "available_cores": cpu.available, "fits": cpu.fits,
                               "max_rate_bit_s": cpu.max_rate, "transport": transport}
        print(json.dumps(document, indent=1, ensure_ascii=False))
    else:
        out.print(render(report, top), highlight=False, markup=False, soft_wrap=True)
        if cpu is not None:
            out.print(Text(cpu if isinstance(cpu, str) else calibrate_lib().describe(cpu)), highlight=False,
                      soft_wrap=True)


def _hosts(path: Optional[Path]) -> list | None:
    """The hosts of a hosts file (spec/hosts.py), as topology.partition takes them."""
    if path is None:
        return None
    from orchestrator.spec import load
    from orchestrator.spec.hosts import HostsSpec

    return [host.host() for host in load(HostsSpec, path).hosts]


def _measured_latency(spec, transport: str) -> tuple[float, int | None, float, str | None]:
    """(α, the cores the agents share, the per-peer cost) as measured on the lab `spec` over
    `transport`, else (0, None, 0) and a line saying so."""
    lib = calibrate_lib()
    try:
        measured = lib.latency_for(spec, transport)
    except lib.NotCalibrated as exc:
        return 0.0, None, 0.0, f"warning: α left out: {exc}"
    if measured is None:
        return 0.0, None, 0.0, (f"note: α not measured on {lib.lab_key(spec)} over {transport}: left out (measure "
                                "it with `testbed calibrate --latency-only --lab ...`, or give --latency)")
    return measured.alpha, measured.cores, measured.peer, None


def _check_transport(flag: str, name: str):
    """The transport `name` (agent/transports), or BadUsage naming `flag`."""
    from orchestrator.agent import transports

    try:
        return transports.get(name)
    except ValueError as exc:
        raise BadUsage(f"{flag}: {exc}") from None


def calibrate_lib():
    from orchestrator.experiment import calibrate

    return calibrate


def _cpu_need(prediction, lab_spec, transport: str):
    """This machine's CPU need of one allreduce (cost.cpu.CpuNeed), a line saying why not
    known, or None when there is no prediction."""
    if prediction is None:
        return None
    lib = calibrate_lib()
    try:
        calibration = lib.load()
    except lib.NotCalibrated as exc:
        return f"CPU: not known: {exc}"
    from orchestrator.experiment.plan import topology_of

    try:
        return lib.need(prediction, topology_of(lab_spec), transport, calibration)
    except KeyError as exc:
        return f"CPU: not known: {exc.args[0]}"


@app.command()
def calibrate(
    transports_: str = typer.Option("tcp,grpc", "--transports", help="agent transports to measure, comma-separated"),
    labs: List[str] = typer.Option([], "--lab", help="also measure α (per-message latency) on this lab, e.g. "
                                   "bcube,2,1 (repeatable); `testbed run` measures a lab it has not seen itself"),
    latency_only: bool = typer.Option(False, "--latency-only", help="measure α only (on --lab, else star,4), "
                                      "not the CPU per byte"),
) -> None:
    """Measure what an emulated byte costs this machine's CPU (kernel and agents) and what a
    message costs the agents in time (α), and keep both for `predict` and `run` (root; a
    star,4 netns lab for ~1 minute; on a quiet machine)."""
    import os

    from orchestrator.spec import lab_from_argument

    names = [t for t in transports_.split(",") if t]
    for name in names:
        _check_transport("--transports", name)
    if not names:
        raise BadUsage("--transports: name at least one, e.g. tcp")
    for lab in labs:
        try:
            lab_from_argument(lab, name="calibrate-alpha", **{"servers.runtime": "netns"})
        except (TestbedError, ValueError) as exc:
            raise BadUsage(f"--lab {lab}: {exc}") from None
    if os.geteuid() != 0:
        raise BadUsage("testbed calibrate needs root to build its lab (sudo)")
    lib = calibrate_lib()

    def progress(what: str) -> None:
        err.print(Text(f"calibrate: {what}"), highlight=False, soft_wrap=True)

    if not latency_only:
        calibration = lib.measure(names, progress=progress)
        where = lib.save(calibration)
        out.print(Text(f"kernel: {calibration.hop * 1e9:.3f} core-s per GB and link direction; " + "; ".join(
            f"agents over {t}: {v * 1e9:.3f} core-s per GB sent beyond it" for t, v in calibration.agent.items())
            + f"; {calibration.cores} cores. Kept in {where}"), highlight=False, soft_wrap=True)
    for lab in labs or ([lib.LAB] if latency_only else []):
        lib.measure_lab_latency(lab, names, progress=progress)
    kept = lib.load_latency()
    for key, by_transport in sorted(kept.items()):
        for transport, measured in sorted(by_transport.items()):
            out.print(Text(f"α on {key} over {transport}: {lib.describe_latency(measured)}"), highlight=False,
                      soft_wrap=True)


# -- deploy -----------------------------------------------------------------------------------
VIA_HELP = "nsenter (into each server, no SSH), ssh (over the management network, as on real machines), exec (no Ansible)"


def _names(value: Optional[str]) -> Optional[List[str]]:
    return [n for n in value.split(",") if n] if value else None


def _roles(ps: Optional[str]) -> dict:
    return {name: "ps" for name in _names(ps) or []}


@app.command()
def deploy(
    name: str = typer.Argument(..., help="lab name"),
    servers: Optional[str] = typer.Option(None, help="comma-separated servers (default: all)"),
    via: str = typer.Option("nsenter", help=VIA_HELP),
    ps: Optional[str] = typer.Option(None, help="comma-separated servers in the inventory's ps group"),
) -> None:
    """Deploy agents on a lab's servers with Ansible (playbooks/deploy.yml); waits for health."""
    from orchestrator.deploy import deploy as deploy_agents

    with _live_lab(name) as lab, _progress() as progress:  # a split lab: each host deploys its own servers
        deployment = deploy_agents(lab, _names(servers), _roles(ps), via=via, progress=_reporter(progress, "deploying"))
    result = deployment.result
    count = len(deployment.endpoints)
    summary = f"{count} agent{'s' * (count != 1)} healthy on lab {name}"
    if result is not None:
        changed = sum(1 for count in result.changed.values() if count)
        summary += f" ({changed} hosts changed, {result.seconds:.1f} s; log {result.stdout})"
    out.print(summary, highlight=False, soft_wrap=True)


@app.command()
def undeploy(
    name: str = typer.Argument(..., help="lab name"),
    servers: Optional[str] = typer.Option(None, help="comma-separated servers (default: all)"),
    via: str = typer.Option("nsenter", help="nsenter (agents deployed with Ansible) or exec"),
) -> None:
    """Stop and remove a lab's agents (playbooks/undeploy.yml). Idempotent."""
    from orchestrator.deploy import undeploy as undeploy_agents

    with _live_lab(name) as lab, _progress() as progress:
        undeploy_agents(lab, _names(servers), via=via, progress=_reporter(progress, "removing agents"))
    out.print(f"agents of lab {name} removed")


@app.command()
def inventory(
    name: str = typer.Argument(..., help="lab name"),
    fmt: str = typer.Option("yaml", "--format", help="ini, yaml or json"),
    via: str = typer.Option("nsenter", help="how Ansible reaches the servers: nsenter or ssh"),
    ps: Optional[str] = typer.Option(None, help="comma-separated servers in the ps group"),
) -> None:
    """Print an Ansible inventory of a live lab (use it from playbooks/, where ansible.cfg is)."""
    from orchestrator.deploy import inventory_text
    from orchestrator.emulation import Lab
    from orchestrator.hosts import split

    if split.exists(name):
        raise BadUsage(f"lab {name} is split over hosts: each host's Ansible reaches its own servers, with an inventory "
                       f"of its own (under the lab's state there); `testbed deploy {name}` runs it on every host")
    print(inventory_text(Lab.attach(name), fmt, via, _roles(ps)), end="")


# -- monitoring -------------------------------------------------------------------------------
def _monitor_line(monitor) -> str:
    grafana = f"; grafana {monitor.grafana}" if monitor.grafana else " (no grafana-server here: `testbed grafana export`)"
    return (f"prometheus of lab {monitor.lab}: {monitor.url} (pid {monitor.pid}; targets {monitor.targets}; "
            f"data {monitor.data}){grafana}")


@monitor_app.command("up")
def monitor_up(name: str = typer.Argument(..., help="lab name")) -> None:
    """Start the lab's Prometheus (1 s scrapes of every agent, file_sd), or refresh its targets."""
    from orchestrator.monitoring import monitor_up as start

    with _live_lab(name) as lab:
        out.print(_monitor_line(start(lab)), highlight=False, soft_wrap=True)


@monitor_app.command("down")
def monitor_down(name: str = typer.Argument(..., help="lab name")) -> None:
    """Stop the lab's Prometheus (its data stays until the lab is removed)."""
    from orchestrator.monitoring import monitor_down as stop

    with _live_lab(name) as lab:
        stopped = stop(lab)
    out.print(f"prometheus of lab {name} stopped" if stopped else f"lab {name} has no prometheus running")


@monitor_app.command("status")
def monitor_status(name: str = typer.Argument(..., help="lab name")) -> None:
    """Where the lab's Prometheus listens and how its targets are doing."""
    from orchestrator.monitoring import monitor_status as status

    with _live_lab(name) as lab:
        monitor = status(lab)
    if monitor is None:
        out.print(f"lab {name} has no prometheus running: testbed monitor up {name}")
        return
    out.print(_monitor_line(monitor), highlight=False, soft_wrap=True)
    try:
        targets = monitor.active_targets()
    except OSError as exc:
        raise MonitorError(f"prometheus of lab {name} does not answer at {monitor.url}: {exc}") from None
    for target in sorted(targets, key=lambda t: t["labels"].get("node", "")):
        error = f"  {target['lastError']}" if target.get("lastError") else ""
        out.print(f"  {target['labels'].get('node', '?'):<12} {target['scrapeUrl']:<36} {target['health']}{error}",
                  highlight=False, soft_wrap=True)


@grafana_app.command("export")
def grafana_export(
    directory: Path = typer.Argument(..., help="new or empty directory (or a previous export's)"),
    prometheus_url: str = typer.Option("http://127.0.0.1:9090", help="the Prometheus the datasource queries"),
) -> None:
    """Write the dashboards and Grafana provisioning files (paths.provisioning = DIRECTORY)."""
    from orchestrator.monitoring.dashboards import export

    written = export(directory, prometheus_url)
    out.print(f"wrote {len(written)} files into {directory}: point Grafana's paths.provisioning at it",
              highlight=False, soft_wrap=True)


# -- experiments ------------------------------------------------------------------------------
@app.command("run")
def run_experiment(
    experiment: Path = typer.Argument(..., help="experiment file (YAML), e.g. experiments/smoke.yaml"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="results directory (default results/NAME-UTCTIME); "
                                           "a new one: never overwritten; '..' only after existing directories"),
    keep: bool = typer.Option(False, "--keep", help="leave the labs, agents and Prometheus up for exploration"),
    dry_run: bool = typer.Option(False, "--dry-run", help="validate, print the plan and the predictions; no root"),
    strict: bool = typer.Option(False, "--strict", help="refuse a run this machine's CPU cannot carry faithfully "
                                "(by `testbed calibrate`), instead of warning; with --hosts the hosts carry it, not judged"),
    hosts: Optional[Path] = typer.Option(None, "--hosts", help="a hosts file whose hosts are up (testbed hosts "
                                         "up): every lab split over them"),
    plugin: List[Path] = typer.Option([], "--plugin", help=PLUGIN_HELP),
) -> None:
    """Run an experiment: up → monitor → deploy → every sweep point and algorithm (with its
    fault timeline) → results directory → down. Ctrl-C tears down and keeps what was measured."""
    from orchestrator.experiment.plan import make_plan
    from orchestrator.spec.experiment import load_experiment

    _load_plugins(plugin)

    spec = load_experiment(experiment)
    # what this machine has for the agents' gradients (MemAvailable) and threads: a plan that
    # cannot fit is refused here, on a dry run too, before anything is built
    from orchestrator.emulation.capacity import host_limits

    host = host_limits()
    machines = _split_machines(hosts, dry_run) if hosts is not None else None  # a split run's agents are theirs
    plan = make_plan(spec, str(experiment), memory=host.mem_available_mib << 20, tasks=host.tasks_free,
                     machines=machines)
    needs = _plan_needs(plan) if machines is None else SPLIT_CPU
    if dry_run:
        _print_plan(plan, needs)
        return
    heavy = {} if isinstance(needs, str) else {point: cpu for point, cpu in needs.items() if not cpu.fits}
    for point, cpu in heavy.items():
        err.print(Text(f"warning: {point}: {calibrate_lib().describe(cpu)}"), highlight=False, soft_wrap=True)
    if heavy and strict:
        raise BadUsage(f"--strict: {len(heavy)} of {len(plan.points)} runs need more CPU than this machine has for a "
                       "faithful figure: lower links.bandwidth (see the 'ok up to' rates) or drop --strict")
    if strict and isinstance(needs, str) and machines is None:  # a split run's is not this machine's to judge
        raise BadUsage(f"--strict: {needs}")
    import os

    if os.geteuid() != 0:
        raise BadUsage("testbed run needs root to build labs (sudo); --dry-run does not")
    from orchestrator.experiment import results as results_lib
    from orchestrator.experiment.runner import run_experiment as run

    if plan.auto_rate is not None:
        from orchestrator.units import format_rate

        err.print(Text(f"links.bandwidth: auto → {format_rate(plan.auto_rate)} (this machine's calibration)"),
                  highlight=False, soft_wrap=True)
    directory = results_lib.new_directory(spec.name, out_dir)
    err.print(f"experiment {spec.name}: {len(plan.points)} runs on {len(plan.variants)} lab(s); results in {directory}",
              highlight=False)
    try:
        with ExitStack() as stack:
            make_lab = stack.enter_context(_split_maker(hosts))[0] if hosts is not None else None
            progress = stack.enter_context(_experiment_progress())
            outcome = run(plan, experiment, directory, keep=keep, progress=progress, make_lab=make_lab)
    except KeyboardInterrupt:
        err.print(f"interrupted: labs removed; partial results in {directory}", highlight=False)
        raise typer.Exit(130)
    except TestbedError:
        err.print(f"the run failed: labs removed; partial results in {directory}", highlight=False)
        raise
    _print_results(outcome.results)
    out.print(f"results in {directory}", highlight=False)
    for name in outcome.kept:
        out.print(f"lab {name} kept up: testbed status {name}; testbed down {name} when done", highlight=False)


@app.command("report")
def report_command(directory: Path = typer.Argument(..., help="a results directory of `testbed run`")) -> None:
    """Render a results directory again from its results.json: CSV, plots, summary.md.

    results.json is checked before anything is drawn, and nothing is written through a
    symlink: each refusal is one line (exit 2)."""
    from orchestrator.experiment.report import render
    from orchestrator.experiment.results import load

    results = load(directory)
    written = render(directory, results)
    _print_results(results)
    out.print(f"wrote {', '.join(p.relative_to(directory).as_posix() for p in written)} in {directory}",
              highlight=False, markup=False, soft_wrap=True)


@app.command("compare")
def compare_command(
    first: Path = typer.Argument(..., help="results directory A"),
    second: Path = typer.Argument(..., help="results directory B"),
    out_file: Optional[Path] = typer.Option(None, "--out", help="also write the comparison as Markdown here "
                                                                "(not through a symlink)"),
) -> None:
    """Two runs side by side: per matching point (topology, rate, size, algorithm) each run's
    GST, measured/predicted and verdict, and B's GST over A's."""
    from orchestrator.experiment import compare
    from orchestrator.experiment.results import load

    a, b = load(first), load(second)
    table = Table(title=Text(f"A: {first}   B: {second}"))
    for name in compare.HEADER:
        table.add_column(name, overflow="fold")
    for row in compare.rows(a, b):  # Text: a file's names are not rich markup
        table.add_row(*map(Text, row.cells()))
    _print_whole(table)
    if out_file is not None:
        written = compare.write(out_file, compare.markdown(a, b, first, second))
        out.print(f"wrote {written}", highlight=False, markup=False, soft_wrap=True)


# A split run's agents and links use its hosts' cores: this machine's calibration (and its
# cores) say nothing of theirs, so no warning or --strict refusal rests on them.
SPLIT_CPU = ("CPU: not judged: a split run's agents and links use its hosts' cores, which `testbed calibrate` "
             "on this machine does not measure (bench/multihost.py gives what an emulated byte costs split)")


def _plan_needs(plan):
    """{point id: CpuNeed}, or a line saying why this machine's CPU need is not known."""
    lib = calibrate_lib()
    try:
        return lib.plan_needs(plan)
    except lib.NotCalibrated as exc:
        return f"CPU: not known: {exc}"
    except KeyError as exc:
        return f"CPU: not known: {exc.args[0]}"


def _latency_lines(plan) -> list[str]:
    """Per lab, the α its predictions carry and where it comes from."""
    from orchestrator.experiment.plan import latency_of

    lib, transport, lines = calibrate_lib(), plan.spec.agents.transport, []
    for variant in plan.variants:
        measured = latency_of(plan.spec, variant.lab)
        where = f"{variant.lab.name} ({lib.lab_key(variant.lab)})"
        if measured is not None:
            lines.append(f"α on {where} over {transport}: {measured.alpha * 1e6:,.0f} µs per message and "
                         f"{measured.peer * 1e6:,.0f} µs more per further peer, the agents sharing {measured.cores} "
                         "cores, as measured on it")
            continue
        try:
            kept = lib.load_latency().get(lib.lab_key(variant.lab), {}).get(transport)
        except lib.NotCalibrated:  # unreadable: latency_of said None for it, and the run will say why
            kept = None
        why = lib.distrust(kept) if isinstance(kept, dict) else None
        state = f"{why}, so not trusted" if why else "not measured yet"
        lines.append(f"α on {where} over {transport}: {state}, so left out here: the run measures it "
                     "before its first point (or `testbed calibrate --latency-only --lab ...`)")
    return lines


def _print_plan(plan, needs=None) -> None:
    spec = plan.spec
    iterations = {p.iterations for p in plan.points}
    kinds = {p.point.workload.kind for p in plan.points}
    jobs = f" ({len(spec.jobs)} jobs, each alone and then together)" if spec.jobs else ""
    out.print(f"experiment {spec.name}: {len(plan.points)} runs{jobs} on {len(plan.variants)} lab(s), "
              f"{'/'.join(str(i) for i in sorted(iterations))} iterations each ({spec.warmup} warm-up), workload "
              f"{'/'.join(sorted(kinds))}, agents via {spec.agents.via}, monitoring {'on' if spec.monitoring else 'off'}",
              highlight=False, soft_wrap=True)
    table = Table()
    known = isinstance(needs, dict)
    for name in ("point", "lab", "workers+ps", "predicted GST s", "busbw Mbit/s", "faults") + \
            (("CPU cores: need/may", "ok up to") if known else ()):
        table.add_column(name, overflow="fold")
    for planned in plan.points:
        prediction = planned.prediction
        cpu = needs.get(planned.point.id) if known else None
        cells = (planned.point.id, planned.point.lab.name, f"{len(planned.layout.workers)}+{len(planned.layout.servers)}",
                 f"{prediction.per_run:.4g}", f"{prediction.busbw * 8 / 1e6:.4g}", str(len(planned.faults)))
        if known:
            cells += (f"{cpu.cores:.2f}/{cpu.available:.2f}" + ("" if cpu.fits else " (too much)"),
                      calibrate_lib().rate_floor(cpu.max_rate))
        table.add_row(*(Text(cell) for cell in cells))
    _print_whole(table)
    for line in _latency_lines(plan):
        out.print(Text(line), highlight=False, soft_wrap=True)
    if getattr(spec.agents.workload, "compute", None) is not None and spec.agents.workload.compute.varies:
        # stragglers: say how much of each prediction their skew is, or that the model could not follow them
        skews = [f"{p.prediction.parts['skew'] * 1e3:.3g} ms ({p.point.id})" if "skew" in (p.prediction.parts or {})
                 else f"not followed, too large for the model ({p.point.id})" for p in plan.points]
        out.print(Text("stragglers: the workload's compute varies; of the predicted times above, the skew adds "
                       + ", ".join(skews)), highlight=False, soft_wrap=True)
    if plan.auto_rate is not None:
        from orchestrator.units import format_rate

        out.print(Text(f"links.bandwidth: auto → {format_rate(plan.auto_rate)}, the highest rate this machine's "
                       "calibration says every point carries with its verdict ok"), highlight=False, soft_wrap=True)
    if isinstance(needs, str):
        out.print(Text(needs), highlight=False, soft_wrap=True)
    faults = {f.describe() for p in plan.points for f in p.faults}
    for line in sorted(faults):
        out.print(Text(f"fault: {line}"), highlight=False)


def _print_results(results: dict) -> None:
    """The run's table, every cell whole: the point's name, its ratio, checker and verdict
    are what the run is for, on a terminal or in a pipe or CI log."""
    from orchestrator.experiment.report import TABLE_HEADER, table_rows

    shown = ("point", "status", "GST mean s", "sync s, no fault", "predicted s", "ratio", "busbw Mbit/s", "faults",
             "checker", "verdict")
    columns = [TABLE_HEADER.index(name) for name in shown]
    table = Table(title=Text(f"{results['experiment']['name']}: {results['status']}"))
    for name in shown:
        table.add_column(name, overflow="fold")
    for row in table_rows(results):  # Text: a file's names are not rich markup
        table.add_row(*(Text(row[i]) for i in columns))
    _print_whole(table)
    from orchestrator.experiment import jobs

    shared = jobs.table_rows(results)
    if shared:
        table = Table(title=Text("jobs on one fabric: measured / predicted"))
        for name in jobs.HEADER:
            table.add_column(name, overflow="fold")
        for row in shared:
            table.add_row(*(Text(cell) for cell in row))
        _print_whole(table)


def _print_whole(table: Table) -> None:
    """`table` with no cell cut: as wide as it needs where the output is not a terminal (a
    pipe, a file, a CI log: rich would assume 80 columns and end cells with "…"); on a
    terminal, a cell too long for it folds onto more lines instead."""
    if out.is_terminal:
        out.print(table)
        return
    needed = out.measure(table, options=out.options.update_width(100_000)).maximum
    Console(file=out.file, width=max(needed, out.width), no_color=out.no_color, highlight=False).print(table)


class _ExperimentProgress:
    """A bar per phase (lab up, deploy, …) and one per run's iterations, on a terminal; one
    line per stage and iteration otherwise (logs, CI, a test reading the output)."""

    def __init__(self) -> None:
        self.bars = _progress() if err.is_terminal else None
        self.tasks: dict[str, int] = {}
        self.last: tuple = ()

    def __enter__(self) -> "_ExperimentProgress":
        if self.bars is not None:
            self.bars.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.bars is not None:
            self.bars.__exit__(*exc)

    def __call__(self, phase: str, text: str, done: int, total: int) -> None:
        if phase == "point":
            return
        label = f"{phase}: {text}" if phase != "run" else f"run {text}: iteration {done}/{total}"
        if self.bars is None:
            if (phase, text, done) != self.last and (phase == "run" or done in (0, total) or not total):
                err.print(label, highlight=False, soft_wrap=True)
                self.last = (phase, text, done)
            return
        key = f"run {text}" if phase == "run" else phase
        if key not in self.tasks:
            self.tasks[key] = self.bars.add_task(label[:60], total=total or None)
        self.bars.update(self.tasks[key], description=label[:60], completed=done, total=total or None)


def _experiment_progress() -> _ExperimentProgress:
    return _ExperimentProgress()


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
