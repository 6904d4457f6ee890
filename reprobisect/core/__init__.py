"""The framework-free core the workflows use: comparing traces, searching an axis, the
session log, describing and judging a probe, options and hints.
"""
