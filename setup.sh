#!/usr/bin/env bash
# testbed: install everything on a fresh Debian 12 machine (as root), then run something.
#
#   ./setup.sh demo    install, then run experiments/demo.yaml (BCube(4,1) in Docker, ~5 min) and
#                      print where its report is
#   ./setup.sh lab     install, then bring up, describe and exercise the BCube(4,1) lab (left up)
#   ./setup.sh test    install, then run every test tier (skipped tiers print why)
#   ./setup.sh         install only
#
# Idempotent: packages, the venv and images are only (re)built when missing or stale, and
# dockerd is started only if it is not running.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")"
ROOT=$PWD
VENV=$ROOT/.venv

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
    echo "setup.sh needs root (it installs packages and builds network namespaces): sudo $0 $*" >&2
    exit 1
fi

APT_PACKAGES=(
    python3 python3-venv python3-dev build-essential
    docker.io mininet iproute2 iptables ethtool iputils-ping fping iperf3 traceroute bridge-utils
    util-linux procps psmisc kmod prometheus debootstrap ca-certificates nftables
    qemu-system-x86 busybox-static cpio rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest python3-pyverbs
    daemontools openssh-client strace
)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

"$ROOT/scripts/start-dockerd.sh"

if [ ! -x "$VENV/bin/python" ]; then
    log "creating the virtual environment in .venv"
    /usr/bin/python3 -m venv "$VENV"
fi
stamp=$VENV/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -e "$stamp" ]; then
    log "installing testbed and its Python dependencies into .venv"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --upgrade pip setuptools wheel
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -e ".[test]"
    rm -f "$VENV"/.installed-* && touch "$stamp"
fi

# rdma-core's Python binding comes with Debian's rdma-core (built against this very libibverbs),
# not from PyPI: the venv sees that package and nothing else of the system's
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[ -d /usr/lib/python3/dist-packages/pyverbs ] && ln -sfn /usr/lib/python3/dist-packages/pyverbs "$site/pyverbs"

# the tcp transport's native data path (orchestrator/agent/native/dataplane.c, ~1 s with gcc):
# rebuilt whenever its source is newer; the agent wheel and the server image carry it
"$VENV/bin/python" -c 'from orchestrator.agent import native; native.build_if_stale()'

# Host settings the README's labs need (up to fattree,16: the neighbour table's cap), one
# line each with why, from orchestrator/emulation/capacity.py: the figures `testbed up`
# checks. A value the host already has higher is kept, never lowered.
SYSCTL_CONF=/etc/sysctl.d/60-testbed.conf
"$VENV/bin/python" -c 'from orchestrator.emulation.capacity import sysctl_conf; print(sysctl_conf(), end="")' \
    >"$SYSCTL_CONF.tmp"
mv "$SYSCTL_CONF.tmp" "$SYSCTL_CONF"
settings=$(grep -v '^#' "$SYSCTL_CONF" | tr '\n' ' ')
if sysctl -q -p "$SYSCTL_CONF" >/dev/null; then
    log "host settings the README's labs need written to $SYSCTL_CONF and applied: ${settings% }"
else
    log "wrote $SYSCTL_CONF but could not apply it (${settings% }): testbed up refuses large labs until it is"
fi

if [ "${1:-}" != test ]; then  # the test command builds them beside its unit tier (tests/prepare.py)
    log "building lab images (quick when up to date)"
    "$VENV/bin/testbed" images build
fi

case "${1:-}" in
    demo)
        out=results/demo-$(date -u +%Y%m%dT%H%M%SZ)
        log "running experiments/demo.yaml: ps, ring, hips and bml on 16 Docker servers (about 5 minutes)"
        "$VENV/bin/testbed" run experiments/demo.yaml --out "$out"
        log "report: $out/summary.md (plots gst.png, iterations.png, links.png; Prometheus in $out/prometheus)"
        log "render it again: .venv/bin/testbed report $out; compare runs: .venv/bin/testbed compare DIR DIR"
        ;;
    lab) exec "$ROOT/scripts/demo.sh" ;;
    test) exec "$ROOT/scripts/run-tests.sh" "${@:2}" ;;
    "") log "installed: try ./setup.sh demo, or .venv/bin/testbed --help" ;;
    *) echo "usage: $0 [demo|lab|test]" >&2; exit 2 ;;
esac
