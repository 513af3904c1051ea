"""Running collectives on agents: workloads, the driver that configures and starts agents
and collects their records, and ways to start agents (loopback, or inside a lab)."""
