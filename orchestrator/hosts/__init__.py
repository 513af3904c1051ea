"""Several hosts (issue 31): the links of a lab that cross hosts carried as VXLAN wires
(wires.py), and hosts faked as namespaces on an underlay bridge for the hosts tier and the
benchmarks (fake.py). The engine that runs emulation's work on each host comes next."""
