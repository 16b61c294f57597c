"""``python -m helpers.lab.bench NAME [options]``: run one benchmark (see ``helpers.lab.bench``)."""

import importlib
import sys

from helpers.floats import flush_denormals

BENCHMARKS = {"rollout": "helpers.lab.bench.rollout", "grpo": "helpers.lab.bench.grpo"}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    usage = f"usage: python -m helpers.lab.bench {{{','.join(BENCHMARKS)}}} [options]   (--help after the name for its options)"
    if argv[:1] in (["-h"], ["--help"]):  # asked for: the usage, and success
        print(usage)
        return
    if not argv or argv[0] not in BENCHMARKS:
        raise SystemExit(usage)
    flush_denormals()  # as the training commands do, before torch starts its threads (helpers.floats)
    importlib.import_module(BENCHMARKS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    main()
