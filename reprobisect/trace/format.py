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
``collective`` records (a distributed run: ``reprobisect.runners.distributed_torch``) hold
what entered (``NAME/in``) and left (``NAME/out``) each collective that carries training
data -- a DDP gradient bucket, a c10d all-reduce/broadcast/all-gather/reduce-scatter -- in
the order the calls were made; they come before ``grad``, since the gradients an optimizer
steps with are what the collectives left. Their ``meta`` says which op and bucket.
Evaluation (forward passes under ``no_grad``/``inference_mode``, Lightning's sanity check,
validation and test) is never a record: it is summarised in the step's ``scalars["eval"]``,
which compare does not use for its verdict.

Detail levels (the manifest's ``policy.detail``; a trace without it is ``full``):
``full`` holds every record of the chain each step; ``sentinel`` holds only the cheap
sentinels of each step (``SENTINEL_KINDS``: the initial parameters at step 0, the batch
IDs and batch tensors, the loss, the parameters after the step; and the scalars
``SENTINEL_SCALARS``: total gradient norm, learning rates, GradScaler scale) plus the
complete state every ``policy.state_every`` steps (``state/step-K`` after steps K-1,
2K-1, ...), from which the steps in between can be replayed at full detail.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from reprobisect.errors import TraceError
from reprobisect.trace.jsonsafe import is_int

__all__ = [
    "FORMAT",
    "VERSION",
    "DTYPES",
    "KINDS",
    "STATUSES",
    "Record",
    "new_record",
    "Step",
    "Manifest",
    "DETAILS",
    "SENTINEL_KINDS",
    "SENTINEL_SCALARS",
    "DEFAULT_STATE_EVERY",
    "check_file_name",
    "shard_name",
    "tensor_key",
]

FORMAT = "reprobisect-trace"
VERSION = 1
KINDS = ("init", "batch", "input", "activation", "output", "loss", "collective", "grad", "param", "optim_state")
STATUSES = ("complete", "incomplete", "failed")
STAT_KEYS = ("norm", "min", "max", "mean", "nan", "inf")
DETAILS = ("full", "sentinel")
"""Detail levels a trace can be recorded at (``policy.detail``); ``full`` when absent."""
SENTINEL_KINDS = ("init", "batch", "loss", "param")
"""Record kinds a ``sentinel`` trace holds (no activations, gradients or optimizer state)."""
SENTINEL_SCALARS = ("grad_norm", "lr", "scaler_scale")
"""Step scalars a ``sentinel`` trace compares, besides its records (in this order)."""
DEFAULT_STATE_EVERY = 50
"""Steps between complete-state captures of a ``sentinel`` trace when none is given."""


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
            raise TraceError(f"{where}: a record is a JSON {_json_type(d)}, not an object")
        try:
            shape = _shape(_field(d, "shape", list))
            dtype = _field(d, "dtype", str)
            if dtype not in DTYPES:
                raise ValueError(f"unknown dtype {_short(dtype)}")
            stats = _field(d, "stats", dict, optional=True)
            if stats is not None:
                for k, v in stats.items():
                    if not (_is_number(v) or v in _NON_FINITE):
                        raise ValueError(f"stat '{k}' is {_short(v)}, not a number or \"nan\"/\"inf\"/\"-inf\"")
            inputs = _field(d, "inputs", list, optional=True)
            if inputs is not None and not all(isinstance(x, str) for x in inputs):
                raise ValueError("'inputs' holds something other than fingerprint strings")
            rec = cls(
                name=_field(d, "name", str),
                kind=_field(d, "kind", str),
                order=_field(d, "order", int),
                dtype=dtype,
                shape=shape,
                fingerprint=_field(d, "fingerprint", str),
                stats=stats,
                stored=_field(d, "stored", bool, optional=True) or False,
                module=_field(d, "module", str, optional=True),
                inputs=tuple(inputs) if inputs is not None else None,
                meta=_field(d, "meta", dict, optional=True),
            )
        except (TypeError, ValueError) as e:
            raise TraceError(f"{where}: malformed record ({e})") from None
        if rec.kind not in KINDS:
            raise TraceError(f"{where}: record '{rec.name}' has unknown kind '{rec.kind}'")
        return rec


MAX_RANK = 32
MAX_ELEMENTS = 2**48
"""Largest element count a recorded shape may have (far beyond any real tensor; keeps
every later product of dimensions inside int64)."""
_NON_FINITE = ("nan", "inf", "-inf")
DTYPES = frozenset(
    # every dtype name ``fingerprint.dtype_name`` gives for torch 2.x, NumPy, ml_dtypes and
    # TensorFlow; a name outside it is a malformed (or newer-than-this-reader) trace
    "bool string resource variant "
    "int1 int2 int3 int4 int5 int6 int7 int8 int16 int32 int64 "
    "uint1 uint2 uint3 uint4 uint5 uint6 uint7 uint8 uint16 uint32 uint64 "
    "qint8 qint16 qint32 quint8 quint16 quint2x4 quint4x2 bits1x8 bits2x4 bits4x2 bits8 bits16 "
    "float16 float32 float64 float96 float128 longdouble bfloat16 "
    "float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float8_e8m0fnu float8_e3m4 "
    "float8_e4m3 float8_e4m3b11fnuz float6_e2m3fn float6_e3m2fn float4_e2m1fn float4_e2m1fn_x2 "
    "complex32 complex64 complex128 complex192 complex256 bcomplex32".split()
)
"""Record dtype names a trace may hold."""
_FILE_PART = re.compile(r"^[A-Za-z0-9_.+=@-]+$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_TYPE_NAMES = {str: "a string", int: "an integer", bool: "true/false", list: "an array", dict: "an object"}


def _json_type(x: Any) -> str:
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "boolean"
    return {dict: "object", list: "array", str: "string", int: "number", float: "number"}.get(type(x), type(x).__name__)


def _short(x: Any) -> str:
    r = repr(x)
    return r if len(r) <= 40 else r[:37] + "..."


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _field(d: dict[str, Any], key: str, t: type, *, optional: bool = False) -> Any:
    """``d[key]`` if it is a ``t`` (a bool is not an int here); None if optional and absent/null."""
    if key not in d:
        if optional:
            return None
        raise ValueError(f"no '{key}' field")
    x = d[key]
    if x is None and optional:
        return None
    if not isinstance(x, t) or (t is int and isinstance(x, bool)):
        raise ValueError(f"'{key}' is a JSON {_json_type(x)}, not {_TYPE_NAMES.get(t, t.__name__)}")
    return x


def _shape(xs: list[Any]) -> tuple[int, ...]:
    if len(xs) > MAX_RANK:
        raise ValueError(f"'shape' has {len(xs)} dimensions, more than {MAX_RANK}")
    count = 1
    for x in xs:
        if not is_int(x) or x < 0:
            raise ValueError(f"'shape' holds {_short(x)}, not a non-negative integer")
        count *= x
    if count > MAX_ELEMENTS:
        raise ValueError(f"'shape' {_short(xs)} has {count} elements, more than any real tensor")
    return tuple(xs)


def check_file_name(rel: Any) -> str:
    """A manifest file name: relative, '/'-separated, inside the trace (no '..', no '.')."""
    if not isinstance(rel, str) or not rel or len(rel) > 1024:
        raise ValueError(f"file name {_short(rel)} is not a relative path")
    parts = rel.split("/")
    if rel.startswith("/") or len(parts) > 16 or any(p in ("", ".", "..") or not _FILE_PART.match(p) for p in parts):
        raise ValueError(f"file name {_short(rel)} is not a plain relative path inside the trace")
    return rel


def _files(x: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(x, dict):
        raise ValueError(f"'files' is a JSON {_json_type(x)}, not an object")
    for rel, info in x.items():
        check_file_name(rel)
        if not isinstance(info, dict):
            raise ValueError(f"files entry '{rel}' is a JSON {_json_type(info)}, not an object")
        size, digest = info.get("size"), info.get("sha256")
        if not is_int(size) or size < 0:
            raise ValueError(f"files entry '{rel}' has size {_short(size)}, not a non-negative integer")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise ValueError(f"files entry '{rel}' has sha256 {_short(digest)}, not 64 hex digits")
    return x


def new_record(name: str, kind: str, dtype: str, shape: tuple[int, ...], fingerprint: str, order: int = -1,
               stats: dict[str, Any] | None = None, module: str | None = None, inputs: tuple[str, ...] | None = None,
               meta: dict[str, Any] | None = None) -> Record:
    """``Record(...)`` for a recorder, which makes hundreds a step: the same frozen object,
    its fields set at once (0.4 us) rather than through the frozen ``__init__``'s
    ``object.__setattr__`` per field (1.6 us)."""
    rec = object.__new__(Record)
    rec.__dict__.update(name=name, kind=kind, dtype=dtype, shape=shape, fingerprint=fingerprint, order=order,
                        stats=stats, stored=False, module=module, inputs=inputs, meta=meta)
    return rec


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
        if not isinstance(d, dict) or "step" not in d or not isinstance(d.get("records"), list):
            raise TraceError(f"{where}: not a step line (needs 'step' and 'records')")
        k = d["step"]
        if not is_int(k) or k < 0:
            raise TraceError(f"{where}: 'step' is {_short(k)}, not a non-negative integer")
        records = tuple(Record.from_json(r, f"{where}, record {i}") for i, r in enumerate(d["records"]))
        scalars = d.get("scalars")
        if scalars is None:
            scalars = {}
        if not isinstance(scalars, dict):
            raise TraceError(f"{where}: 'scalars' is a JSON {_json_type(scalars)}, not an object")
        batch_ids = d.get("batch_ids")
        if batch_ids is not None and not isinstance(batch_ids, list):
            raise TraceError(f"{where}: 'batch_ids' is a JSON {_json_type(batch_ids)}, not an array or null")
        return cls(step=k, records=records, batch_ids=batch_ids, scalars=scalars)


def _check_detail(policy: dict[str, Any]) -> None:
    """``policy.detail`` (absent: full) is a level this reader knows; ``state_every`` a positive integer."""
    detail = policy.get("detail")
    if detail is not None and detail not in DETAILS:
        raise ValueError(f"unknown detail level {_short(detail)} (this reader knows {', '.join(DETAILS)}; "
                         "a newer reprobisect may have written it)")
    k = policy.get("state_every")
    if k is not None and not (is_int(k) and k >= 1):
        raise ValueError(f"'policy.state_every' is {_short(k)}, not a positive integer")


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

    @property
    def detail(self) -> str:
        """``full`` or ``sentinel``: what each step of the trace holds (older traces: ``full``)."""
        return self.policy.get("detail") or "full"

    @property
    def state_every(self) -> int | None:
        """Steps between complete-state captures (``policy.state_every``), or None."""
        k = self.policy.get("state_every")
        return k if is_int(k) and k >= 1 else None

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
            status = _field(d, "status", str)
            if status not in STATUSES:
                raise ValueError(f"unknown status '{status}'")
            command = _field(d, "command", list, optional=True) or []
            if not all(isinstance(c, str) for c in command):
                raise ValueError("'command' holds something other than strings")
            steps = _field(d, "steps", int, optional=True) or 0
            if steps < 0:
                raise ValueError(f"'steps' is {steps}")
            _check_detail(_field(d, "policy", dict, optional=True) or {})
            return cls(
                status=status,
                command=list(command),
                environment=_field(d, "environment", dict, optional=True) or {},
                policy=_field(d, "policy", dict, optional=True) or {},
                steps=steps,
                seed=d.get("seed"),
                revision=_field(d, "revision", dict, optional=True),
                outcome=_field(d, "outcome", dict, optional=True),
                error=_field(d, "error", str, optional=True),
                created=_field(d, "created", str, optional=True),
                recorder=_field(d, "recorder", dict, optional=True),
                files=_files(d["files"] if d.get("files") is not None else {}),
                extra=_field(d, "extra", dict, optional=True) or {},
            )
        except (TypeError, ValueError) as e:
            raise TraceError(f"{where}: malformed manifest ({e}); re-run the capture") from None
