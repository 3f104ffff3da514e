"""The study as experiments: grids of runs, a sequential runner, tables and figures.

jaxdistill.sweep is the command line and re-exports the functions users call.
"""
