"""Run ``python -m django ...`` as if some libraries were not installed (no uninstalling): a
meta-path finder refuses to import them, as an environment without the extra would.

    python -m pgmsg_tests.scripts.without pyspark,matplotlib pgmsg_export --help
"""

from __future__ import annotations

import runpy
import sys


class Without:
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def main() -> None:
    sys.meta_path.insert(0, Without(set(sys.argv[1].split(","))))
    sys.argv = ["django", *sys.argv[2:]]
    runpy.run_module("django", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
