"""The measured process: `python datakit/commands/bench_decoders/worker.py`, one job per process.

Why a process per measurement: CPU time and peak RSS are per process, so only a fresh process
gives them for one backend alone; a decoder that crashes (decord2 and torchcodec bundle
different FFmpeg builds and can segfault when both are loaded) takes down only its own
measurement; and a worker sweep needs real processes anyway.

Protocol (stdin/stdout, one JSON line each way): the parent writes the job; the worker imports
its backend, warms up and prints `READY`; the parent answers `GO` once every worker of the job
is ready (so concurrent workers start timing together); the worker prints `RESULT {...}`.
A line `{"probe": "<backend>"}` instead asks only for the backend's version.
"""
from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path
from typing import Any, Callable


def _light_package() -> None:
    """Import datakit's submodules without running `datakit/__init__.py`, which pulls in the
    shard reader and with it torch (~1 s and ~250 MB): that would be charged to every backend.
    Same for `datakit/synth/__init__.py` (pyarrow, for its dataset writers): only the barcode
    reader of `datakit.synth.video` is needed here."""
    root = Path(__file__).resolve().parents[2]  # datakit/ (this file: datakit/commands/bench_decoders/)
    for name, folder in (("datakit", root), ("datakit.synth", root / "synth")):  # synth's pulls pyarrow
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = [str(folder)]
            sys.modules[name] = pkg

# In a one-backend process the others are kept out: decord's backend otherwise loads
# torchcodec (and with it torch, ~300 MB) first, which would be charged to decord's RSS.
_KEEP_OUT = {"decord": ("torchcodec",), "torchcodec": ("decord",), "torchcodec-cuda": ("decord",),
             "pyav": ("decord", "torchcodec")}


def _block(modules) -> None:
    for m in modules:
        sys.modules[m] = None  # type: ignore[assignment]  # makes `import m` raise ImportError


def resolve(backend: str, threads: int = 1, seek_mode: str = "exact") -> tuple[Callable[[Path], Any], str]:
    """The opener and version string of a backend name (or a "package.module:opener" of your own,
    called as opener(path, threads=, seek_mode=)). Raises BackendUnavailable when it cannot load."""
    from datakit.decoders import BackendUnavailable, backend_module

    if ":" in backend:
        mod_name, attr = backend.split(":", 1)
        try:
            mod = importlib.import_module(mod_name)
            fn = getattr(mod, attr)
        except (ImportError, AttributeError) as e:
            raise BackendUnavailable(f"{backend}: {e}") from None
        return (lambda p: fn(p, threads=threads, seek_mode=seek_mode)), str(getattr(mod, "__version__", "custom"))
    mod = backend_module("torchcodec" if backend == "torchcodec-cuda" else backend)
    try:
        version = mod.version()
    except Exception as e:  # the backend module imports lazily: a missing library shows up here
        raise BackendUnavailable(f"{backend} is not usable ({type(e).__name__}: {e})") from None
    if backend == "torchcodec-cuda":
        import torch

        if not torch.cuda.is_available():
            raise BackendUnavailable("torchcodec-cuda: no CUDA device visible to torch")
        return (lambda p: mod.TorchCodecDecoder(Path(p), threads, seek_mode, device="cuda")), version
    return (lambda p: mod.open_video(p, threads=threads, seek_mode=seek_mode)), version


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _error(e: BaseException) -> dict:
    from datakit.decoders import BackendUnavailable

    if isinstance(e, BackendUnavailable):
        return {"error": f"unavailable: {e}"}
    return {"error": f"{type(e).__name__}: {e}"}


def main() -> int:
    request = json.loads(sys.stdin.readline())
    if "probe" in request:
        _block(_KEEP_OUT.get(request["probe"], ()))
        try:
            _say("RESULT " + json.dumps({"version": resolve(request["probe"])[1]}))
        except Exception as e:
            _say("RESULT " + json.dumps(_error(e)))
        return 0
    from datakit.commands.bench_decoders.measure import Job, measure

    job = Job.from_json(request)
    _block(_KEEP_OUT.get(job.backend, ()) + job.block_modules)

    def ready() -> None:
        _say("READY")
        if sys.stdin.readline().strip() != "GO":
            raise SystemExit(3)

    try:
        open_fn, version = resolve(job.backend, job.setting.threads, job.setting.seek_mode)
        result = measure(job, open_fn, ready)
        result["version"] = version
    except SystemExit:
        raise
    except Exception as e:
        result = _error(e)
    _say("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    _light_package()
    sys.exit(main())
