"""The trace format: records, writer, validating reader, fingerprints."""

from reprobisect.trace.fingerprint import fingerprint, fingerprint_and_stats, stats
from reprobisect.trace.format import FORMAT, KINDS, VERSION, Manifest, Record, Step
from reprobisect.trace.reader import Trace, read_trace, verify_trace
from reprobisect.trace.writer import TraceWriter

__all__ = [
    "FORMAT",
    "KINDS",
    "VERSION",
    "Manifest",
    "Record",
    "Step",
    "Trace",
    "TraceWriter",
    "fingerprint",
    "fingerprint_and_stats",
    "read_trace",
    "record_array",
    "stats",
    "verify_trace",
]


def record_array(name: str, kind: str, array, **fields) -> Record:
    """Build a ``Record`` for a NumPy array (fingerprint + stats computed here)."""
    import numpy as np

    a = np.asarray(array)
    fp, st = fingerprint_and_stats(a)
    from reprobisect.trace.fingerprint import dtype_name

    return Record(name=name, kind=kind, dtype=dtype_name(a.dtype), shape=tuple(a.shape), fingerprint=fp, stats=st, **fields)
