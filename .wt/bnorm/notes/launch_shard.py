"""pytest plugin for helper launch's GPU call: SHARD=i/n keeps every n-th collected
test starting at i (round robin, so slow families spread over the shards), after a
stable sort that puts the files named in SHARD_FIRST (comma-separated, in order)
first, so a shard cut by a time limit has run those.
    SHARD=0/6 SHARD_FIRST=test_fast_path,test_softmax PYTHONPATH=$PWD:$PWD/notes \
        python -m pytest -p launch_shard ..."""
import os


def pytest_collection_modifyitems(config, items):
    spec = os.environ.get("SHARD")
    if not spec:
        return
    first = [f for f in os.environ.get("SHARD_FIRST", "").split(",") if f]

    def rank(item):
        name = os.path.basename(str(item.fspath)).removesuffix(".py")
        return first.index(name) if name in first else len(first)

    ordered = sorted(items, key=rank)
    index, count = (int(v) for v in spec.split("/"))
    keep = [item for k, item in enumerate(ordered) if k % count == index]
    drop = [item for k, item in enumerate(ordered) if k % count != index]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep
