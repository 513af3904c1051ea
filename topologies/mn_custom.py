"""Mininet custom topologies from testbed: `mn --custom topologies/mn_custom.py --topo bcube,4,1`.

Topos: bcube,N,K · fattree,K · torus,K,D · bigraph,SWITCHES,SERVERS_PER_SWITCH ·
leafspine,LEAVES,SPINES,SERVERS_PER_LEAF · star,SERVERS. Servers get testbed's addresses and
routes (BCube servers relay, routers use ECMP); switches live in their own namespaces, so no
controller is needed:

    sudo mn --custom topologies/mn_custom.py --topo fattree,4 --controller none --test pingall

Add `--link tc,bw=100` to shape links. Works with Debian's `mn` (system Python) as well as
with the project's venv.
"""

import sys
from pathlib import Path
from types import SimpleNamespace

# `mn` execs this file without __file__; the code object still knows where it came from.
_HERE = Path(sys._getframe().f_code.co_filename).resolve()
sys.path.insert(0, str(_HERE.parent.parent))

from orchestrator import topology  # noqa: E402  (needs the path above)
from orchestrator.topology.mininet_topo import to_mininet  # noqa: E402


def _topo(kind):
    def make(*values):
        spec = SimpleNamespace(kind=kind, **dict(zip(topology.kinds.shorthand()[kind], values)))
        return to_mininet(topology.build(spec))

    return make


topos = {kind: _topo(kind) for kind in topology.kinds.shorthand()}
