"""The workflows that answer a user's question: runs, repro, seeds, envs, capture, zoom, demo.

Each takes plain option dataclasses and returns result dataclasses; the CLI renders them.
"""
