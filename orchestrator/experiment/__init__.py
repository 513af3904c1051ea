"""Experiments: an experiment file expanded into run points (sweep, pure), planned with the
cost model's predictions (plan), run on live labs (runner), written to a results directory
(results, plots) and rendered again from it (report). Nothing imports this package but the CLI.
"""
