"""Everything that drives the edge and the cloud together, in rooms by concern.

- ``sim.cli``: the umbrella ``splitspec`` command (``splitspec-edge`` and
  ``splitspec-cloud`` are the sides' own entry points).
- ``sim.commands``: argparse glue only; each module adds one command group.
- ``sim.inprocess``: the one place both sides run in one process (no wire).
- ``sim.link``: the TCP link emulator, its self-check, network scenarios.
- ``sim.perf``: the performance model, its fit on measured runs, hardware
  profiles and the ``sim model`` report (modelled, never measured).
- ``sim.experiment``: ``sim run``: real processes, the runner, reports.
- ``sim.bench``: benchmarks that print numbers.
- ``sim.fixtures``: tiny deterministic models for tests and trials.
"""
