#!/usr/bin/env bash
# The main demo: a BCube(4,1) lab in Docker, described, exercised and drawn.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
T=.venv/bin/testbed
LAB=topologies/bcube-4-1.yaml
mkdir -p out

$T down bcube-4-1 >/dev/null 2>&1 || true
$T topology $LAB
$T topology $LAB --png out/bcube-4-1.png
$T up $LAB
$T status bcube-4-1 | head -12
echo; echo "h00 → h33 is routed through a relay server (digit correction):"
$T topology $LAB --route h00 h33
$T exec bcube-4-1 h00 -- traceroute -n -q1 -w1 10.1.3.4 2>/dev/null || true
echo; echo "all-pairs reachability (Mininet's pingall on the live lab):"
printf 'pingall\nexit\n' | $T cli bcube-4-1 2>&1 | grep -E "Results"
echo; echo "iperf3 across a 100 Mbit link:"
$T exec bcube-4-1 h01 -- iperf3 -s -1 -D
sleep 0.5
$T exec bcube-4-1 h00 -- iperf3 -c 10.0.0.2 -t 3 -f m | tail -3
cat <<MSG

The lab is still up. Explore it:
  .venv/bin/testbed cli bcube-4-1          # Mininet's CLI: pingall, h00 ping h33, ...
  .venv/bin/testbed exec bcube-4-1 h00 -- ip route
  .venv/bin/testbed down bcube-4-1         # remove it
Topology picture: out/bcube-4-1.png
MSG
