"""Time LeRobot 0.4.4's v2.1 -> v3.0 converter on a local dataset, imports excluded.

Run with the LeRobot venv's python (``bench/bench_corpus.py`` does):

    /tmp/lerobot-v3-venv/bin/python bench/lerobot_convert_driver.py ORACLE_DIR ROOT REPO_ID

``ROOT/REPO_ID`` is a copy of the v2.1 source; LeRobot converts it in place (its ``_v30`` sibling
becomes the dataset, the source moves to ``_old``). Offline (``HF_HUB_OFFLINE=1``), with the
oracle's torchvision CPU shim imported first. Prints one JSON line: the wall and CPU seconds of
the ``convert_dataset`` call alone (CPU includes any child processes), and LeRobot's version.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import time


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> int:
    oracle_dir, root, repo_id = sys.argv[1:4]
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    sys.path.insert(0, oracle_dir)
    import _tv_cpu_shim  # noqa: F401  (PyPI torchvision's CUDA _C.so cannot load beside CPU torch)

    logging.disable(logging.WARNING)
    import lerobot
    from lerobot.datasets.v30.convert_dataset_v21_to_v30 import convert_dataset

    # The converter prints progress on stdout; keep stdout for the one JSON line.
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    cpu = _cpu_seconds()
    start = time.perf_counter()
    convert_dataset(repo_id=repo_id, root=root, push_to_hub=False)
    wall = time.perf_counter() - start
    cpu = _cpu_seconds() - cpu
    sys.stdout = real_stdout
    version = getattr(lerobot, "__version__", "?")
    print(json.dumps({"seconds": wall, "cpu_seconds": cpu, "lerobot": version}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
