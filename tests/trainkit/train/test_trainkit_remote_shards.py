"""trainkit run with `data.shards=s3://...` (docs/multi-node.md: shards on object storage, a
node-local cache shared by the node's ranks): 2 gloo ranks train from a moto S3 server (real
HTTP through s3fs) and give the losses, step for step, of the same run on the local folder
the bucket was uploaded from; the shards land whole in `data.cache_dir`.

Oracle: the run on the local copy. Skips cleanly without moto/s3fs (the storage fixtures)."""
import pytest

from trainkit_harness import run_distributed, tiny_config

pytest.importorskip("s3fs")


@pytest.mark.timeout(240)
def test_training_from_s3_gives_the_losses_of_the_local_copy(converted, uploaded, tmp_path):
    common = ("train.steps=3", "output.log_every=1", "optim.schedule=constant")
    cache = tmp_path / "node-cache"
    local = tiny_config(converted, tmp_path / "local", *common)
    remote = tiny_config(uploaded, tmp_path / "remote", *common, f"data.cache_dir={cache}")
    got = run_distributed([local, remote], world=2)
    assert not [r["error"] for r in got if "error" in r], got
    assert sorted(got[0]["losses"]) == [0, 1, 2]
    assert got[1]["losses"] == got[0]["losses"]
    cached = sorted(p.name for p in cache.rglob("shard-*.tar"))
    assert cached and set(cached) <= {p.name for p in converted.glob("shard-*.tar")}


def test_an_unreachable_shard_url_is_one_line(bucket, capsys):
    from trainkit.cli import main
    from trainkit_harness import TINY

    code = main(["run", str(TINY), "--set", f"data.shards={bucket}/nothing-here", "--set", "output.dir=unused"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"{bucket}/nothing-here" in err and "not a finished" in err, err
