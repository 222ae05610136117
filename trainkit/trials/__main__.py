"""The trial child, `python -m trainkit.trials CONFIG --set ...` (started by run.py's run_trial):
`trainkit run` that writes `trial-error-rank{R}.json` into output.dir before it exits on an error.
First thing, it asks to die with its parent (signals.die_with_parent): under torchrun each rank
is this module, so every rank dies with torchrun, and torchrun with the caller."""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from trainkit.errors import USER_ERRORS
from trainkit.trials.run import ERROR_FILE, error_kind
from trainkit.trials.signals import TRIAL_OWNER_ENV, die_with_parent


def _record(out_dir: str, e: BaseException) -> None:
    rank = int(os.environ.get("RANK", 0))
    first = next((x for x in str(e).splitlines() if x.strip()), "")
    rec = {"rank": rank, "kind": error_kind(e), "type": type(e).__name__, "message": first[:500] or type(e).__name__}
    path = Path(out_dir) / ERROR_FILE.format(rank=rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec) + "\n")


def child(argv: list[str]) -> int:
    """`trainkit run CONFIG --set ...` that records its error in output.dir before it exits."""
    import argparse

    from trainkit.config import load_config

    p = argparse.ArgumentParser(prog="python -m trainkit.trials")
    p.add_argument("config")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args(argv)
    # run_trial always sets output.dir last; started by hand without one, errors are not recorded
    out_dir = next((s.partition("=")[2] for s in reversed(args.overrides) if s.startswith("output.dir=")), None)
    try:
        from trainkit.train import run
        run(load_config(args.config, args.overrides))
        return 0
    except BaseException as e:  # noqa: BLE001 - recorded, then reported as `trainkit run` would
        if out_dir:
            _record(out_dir, e)
        if isinstance(e, USER_ERRORS):
            print(f"trainkit: {e}", file=sys.stderr)
            return 2
        traceback.print_exc()
        return 1
    finally:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    die_with_parent(int(os.environ[TRIAL_OWNER_ENV]) if TRIAL_OWNER_ENV in os.environ else None)
    sys.exit(child(sys.argv[1:]))
