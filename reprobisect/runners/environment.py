"""The environment record of a run, collected inside the user's process.

``collect_environment()`` runs in the process being recorded (the launcher calls it once
the script has imported its framework, and again when sealing). It records what the
debugging guide says to record — command, revision, Python and framework versions,
imported package paths, device, dtype, precision, execution mode — grouped so that a
diff reads well (``reprobisect.core.envdiff``):

``python``       version, implementation, executable, argv
``packages``     version + import path of every relevant package *already imported*
``torch``        CUDA/cuDNN versions, visible devices (name, capability), default dtype,
                 autocast state (cpu, cuda), compile/dynamo state, thread counts
``determinism``  deterministic algorithms (+ warn_only), cuDNN benchmark/deterministic/
                 enabled, TF32 (old flags, float32 matmul precision, new fp32_precision)
``tensorflow``   (only when imported) version, op determinism, devices (GPU name and
                 capability), build (CUDA/cuDNN), oneDNN, TF32, XLA auto-jit, grappler
                 options, thread counts, ``execution`` (run_eagerly/jit_compile/mode, from
                 the TF recorder: ``note_tf_execution``), and ``keras``: version, backend,
                 floatx, epsilon, mixed-precision policy, ``api`` (``tf.keras`` vs
                 standalone ``keras`` vs ``tf_keras``, read from the script's imports)
``keras``        the same Keras record when Keras runs without TensorFlow (JAX or torch
                 backend), with a ``note`` saying that the TF recorder records nothing then
``env_vars``     variables that change numerics (set ones only; absent = unset)
``distributed``  a distributed run (torch.distributed initialized, or ``WORLD_SIZE`` set):
                 world size, backend, rank, local rank, local world size, this rank's
                 device, the settings of collectives not in ``env_vars`` (``GLOO_*``,
                 ``TORCH_DISTRIBUTED_DEBUG``; ``NCCL_ALGO``, ``NCCL_PROTO``, ``NCCL_*`` and
                 ``TORCH_NCCL_*`` are in ``env_vars``) and, as
                 information only, the rendezvous (``MASTER_ADDR``/``MASTER_PORT``)
``probe``        where the executor placed this probe (``REPROBISECT_PROBE_*``: Ray node,
                 device type, pair placement); information, not numerics
``git``          revision + dirty flag of the repository around the cwd (null outside git)
``host``         host name, platform, machine, CPU model, CPU count
``data``         the data version: ``{"dvc": {FILE: {OUT: HASH}}}`` from every ``*.dvc`` file
                 and ``dvc.lock`` of the checkout (outputs only; ``reprobisect.vcs.dvcfiles``),
                 so a data change is an environment difference (``data.FILE``)

It is cheap (a few ms with torch imported; the git subprocesses dominate) and it never
imports a framework that is not in ``sys.modules`` already, so recording a torch script
never drags TensorFlow in. Every probe is best effort: a failing probe records
``{"error": "..."}`` under its key rather than failing the run.

What ``torch.compile`` detection can see: ``torch.compiler.is_compiling()`` (true only
while tracing), and ``torch._dynamo``'s global counters (frames compiled so far). A
compiled model that has not run yet, or one compiled in another process, reads as eager.
Under the recorder, ``torch.compile`` holds what it observed
(``runners.compile_torch.execution``): ``mode`` (eager/compiled, as the modules actually
ran), ``backend``, ``regions`` (each compiled module, how it was compiled, how it ran),
``disabled_by`` (``TORCH_COMPILE_DISABLE=1`` ...), ``unobserved`` (module names whose
activations were not recorded because they ran compiled) and a ``note`` in words.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["collect_environment", "distributed_info", "revision_of", "note_tf_execution", "keras_api_of", "PACKAGES", "NUMERICS_ENV_VARS", "NUMERICS_ENV_PREFIXES"]

PACKAGES = (
    "torch",
    "numpy",
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "tensorflow",
    "keras",
    "jax",
    "jaxlib",
    "flax",
    "transformers",
    "accelerate",
    "deepspeed",
    "timm",
    "torchvision",
    "torchaudio",
    "triton",
    "apex",
    "xformers",
    "flash_attn",
    "ml_dtypes",
    "tf_keras",
    "scipy",
    "sklearn",
    "datasets",
    "safetensors",
)
"""Packages whose version and import path are recorded when they are imported."""

NUMERICS_ENV_VARS = (
    "CUBLAS_WORKSPACE_CONFIG",
    "PYTHONHASHSEED",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "NVIDIA_TF32_OVERRIDE",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "TF_ENABLE_ONEDNN_OPTS",
    "TF_DETERMINISTIC_OPS",
    "TF_CUDNN_DETERMINISTIC",
    "TF_ENABLE_AUTO_MIXED_PRECISION",
    "TF_XLA_FLAGS",
    "TF_GPU_ALLOCATOR",
    "TF_USE_LEGACY_KERAS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
    "TF_ENABLE_CUBLAS_TENSOR_OP_MATH_FP32",
    "TF_ENABLE_CUDNN_TENSOR_OP_MATH_FP32",
    "TF_FP16_CONV_USE_FP32_COMPUTE",
    "TF_FP16_MATMUL_USE_FP32_COMPUTE",
    "TF_GPU_THREAD_MODE",
    "TF_GPU_THREAD_COUNT",
    "TF_DISABLE_MKL",
    "XLA_FLAGS",
    "KERAS_BACKEND",
    "JAX_ENABLE_X64",
    "JAX_DEFAULT_MATMUL_PRECISION",
    "ONEDNN_DEFAULT_FPMATH_MODE",
    "DNNL_DEFAULT_FPMATH_MODE",
    "ATEN_CPU_CAPABILITY",
    "PYTORCH_CUDA_ALLOC_CONF",
    "HIP_VISIBLE_DEVICES",
)
"""Environment variables recorded when set: each can change numerics or device placement."""

NUMERICS_ENV_PREFIXES = ("TORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_", "PYTORCH_", "CUDNN_", "CUBLAS", "NCCL_",
                         "TF_CUDNN_", "TF_XLA_", "TF_ENABLE_", "TF_DETERMINISTIC", "TF_GPU_", "XLA_")
"""Prefixes of further variables recorded when set (torch, inductor, cuDNN, cuBLAS, NCCL, TF/XLA knobs)."""

_NOT_NUMERICS = re.compile(r"CACHE|HOME|LOG|DEBUG|TRACE|DIR$")  # paths and logging knobs
_GIT_TIMEOUT = 2.0


def _guard(fn, *args) -> Any:
    try:
        return fn(*args)
    except Exception as e:  # a probe must never fail the run it records
        return {"error": f"{type(e).__name__}: {e}"}


def _python() -> dict[str, Any]:
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "argv": list(sys.argv),
    }


def _packages() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in PACKAGES:
        mod = sys.modules.get(name)
        if mod is None:
            continue
        version = getattr(mod, "__version__", None)
        if version is None:
            try:
                from importlib.metadata import version as _v

                version = _v(name)
            except Exception:
                version = None
        out[name] = {"version": str(version) if version is not None else None, "path": getattr(mod, "__file__", None)}
    return out


def _torch(torch) -> dict[str, Any]:
    info: dict[str, Any] = {
        "version": torch.__version__,
        "cuda": getattr(torch.version, "cuda", None),
        "hip": getattr(torch.version, "hip", None),
        "git": getattr(torch.version, "git_version", None),
        "default_dtype": str(torch.get_default_dtype()).replace("torch.", ""),
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "cpu_capability": _guard(lambda: torch.backends.cpu.get_cpu_capability()),
        "mkldnn": _guard(lambda: bool(torch.backends.mkldnn.is_available())),
    }
    info["autocast"] = _guard(_autocast, torch)
    info["compile"] = _guard(_compile_state, torch)
    info["devices"] = _guard(_cuda_devices, torch)
    info["cudnn"] = _guard(lambda: torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
    return info


def _autocast(torch) -> dict[str, Any]:
    out = {}
    for dev in ("cpu", "cuda"):
        try:
            enabled = bool(torch.is_autocast_enabled(dev))
            dtype = str(torch.get_autocast_dtype(dev)).replace("torch.", "")
        except Exception:  # older torch: per-device helpers
            if dev == "cpu":
                enabled = bool(torch.is_autocast_cpu_enabled())
                dtype = str(torch.get_autocast_cpu_dtype()).replace("torch.", "")
            else:
                enabled = bool(torch.is_autocast_enabled())
                dtype = str(torch.get_autocast_gpu_dtype()).replace("torch.", "")
        out[dev] = {"enabled": enabled, "dtype": dtype}
    return out


def _compile_state(torch) -> dict[str, Any]:
    out: dict[str, Any] = {"compiling": False, "frames_compiled": 0}
    try:
        out["compiling"] = bool(torch.compiler.is_compiling())
    except Exception:
        pass
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is not None:
        try:
            frames = dynamo.counters.get("frames", {})
            out["frames_compiled"] = int(frames.get("ok", 0))
        except Exception:
            pass
    out["mode"] = "compiled" if out["compiling"] or out["frames_compiled"] else "eager"
    watch = sys.modules.get("reprobisect.runners.compile_torch")  # the recorder's view (imported with it)
    if watch is not None:
        seen = watch.execution()
        if seen.get("mode"):  # what ran compiled, observed by the recorder's hooks
            out.update(seen)
    return out


def _cuda_devices(torch) -> list[dict[str, Any]] | dict[str, Any]:
    # is_available() and device_count() do not initialise CUDA; device properties do, so
    # they are read only once the program has initialised CUDA itself (a GPU run has, by
    # the time the launcher seals the trace). A CPU-only run on a GPU host records the count.
    if not torch.cuda.is_available():
        return []
    if not torch.cuda.is_initialized():
        return {"count": torch.cuda.device_count(), "note": "CUDA not initialised by the program; devices not queried"}
    devices = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devices.append(
            {
                "index": i,
                "name": p.name,
                "capability": f"{p.major}.{p.minor}",
                "memory_gib": round(p.total_memory / 2**30, 1),
            }
        )
    return devices


def _determinism(torch) -> dict[str, Any]:
    out: dict[str, Any] = {
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "deterministic_warn_only": bool(torch.is_deterministic_algorithms_warn_only_enabled()),
        "cudnn_enabled": bool(torch.backends.cudnn.enabled),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    # TF32: the legacy flags, and the fp32_precision settings that replace them (torch >= 2.9).
    # Reading a legacy flag after a new-style setting can warn; both are read quietly.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out["cuda_matmul_allow_tf32"] = _guard(lambda: bool(torch.backends.cuda.matmul.allow_tf32))
        out["cudnn_allow_tf32"] = _guard(lambda: bool(torch.backends.cudnn.allow_tf32))
        out["cuda_matmul_allow_fp16_reduced_precision_reduction"] = _guard(
            lambda: bool(torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction)
        )
        out["cuda_matmul_allow_bf16_reduced_precision_reduction"] = _guard(
            lambda: bool(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)
        )
        fp32: dict[str, Any] = {}
        for label, obj in (
            ("global", torch.backends),
            ("cuda.matmul", getattr(torch.backends.cuda, "matmul", None)),
            ("cudnn", torch.backends.cudnn),
            ("cudnn.conv", getattr(torch.backends.cudnn, "conv", None)),
            ("cudnn.rnn", getattr(torch.backends.cudnn, "rnn", None)),
            ("mkldnn", getattr(torch.backends, "mkldnn", None)),
            ("mkldnn.matmul", getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)),
            ("mkldnn.conv", getattr(getattr(torch.backends, "mkldnn", None), "conv", None)),
        ):
            try:
                value = getattr(obj, "fp32_precision")
            except Exception:
                continue
            fp32[label] = str(value)
        if fp32:
            out["fp32_precision"] = fp32
    return out


_TF_EXECUTION: dict[str, Any] = {}


def note_tf_execution(**fields: Any) -> None:
    """What only the TF recorder knows of how the model ran: ``run_eagerly``, ``jit_compile``,
    ``steps_per_execution``, ``mode`` (``eager`` / ``graph`` / ``xla``)... JSON values; recorded
    under ``tensorflow.execution`` by the next ``collect_environment`` (the seal's)."""
    _TF_EXECUTION.update({k: v for k, v in fields.items() if v is None or isinstance(v, (bool, int, float, str))})


def _tensorflow(tf) -> dict[str, Any]:
    out: dict[str, Any] = {"version": getattr(tf, "__version__", None)}
    cfg = tf.config
    out["git_version"] = _guard(lambda: tf.version.GIT_VERSION)
    out["op_determinism"] = _guard(_tf_op_determinism)
    # physical devices: listing them does not start the runtime (logical ones would)
    out["devices"] = _guard(lambda: [f"{d.device_type}:{d.name}" for d in cfg.list_physical_devices()])
    out["gpus"] = _guard(_tf_gpus, cfg)
    out["build"] = _guard(lambda: {k: (v if isinstance(v, (bool, int, str)) or v is None else str(v))
                                   for k, v in dict(tf.sysconfig.get_build_info()).items()})
    out["onednn_built"] = _guard(_tf_onednn)
    out["tf32"] = _guard(lambda: bool(cfg.experimental.tensor_float_32_execution_enabled()))
    out["run_functions_eagerly"] = _guard(lambda: bool(cfg.functions_run_eagerly()))
    out["xla_auto_jit"] = _guard(lambda: str(cfg.optimizer.get_jit() or "off"))
    out["grappler"] = _guard(lambda: dict(cfg.optimizer.get_experimental_options()))
    out["intra_op_threads"] = _guard(lambda: cfg.threading.get_intra_op_parallelism_threads())
    out["inter_op_threads"] = _guard(lambda: cfg.threading.get_inter_op_parallelism_threads())
    execution = _tf_execution()
    if execution:
        out["execution"] = execution
    keras = sys.modules.get("keras")
    if keras is not None:
        out["keras"] = _guard(_keras, keras)
    return out


def _tf_execution() -> dict[str, Any]:
    """``note_tf_execution``'s fields, else what the TF recorder (imported with it) noted of ``fit``."""
    if _TF_EXECUTION:
        return dict(_TF_EXECUTION)
    watch = sys.modules.get("reprobisect.runners.tensorflow")
    rec = watch.current() if watch is not None and callable(getattr(watch, "current", None)) else None
    info = getattr(rec, "info", None)
    if not isinstance(info, dict):
        return {}
    out = {k: info[k] for k in ("run_eagerly", "jit_compile") if isinstance(info.get(k), bool)}
    if out:
        out["mode"] = "eager" if out.get("run_eagerly") else ("xla" if out.get("jit_compile") else "graph")
    return out


def _tf_gpus(cfg) -> list[dict[str, Any]]:
    # details of physical GPUs (name, compute capability) do not create a context
    out = []
    for d in cfg.list_physical_devices("GPU"):
        info = cfg.experimental.get_device_details(d)
        out.append({"name": d.name, "device_name": info.get("device_name"),
                    "compute_capability": list(info["compute_capability"]) if info.get("compute_capability") else None})
    return out


def _tf_onednn() -> bool | None:
    # oneDNN (MKL) kernels built in; TF_ENABLE_ONEDNN_OPTS (in env_vars) switches them, on by default on x86 Linux
    port = sys.modules.get("tensorflow.python.util._pywrap_util_port")
    return bool(port.IsMklEnabled()) if port is not None and hasattr(port, "IsMklEnabled") else None


def _tf_op_determinism() -> bool | None:
    # not in tf.config's public namespace; the framework module has it (TF >= 2.8)
    cfg = sys.modules.get("tensorflow.python.framework.config")
    fn = getattr(cfg, "is_op_determinism_enabled", None)
    if fn is None:
        return os.environ.get("TF_DETERMINISTIC_OPS") in ("1", "true", "True") or None
    return bool(fn())


_KERAS_IMPORTS = (
    ("tf.keras", re.compile(r"^\s*(?:from\s+tensorflow(?:\.python)?\.keras\b|from\s+tensorflow\s+import\s+[^#\n]*\bkeras\b|import\s+tensorflow\.keras\b)|\btf\.keras\b", re.M)),
    ("keras", re.compile(r"^\s*(?:import\s+keras\b|from\s+keras\b)", re.M)),
    ("tf_keras", re.compile(r"^\s*(?:import\s+tf_keras\b|from\s+tf_keras\b)", re.M)),
)


def keras_api_of(source: str) -> str:
    """Which Keras the script's source names: ``tf.keras``, ``keras`` (standalone), ``tf_keras``
    (Keras 2), several joined by ``+``, or ``none``. Static: a script that reaches Keras
    through another module of its own reads as ``none``."""
    found = [name for name, pat in _KERAS_IMPORTS if pat.search(source)]
    return "+".join(found) if found else "none"


def _keras_api() -> dict[str, Any]:
    # the script: argv[0] (the launcher runs it through runpy, which restores __main__ to the
    # launcher once the script ends, when the trace is sealed), else __main__'s file
    path = sys.argv[0] if sys.argv and str(sys.argv[0]).endswith(".py") else None
    if not path or not os.path.isfile(path):
        path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path or not os.path.isfile(path):
        return {"used": "unknown", "how": "no script file (python -c, a REPL or -m without a file)"}
    with open(path, encoding="utf-8", errors="replace") as f:
        used = keras_api_of(f.read(1_000_000))
    tf_keras = "tf_keras (Keras 2)" if "tf_keras" in sys.modules else "keras (Keras 3)"
    return {"used": used, "how": "the script's imports", "tf.keras_is": tf_keras}


_OTHER_BACKEND = (
    "Keras runs on the {b} backend: the TensorFlow recorder records nothing of this run's training "
    "(no layer outputs, gradients or optimizer steps); the capture holds this environment record{extra}"
)


def _keras(keras) -> dict[str, Any]:
    out: dict[str, Any] = {"version": getattr(keras, "__version__", None)}
    backend = getattr(keras, "backend", None)
    out["backend"] = _guard(lambda: backend.backend()) if backend is not None else None
    out["floatx"] = _guard(lambda: backend.floatx()) if backend is not None else None
    out["epsilon"] = _guard(lambda: backend.epsilon()) if backend is not None else None
    policy = _guard(lambda: keras.mixed_precision.global_policy().name)
    out["mixed_precision_policy"] = policy
    out["api"] = _guard(_keras_api)
    if out["backend"] not in ("tensorflow", None) and isinstance(out["backend"], str):
        extra = " (and what the torch recorder sees if the script steps a torch.optim optimizer)" if out["backend"] == "torch" else ""
        out["note"] = _OTHER_BACKEND.format(b=out["backend"], extra=extra)
    return out


def _env_vars() -> dict[str, str]:
    out = {k: os.environ[k] for k in NUMERICS_ENV_VARS if k in os.environ}
    for k, v in os.environ.items():
        if k.startswith(NUMERICS_ENV_PREFIXES) and not _NOT_NUMERICS.search(k):
            out.setdefault(k, v)
    return dict(sorted(out.items()))


_DIST_VAR_PREFIXES = ("GLOO_", "TORCH_DISTRIBUTED_DEBUG")
"""Variables of collectives kept under ``distributed.env`` (``NCCL_*`` and ``TORCH_NCCL_*``
are under ``env_vars`` already, through ``NUMERICS_ENV_PREFIXES``)."""
_RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def _int_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def distributed_info() -> dict[str, Any] | None:
    """The distributed side of this process, or None for a single-process run: world size,
    backend, rank, local rank and device (from ``torch.distributed`` when it is initialized,
    else from torchrun's variables), the variables that change collectives' numerics or
    order, and the rendezvous (information: a free port differs every run)."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    initialized = bool(dist is not None and _guard(lambda: dist.is_available() and dist.is_initialized()) is True)
    world = _int_env("WORLD_SIZE")
    if not initialized and (world is None or world <= 1):
        return None
    info: dict[str, Any] = {"world_size": world, "backend": None, "rank": _int_env("RANK"),
                            "local_rank": _int_env("LOCAL_RANK"), "local_world_size": _int_env("LOCAL_WORLD_SIZE"),
                            "device": None}
    if initialized:
        info["world_size"] = _guard(dist.get_world_size)
        info["rank"] = _guard(dist.get_rank)
        info["backend"] = _guard(lambda: str(dist.get_backend()))
        info["device"] = _guard(_rank_device, torch, info["backend"])
    info["env"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith(_DIST_VAR_PREFIXES)}
    info["rendezvous"] = {k: os.environ[k] for k in _RENDEZVOUS_VARS if k in os.environ}
    return info


def _rank_device(torch, backend: Any) -> str:
    """The device this rank's collectives run on: the current accelerator for NCCL-like
    backends, else the CPU."""
    if isinstance(backend, str) and "nccl" in backend and torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def _probe_vars() -> dict[str, str]:
    """Where the executor placed this probe (``REPROBISECT_PROBE_*``: Ray node, device, pairing)."""
    prefix = "REPROBISECT_PROBE_"
    return {k[len(prefix):].lower(): v for k, v in sorted(os.environ.items()) if k.startswith(prefix)}


def _run_git(args: list[str], cwd: str) -> str | None:
    try:
        r = subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def _git(cwd: str) -> dict[str, Any] | None:
    root = _run_git(["rev-parse", "--show-toplevel"], cwd)
    if root is None:
        return None
    commit = _run_git(["rev-parse", "--verify", "-q", "HEAD"], cwd)
    status = _run_git(["status", "--porcelain", "--untracked-files=no"], cwd)
    branch = _run_git(["symbolic-ref", "-q", "--short", "HEAD"], cwd)
    return {
        "root": root,
        "commit": commit or None,
        "branch": branch or None,
        "dirty": None if status is None else bool(status),
    }


def revision_of(script: str | os.PathLike | None = None) -> dict[str, Any] | None:
    """The manifest's ``revision``: the git commit (and dirty flag) of the repository that
    holds ``script`` (the command's script; None or a non-file: the cwd).

    ``{"commit", "dirty", "branch", "root"}`` (``commit`` None in a repository without
    commits); ``dirty`` is true when tracked files differ from the commit or the script
    itself is not tracked. None outside a git checkout. Never raises.
    """
    try:
        where = os.getcwd()
        path = None
        if script:
            p = Path(script)
            if p.is_file():
                path = p.resolve()
                where = str(path.parent)
        g = _git(where)
        if g is None:
            return None
        dirty = g.get("dirty")
        if path is not None and g.get("commit") and _run_git(["ls-files", "--error-unmatch", "--", path.name], where) is None:
            dirty = True  # an untracked script: the commit alone does not reproduce the run
        return {"commit": g.get("commit"), "dirty": dirty, "branch": g.get("branch"), "root": g.get("root")}
    except Exception:
        return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _host() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "system": platform.system(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }


def _dvc_root(cwd: str) -> str | None:
    from reprobisect.vcs.dvcfiles import project_root

    found = project_root(cwd)
    return str(found) if found else None


def _data(root: str | None) -> dict[str, Any] | None:
    """The data version of the checkout: what its DVC files declare (``reprobisect.vcs.dvcfiles``,
    read as YAML; DVC is never imported). ``root``: the git root, else the DVC project around the cwd."""
    from reprobisect.vcs.dvcfiles import data_version

    if root is None:
        return None
    return data_version(root)


def collect_environment(extra: dict | None = None) -> dict[str, Any]:
    """Everything about this process that can change numerics, grouped for a readable diff.

    ``extra`` is merged in last (top-level keys), for what only the caller knows (the
    device and dtype a runner chose, the capture policy). Never imports a framework.
    """
    cwd = os.getcwd()
    env: dict[str, Any] = {
        "python": _python(),
        "packages": _packages(),
        "env_vars": _env_vars(),
        "probe": _probe_vars(),
    }
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "backends"):
        env["torch"] = _guard(_torch, torch)
        env["determinism"] = _guard(_determinism, torch)
    tf = sys.modules.get("tensorflow")
    if tf is not None and hasattr(tf, "config"):
        env["tensorflow"] = _guard(_tensorflow, tf)
    elif sys.modules.get("keras") is not None:  # Keras on JAX/torch: no TF, the backend says what is recorded
        env["keras"] = _guard(_keras, sys.modules["keras"])
    dist = _guard(distributed_info)
    if dist is not None:
        env["distributed"] = dist
    env["git"] = _guard(_git, cwd)
    root = env["git"].get("root") if isinstance(env["git"], dict) else None
    env["data"] = _guard(lambda: _data(root or _dvc_root(cwd)))  # outside git: only inside a DVC project
    env["host"] = _host()
    env["cwd"] = cwd
    if extra:
        env.update(extra)
    return env
