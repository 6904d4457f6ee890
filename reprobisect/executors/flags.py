"""``ExecutorFlag``: one setting an executor adds to the command line and to config files.

Plain data (no click): each executor module lists its flags next to its config
dataclass; ``reprobisect.executors.EXECUTORS`` registers them and the CLI
(``reprobisect.cli.options``) turns them into click options and config-file keys.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ExecutorFlag"]


@dataclass(frozen=True)
class ExecutorFlag:
    """One setting of an executor's config dataclass, as a command-line flag and a config-file key."""

    field: str
    """The config dataclass's field it fills."""
    flag: str
    """The flag, e.g. ``--address``; its name without dashes is also a config-file key."""
    kind: str
    """``str``, ``number`` (finite, >= 0) or ``choice`` (one of ``choices``)."""
    help: str
    choices: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    """Further config-file keys for it (e.g. ``ray_address``)."""
