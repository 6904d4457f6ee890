"""Trace format v1: the records, steps and manifest a trace holds, and their JSON form.

A trace is a folder::

    manifest.json   format, version, status, command, revision, seed, policy,
                    environment, outcome, and the size + SHA-256 of every file
    steps.jsonl     one line per step: batch IDs, records in chain order, scalars
    tensors/        step-KKKKKK.safetensors: full tensors for the steps the policy keeps
    state/step-K/   complete checkpoints (safetensors + JSON)

Chain order within a step is what makes "first" meaningful: ``KINDS`` lists it.
``init`` (the parameters before the first update, step 0 only) comes first, so that an
unseeded or changed initialization is named as such rather than at a later record.
Evaluation (forward passes under ``no_grad``/``inference_mode``, Lightning's sanity check,
validation and test) is never a record: it is summarised in the step's ``scalars["eval"]``,
which compare does not use for its verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from reprobisect.errors import TraceError

__all__ = [
    "FORMAT",
    "VERSION",
    "KINDS",
    "STATUSES",
    "Record",
    "Step",
    "Manifest",
    "shard_name",
    "tensor_key",
]

FORMAT = "reprobisect-trace"
VERSION = 1
KINDS = ("init", "batch", "input", "activation", "output", "loss", "grad", "param", "optim_state")
STATUSES = ("complete", "incomplete", "failed")
STAT_KEYS = ("norm", "min", "max", "mean", "nan", "inf")


def shard_name(step: int) -> str:
    return f"tensors/step-{step:06d}.safetensors"


def tensor_key(kind: str, name: str) -> str:
    return f"{kind}/{name}"


def stat_value(x: Any) -> float:
    """A statistic as a float (JSON keeps non-finite values as strings)."""
    if isinstance(x, str):
        return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[x]
    return float(x)


@dataclass(frozen=True)
class Record:
    """One tensor of the chain at one step: what it is, its exact-bit fingerprint, its stats.

    ``name`` is unique per (step, kind): a module path for activations (``encoder.norm``,
    ``encoder.norm#1`` for its second call), a parameter name for grads and params,
    ``param/state`` for optimizer state. ``inputs`` holds the fingerprints of a module's
    inputs, which is what lets compare tell the module that introduced a difference from
    the modules that merely passed it on.
    """

    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    fingerprint: str
    order: int = -1
    stats: dict[str, Any] | None = None
    stored: bool = False
    module: str | None = None
    inputs: tuple[str, ...] | None = None
    meta: dict[str, Any] | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.name)

    def stat(self, name: str) -> float | None:
        if not self.stats or name not in self.stats:
            return None
        return stat_value(self.stats[name])

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "order": self.order,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "fingerprint": self.fingerprint,
            "stats": self.stats,
            "stored": self.stored,
        }
        if self.module is not None:
            d["module"] = self.module
        if self.inputs is not None:
            d["inputs"] = list(self.inputs)
        if self.meta:
            d["meta"] = self.meta
        return d

    @classmethod
    def from_json(cls, d: Any, where: str) -> "Record":
        if not isinstance(d, dict):
            raise TraceError(f"{where}: a record is not an object")
        try:
            rec = cls(
                name=_typed(d["name"], str),
                kind=_typed(d["kind"], str),
                order=_typed(d["order"], int),
                dtype=_typed(d["dtype"], str),
                shape=tuple(_typed(x, int) for x in _typed(d["shape"], list)),
                fingerprint=_typed(d["fingerprint"], str),
                stats=d.get("stats"),
                stored=bool(d.get("stored", False)),
                module=d.get("module"),
                inputs=tuple(d["inputs"]) if d.get("inputs") is not None else None,
                meta=d.get("meta"),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise TraceError(f"{where}: malformed record ({e})") from None
        if rec.kind not in KINDS:
            raise TraceError(f"{where}: record '{rec.name}' has unknown kind '{rec.kind}'")
        return rec


def _typed(x: Any, t: type) -> Any:
    if not isinstance(x, t) or (t is int and isinstance(x, bool)):
        raise TypeError(f"expected {t.__name__}, got {type(x).__name__}")
    return x


@dataclass(frozen=True)
class Step:
    """All records of one optimizer step, in chain order, plus its scalars."""

    step: int
    records: tuple[Record, ...]
    batch_ids: list[Any] | None = None
    scalars: dict[str, Any] = field(default_factory=dict)

    def by_key(self) -> dict[tuple[str, str], Record]:
        return {r.key: r for r in self.records}

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "batch_ids": self.batch_ids,
            "records": [r.to_json() for r in self.records],
            "scalars": self.scalars,
        }

    @classmethod
    def from_json(cls, d: Any, where: str) -> "Step":
        if not isinstance(d, dict) or not isinstance(d.get("step"), int) or not isinstance(d.get("records"), list):
            raise TraceError(f"{where}: not a step line (needs 'step' and 'records')")
        records = tuple(Record.from_json(r, f"{where}, record {i}") for i, r in enumerate(d["records"]))
        scalars = d.get("scalars") or {}
        if not isinstance(scalars, dict):
            raise TraceError(f"{where}: 'scalars' is not an object")
        return cls(step=d["step"], records=records, batch_ids=d.get("batch_ids"), scalars=scalars)


@dataclass(frozen=True)
class Manifest:
    """What a trace is: the run it recorded, how, in what environment, and how it ended."""

    status: str
    command: list[str]
    environment: dict[str, Any]
    policy: dict[str, Any]
    steps: int = 0
    seed: Any = None
    revision: dict[str, Any] | None = None
    outcome: dict[str, Any] | None = None
    error: str | None = None
    created: str | None = None
    recorder: dict[str, Any] | None = None
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "status": self.status,
            "command": self.command,
            "revision": self.revision,
            "seed": self.seed,
            "policy": self.policy,
            "environment": self.environment,
            "steps": self.steps,
            "outcome": self.outcome,
            "error": self.error,
            "created": self.created,
            "recorder": self.recorder,
            "files": self.files,
            "extra": self.extra,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], where: str) -> "Manifest":
        try:
            status = _typed(d["status"], str)
            if status not in STATUSES:
                raise ValueError(f"unknown status '{status}'")
            return cls(
                status=status,
                command=list(d.get("command") or []),
                environment=_typed(d.get("environment") or {}, dict),
                policy=_typed(d.get("policy") or {}, dict),
                steps=_typed(d.get("steps", 0), int),
                seed=d.get("seed"),
                revision=d.get("revision"),
                outcome=d.get("outcome"),
                error=d.get("error"),
                created=d.get("created"),
                recorder=d.get("recorder"),
                files=_typed(d.get("files") or {}, dict),
                extra=_typed(d.get("extra") or {}, dict),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise TraceError(f"{where}: malformed manifest ({e}); re-run the capture") from None
