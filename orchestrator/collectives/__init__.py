"""Collectives as schedules: pure functions from ranks, topology facts and a tensor layout
to ordered steps of transfers. The same schedule is executed by the agents, checked
in-process by `schedule.simulate`, and costed by the model."""
