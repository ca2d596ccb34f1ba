"""The ``fusee`` command: look at an engine directory and at the disk under it."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from fusee import diskcheck


def _records_json(records: list[Any]) -> list[dict[str, Any]]:
    import msgspec

    out = []
    for r in records:
        d = msgspec.structs.asdict(r)
        for k, v in d.items():
            if isinstance(v, bytes):
                try:
                    d[k] = json.loads(v) if v else None
                except ValueError:
                    d[k] = {"$bytes": v.hex()}
            elif isinstance(v, msgspec.Struct):
                d[k] = msgspec.structs.asdict(v)
        out.append({"kind": type(r).__name__, **d})
    return out


async def _inspect(directory: str, workflow_id: str | None) -> int:
    from fusee.engine.engine import Engine

    # Read-only: nothing is created or written (no segment, checkpoint or meta),
    # and no workflow code runs; runs of unknown types are listed as stuck.
    engine = await Engine.open(directory, park_after=None, read_only=True)
    try:
        if workflow_id is None:
            for s in engine.runs():
                print(f"{s.workflow_id}\t{s.workflow}\t{s.status}\trun {s.run_id}\tshard {s.shard}")
        else:
            print(json.dumps(_records_json(await engine.journal(workflow_id)), indent=2, default=str))
    finally:
        await engine.close()
    return 0


def _inspect_or_explain(directory: str, workflow_id: str | None) -> int:
    from fusee.errors import FuseeError

    try:
        return asyncio.run(_inspect(directory, workflow_id))
    except FuseeError as e:
        print(f"fusee: {e}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fusee", description="Fusee: durable execution for asyncio.")
    sub = parser.add_subparsers(dest="command", required=True)
    dc = sub.add_parser("disk-check", help="measure this disk's floor (pwrite + fdatasync latency)")
    dc.add_argument("directory", nargs="?", default=".")
    dc.add_argument("--count", type=int, default=diskcheck.DEFAULT_COUNT)
    dc.add_argument("--size", type=int, default=diskcheck.DEFAULT_RECORD_SIZE)
    ls = sub.add_parser("runs", help="list the workflows of an engine directory (reads only; not while a process writes it)")
    ls.add_argument("directory")
    sh = sub.add_parser("journal", help="print one workflow's journal as JSON")
    sh.add_argument("directory")
    sh.add_argument("workflow_id")
    args = parser.parse_args(argv)
    if args.command == "disk-check":
        return diskcheck.main([args.directory, "--count", str(args.count), "--size", str(args.size)])
    if args.command == "runs":
        return _inspect_or_explain(args.directory, None)
    return _inspect_or_explain(args.directory, args.workflow_id)


if __name__ == "__main__":
    sys.exit(main())
