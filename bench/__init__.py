"""The bench tree: measurements and probes that users do not run, apart from the shipped package.

One entry point, from the repository root (the engine is imported from this checkout):

    python -m bench [--out DIR] [--work-dir DIR] STAGE [stage options] [sluice bench flags]

`python -m bench --help` lists the stages; BENCHMARKS.md gives each figure with the command that measured it.
"""
