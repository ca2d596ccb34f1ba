"""The ``fusee`` command's commands (click): list, inspect and act on runs.

Every command that reads runs takes a target: a directory (read offline and
read-only: nothing is created, locked or written, and a directory a live
process has open is read too) or ``--url http://...`` (a running application's
HTTP API, with ``--token``). Commands that change runs need ``--url``. Errors
are one line on stderr and exit code 1 (2 for a usage mistake).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, NoReturn

import click

from fusee import errors
from fusee.cli import progress
from fusee.engine.bulk import ACTIONS as BULK_ACTIONS
from fusee.engine.bulk import MAX_BULK
from fusee.engine.query_grammar import split_order
from fusee.engine.visibility import STATUSES
from fusee.storage.partsfile import MAX_PARTS

#: Environment variables that stand for --url and --token.
URL_ENV = "FUSEE_URL"
TOKEN_ENV = "FUSEE_TOKEN"


class Failure(Exception):
    """A command failed: its message is printed as one line, exit code 1."""


def _fail(message: str) -> NoReturn:
    raise Failure(message)


# --- targets ---------------------------------------------------------------------

_url = click.option("--url", envvar=URL_ENV, metavar="URL",
                    help=f"A running application's HTTP API, e.g. http://127.0.0.1:8233 (or ${URL_ENV}).")
_token = click.option("--token", envvar=TOKEN_ENV, metavar="TOKEN",
                      help=f"The API's bearer token (or ${TOKEN_ENV}).")
_json = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def _is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def _target(args: tuple[str, ...], url: str | None, token: str | None, names: tuple[str, ...]) -> tuple[Any, list[str]]:
    """The target (from ``--url`` or a leading DIR/URL argument) and the remaining arguments,
    which must be exactly ``names``."""
    from fusee.cli.targets import Api, Directory

    rest = list(args)
    where: str | None = None
    ctx = click.get_current_context(silent=True)
    if (url is not None and len(rest) == len(names) + 1 and ctx is not None
            and ctx.get_parameter_source("url") == click.core.ParameterSource.ENVIRONMENT):
        url = None  # a target on the command line wins over $FUSEE_URL
    if url is None and len(rest) == len(names) + 1:
        where = rest.pop(0)
    elif url is None:
        then = f", then {' '.join(n.upper() for n in names)}" if names else ""
        _fail(f"give a directory to read (offline) or --url http://HOST:PORT of a running application{then}")
    if len(rest) != len(names):
        _fail(f"expected {' '.join(n.upper() for n in names) or 'no more arguments'}, got {' '.join(rest) or 'nothing'}")
    if url is not None:
        return Api(url, token), rest
    assert where is not None
    if _is_url(where):
        return Api(where, token), rest
    began = time.perf_counter()
    with progress.task(f"opening {where}"):
        target = Directory(where)
    if progress.enabled():
        runs, records = target.opened()
        progress.done(f"read {where}: {runs:,} runs, {records:,} log records after the checkpoint", began)
    if target.live:
        click.echo(f"note: {where} is open in a live process; this shows what its log held when read "
                   "(read-only: nothing was locked or written)", err=True)
    return target, rest


#: The commands that change runs: they need --url.
ACTIONS = ("start", "signal", "query", "cancel", "terminate", "resume", "reset", "fork", "complete", "bulk")
#: The subcommands that change schedules and limits: they need --url too.
GROUP_ACTIONS = {("schedules", op) for op in ("pause", "unpause", "trigger", "backfill", "delete")} | {
    ("limits", "set")}


def _read_only(command: str) -> str:
    what = "a schedule" if command.startswith("schedules") else "a limit" if command.startswith("limits") else "a run"
    return (f"'{command}' changes {what}: point it at the running application with --url http://HOST:PORT "
            f"(or ${URL_ENV}); a directory is only read, offline")


def _api(url: str | None, token: str | None, command: str) -> Any:
    from fusee.cli.targets import Api

    if url is None:
        raise errors.ReadOnlyTarget(_read_only(command))
    return Api(url, token)


def _value(text: str | None, what: str) -> Any:
    """A command-line JSON value; text that is not JSON is taken as a string."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


# --- the commands ------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fusee", prog_name="fusee")
@click.option("--progress/--no-progress", "show_progress", default=None,
              help="Progress of long operations (opening a directory, listing, export, import) on stderr, "
                   "with counts at the end. Default: when stderr is a terminal.")
def cli(show_progress: bool | None) -> None:
    """Fusee: durable execution for asyncio. List, inspect and operate runs.

    Read commands take a directory (read offline, read-only) or --url of a
    running application's HTTP API (served by 'fusee serve' or fusee.http.app).
    """
    progress.wanted = show_progress


def _filters(fn: Any) -> Any:
    """The options that select runs, shared by runs, count and bulk."""
    for option in reversed([
        click.option("--where", help="A query: status = 'paused' and attrs.customer = 'acme', maybe ending "
                                      "with order by started_at desc (see docs/api.md)."),
        click.option("--status", "statuses", multiple=True, type=click.Choice(STATUSES, case_sensitive=False),
                     help="Only runs with this status (repeatable)."),
        click.option("--workflow", "workflows", multiple=True, help="Only runs of this workflow type (repeatable)."),
        click.option("--attr", "attrs", multiple=True, metavar="KEY=VALUE", help="Only runs with this attribute."),
        click.option("--since", metavar="DURATION", callback=_check_since,
                     help="Only runs started in the last DURATION (15m, 1h, 2d): started_at > now() - DURATION."),
    ]):
        fn = option(fn)
    return fn


def _check_since(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from fusee import durations

    if value is None:
        return None
    try:
        durations.parse(value)
    except errors.InvalidDuration:
        raise click.BadParameter(f"{value!r} is not a duration such as 15m, 1h or 2d") from None
    return value.replace(" ", "")


@cli.command()
@click.argument("target", required=False)
@_url
@_token
@_filters
@click.option("--newest", is_flag=True, help="Newest first (the last seen first).")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True, help="Runs per page.")
@click.option("--cursor", help="Continue after the page that printed this cursor.")
@click.option("--all", "every", is_flag=True, help="Follow the cursors: every matching run.")
@_json
def runs(target: str | None, url: str | None, token: str | None, where: str | None,
         statuses: tuple[str, ...], workflows: tuple[str, ...], attrs: tuple[str, ...], since: str | None,
         newest: bool, limit: int, cursor: str | None, every: bool, as_json: bool) -> None:
    """List runs, oldest first (--newest: newest first), a page at a time."""
    from fusee.cli import render

    query = _where(where, statuses, workflows, attrs, since)
    order = "newest" if newest else "oldest"
    t, _ = _target((target,) if target else (), url, token, ())
    try:
        began = time.perf_counter()
        total = sum(t.counts(query).values()) if every and progress.enabled() else None
        with progress.task("listing runs", total) as advance:
            page = t.list(query, limit, cursor, order)
            items = list(page["items"])
            advance(len(page["items"]))
            while every and page["cursor"]:
                page = t.list(query, limit, page["cursor"], order)
                items.extend(page["items"])
                advance(len(page["items"]))
        progress.done(f"listed {len(items):,} runs", began)
    finally:
        t.close()
    if as_json:
        render.print_json({"items": items, "cursor": page["cursor"]})
        return
    out = render.console()
    out.print(render.runs_table(items))
    if page["cursor"]:
        out.print(f"more: --cursor {page['cursor']}")


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _where(where: str | None, statuses: tuple[str, ...], workflows: tuple[str, ...],
           attrs: tuple[str, ...], since: str | None = None) -> str | None:
    """The filters as one where query (``--where`` alone is passed as written: the positions
    its errors name are the user's)."""
    if where and not (statuses or workflows or attrs or since):
        return where
    where, order_by = split_order(where) if where else ("", "")
    parts = [f"({where})"] if where else []
    if statuses:
        parts.append(f"status in ({', '.join(_quote(s.lower()) for s in statuses)})")
    if since:
        parts.append(f"started_at > now() - {since}")
    if workflows:
        parts.append(f"workflow in ({', '.join(_quote(w) for w in workflows)})")
    for a in attrs:
        key, sep, value = a.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {a!r}", param_hint="--attr")
        literal = value if _is_number(value) or value in ("true", "false", "null") else _quote(value)
        parts.append(f"attrs.{key} = {literal}")
    return " ".join(filter(None, [" and ".join(parts), order_by])) or None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@cli.command()
@click.argument("target", required=False)
@_url
@_token
@_filters
@_json
def count(target: str | None, url: str | None, token: str | None, where: str | None,
          statuses: tuple[str, ...], workflows: tuple[str, ...], attrs: tuple[str, ...], since: str | None,
          as_json: bool) -> None:
    """How many runs match the filters, by status."""
    from fusee.cli import render

    query = _where(where, statuses, workflows, attrs, since)
    t, _ = _target((target,) if target else (), url, token, ())
    try:
        counts = t.counts(query)
    finally:
        t.close()
    if as_json:
        render.print_json({"where": query, "counts": counts})
        return
    from rich.table import Table

    table = Table(show_header=True, box=None)
    table.add_column("status")
    table.add_column("runs", justify="right")
    for status, n in counts.items():
        if n:
            table.add_row(status, str(n))
    table.add_row("total", str(sum(counts.values())))
    render.console().print(table)


@cli.command()
@click.argument("args", nargs=-1, metavar="[DIR] WORKFLOW_ID")
@_url
@_token
@_json
def show(args: tuple[str, ...], url: str | None, token: str | None, as_json: bool) -> None:
    """A run's summary and its journal as a timeline (steps, attempts, errors, signals, who asked)."""
    from fusee.cli import render

    t, (wid,) = _target(args, url, token, ("workflow_id",))
    try:
        summary = t.describe(wid)
        journal = t.journal(wid)
    finally:
        t.close()
    if as_json:
        render.print_json({"summary": summary, **journal})
        return
    out = render.console()
    out.print(render.summary_table(summary))
    out.print()
    out.print(render.timeline_table(journal["timeline"]))


@cli.command()
@click.argument("args", nargs=-1, metavar="[DIR] WORKFLOW_ID")
@_url
@_token
def journal(args: tuple[str, ...], url: str | None, token: str | None) -> None:
    """A run's durable journal as JSON (ISO times, decoded payloads)."""
    from fusee.cli import render

    t, (wid,) = _target(args, url, token, ("workflow_id",))
    try:
        records = t.journal(wid)["records"]
    finally:
        t.close()
    render.print_json(records)


@cli.command()
@click.argument("target", required=False)
@_url
@_token
@_json
def metrics(target: str | None, url: str | None, token: str | None, as_json: bool) -> None:
    """Runs by status per shard, step, flush and queue figures."""
    from fusee.cli import render

    t, _ = _target((target,) if target else (), url, token, ())
    try:
        m = t.metrics()
    finally:
        t.close()
    if as_json:
        render.print_json(m)
    else:
        render.console().print(render.metrics_table(m))


# --- acting (--url) -------------------------------------------------------------------


def _done(answer: Any, message: str, as_json: bool) -> None:
    from fusee.cli import render

    if as_json:
        render.print_json(answer)
    else:
        click.echo(message)


@cli.command()
@click.argument("workflow")
@click.argument("workflow_id")
@click.argument("input", required=False)
@_url
@_token
@click.option("--if-running", type=click.Choice(["fail", "attach", "terminate"]), default="fail")
@click.option("--if-finished", type=click.Choice(["fail", "attach", "start"]), default="fail")
@_json
def start(workflow: str, workflow_id: str, input: str | None, url: str | None, token: str | None,
          if_running: str, if_finished: str, as_json: bool) -> None:
    """Start WORKFLOW as WORKFLOW_ID with INPUT (JSON; other text is a string)."""
    api = _api(url, token, "start")
    try:
        answer = api.request("POST", "/api/runs", {
            "workflow": workflow, "workflow_id": workflow_id, "input": _value(input, "input"),
            "if_running": if_running, "if_finished": if_finished})
    finally:
        api.close()
    _done(answer, f"started {answer['workflow_id']} (run {answer['run_id']})", as_json)


@cli.command()
@click.argument("workflow_id")
@click.argument("name")
@click.argument("value", required=False)
@_url
@_token
@click.option("--by", help="Who sends it (journaled for the audit).")
@click.option("--dedup-key", help="A signal with a key the run received already is dropped.")
@_json
def signal(workflow_id: str, name: str, value: str | None, url: str | None, token: str | None,
           by: str | None, dedup_key: str | None, as_json: bool) -> None:
    """Send signal NAME with VALUE (JSON; other text is a string) to WORKFLOW_ID."""
    api = _api(url, token, "signal")
    try:
        answer = api.act(workflow_id, "signal", {"name": name, "value": _value(value, "value"), "by": by,
                                                 "dedup_key": dedup_key})
    finally:
        api.close()
    _done(answer, f"signal {name} delivered to {workflow_id}", as_json)


@cli.command()
@click.argument("workflow_id")
@click.argument("name")
@click.argument("arg", required=False)
@_url
@_token
def query(workflow_id: str, name: str, arg: str | None, url: str | None, token: str | None) -> None:
    """Ask WORKFLOW_ID the query NAME (with ARG as JSON); prints the answer as JSON."""
    from fusee.cli import render

    api = _api(url, token, "query")
    try:
        answer = api.act(workflow_id, "query", {"name": name, "arg": _value(arg, "arg")})
    finally:
        api.close()
    render.print_json(answer["result"])


@cli.command()
@click.argument("workflow_id")
@_url
@_token
@click.option("--reason", default="", help="Why (journaled).")
@click.option("--by", help="Who asks (journaled for the audit).")
@_json
def cancel(workflow_id: str, url: str | None, token: str | None, reason: str, by: str | None,
           as_json: bool) -> None:
    """Request cancellation of WORKFLOW_ID (its code may compensate)."""
    api = _api(url, token, "cancel")
    try:
        answer = api.act(workflow_id, "cancel", {"reason": reason, "by": by})
    finally:
        api.close()
    _done(answer, f"cancellation of {workflow_id} requested", as_json)


@cli.command()
@click.argument("workflow_id")
@_url
@_token
@click.option("--reason", default="", help="Why (journaled).")
@click.option("--by", help="Who asks (journaled for the audit).")
@_json
def terminate(workflow_id: str, url: str | None, token: str | None, reason: str, by: str | None,
              as_json: bool) -> None:
    """End WORKFLOW_ID at once, running no more of its code."""
    api = _api(url, token, "terminate")
    try:
        answer = api.act(workflow_id, "terminate", {"reason": reason, "by": by})
    finally:
        api.close()
    _done(answer, f"{workflow_id} terminated", as_json)


@cli.command()
@click.argument("workflow_id")
@_url
@_token
@click.option("--by", help="Who asks (journaled for the audit).")
@_json
def resume(workflow_id: str, url: str | None, token: str | None, by: str | None, as_json: bool) -> None:
    """Resume WORKFLOW_ID's paused steps (their retries ran out) with a fresh retry budget."""
    api = _api(url, token, "resume")
    try:
        answer = api.act(workflow_id, "resume", {"by": by})
    finally:
        api.close()
    _done(answer, f"{workflow_id}: paused steps resumed", as_json)


@cli.command()
@click.argument("workflow_id")
@_url
@_token
@click.option("--before-step", help="Cut before the first step of this name.")
@click.option("--before-position", type=click.IntRange(0), help="Cut before this journal position.")
@click.option("--reapply-signals/--drop-signals", default=True, show_default=True,
              help="Deliver again the signals that arrived after the cut.")
@click.option("--version", type=int, help="Move the run to this registered version of its workflow.")
@click.option("--by", help="Who asks (journaled for the audit).")
@_json
def reset(workflow_id: str, url: str | None, token: str | None, before_step: str | None,
          before_position: int | None, reapply_signals: bool, version: int | None, by: str | None,
          as_json: bool) -> None:
    """Start WORKFLOW_ID anew from its journal before a step (or a position)."""
    if before_step is None and before_position is None:
        raise click.UsageError("give --before-step NAME or --before-position N")
    api = _api(url, token, "reset")
    try:
        answer = api.act(workflow_id, "reset", {
            "before_step": before_step, "before_position": before_position,
            "reapply_signals": reapply_signals, "version": version, "by": by})
    finally:
        api.close()
    _done(answer, f"{workflow_id} reset: run {answer['run_id']}", as_json)


@cli.command()
@click.argument("workflow_id")
@click.argument("new_id")
@_url
@_token
@click.option("--before-step", help="Cut before the first step of this name.")
@click.option("--before-position", type=click.IntRange(0), help="Cut before this journal position.")
@click.option("--reapply-signals/--drop-signals", default=True, show_default=True,
              help="Deliver again the signals that arrived after the cut.")
@click.option("--version", type=int, help="Run the copy on this registered version of the workflow.")
@click.option("--by", help="Who asks (journaled for the audit).")
@_json
def fork(workflow_id: str, new_id: str, url: str | None, token: str | None, before_step: str | None,
         before_position: int | None, reapply_signals: bool, version: int | None, by: str | None,
         as_json: bool) -> None:
    """Start NEW_ID from WORKFLOW_ID's journal before a step (or a position), leaving WORKFLOW_ID alone."""
    if before_step is None and before_position is None:
        raise click.UsageError("give --before-step NAME or --before-position N")
    api = _api(url, token, "fork")
    try:
        answer = api.act(workflow_id, "fork", {
            "new_id": new_id, "before_step": before_step, "before_position": before_position,
            "reapply_signals": reapply_signals, "version": version, "by": by})
    finally:
        api.close()
    _done(answer, f"{answer['workflow_id']} forked from {workflow_id}: run {answer['run_id']}", as_json)


@cli.command()
@click.argument("token_", metavar="TOKEN")
@click.argument("value", required=False)
@_url
@_token
@click.option("--fail", "fail_message", metavar="MESSAGE", help="Fail the await with this message instead.")
@click.option("--by", help="Who completes it (journaled for the audit).")
@_json
def complete(token_: str, value: str | None, url: str | None, token: str | None, fail_message: str | None,
             by: str | None, as_json: bool) -> None:
    """Complete the ctx.await_completion that handed out TOKEN with VALUE (JSON; other text is a string)."""
    api = _api(url, token, "complete")
    body: dict[str, Any] = {"token": token_, "value": _value(value, "value"), "by": by}
    if fail_message is not None:
        body.update(failed=True, message=fail_message)
    try:
        answer = api.request("POST", "/api/completions", body)
    finally:
        api.close()
    if not answer["completed"] and not as_json:
        _fail("not completed: the operation was completed already, the token is stale, or the run ended")
    _done(answer, "completed", as_json)


@cli.command()
@click.argument("action", type=click.Choice(BULK_ACTIONS))
@_url
@_token
@_filters
@click.option("--dry-run", is_flag=True, help="Only count the runs it would act on.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--limit", type=click.IntRange(1, MAX_BULK), default=MAX_BULK, show_default=True,
              help="Runs acted on by this request (the server's bound); the rest are reported as remaining.")
@click.option("--by", help="Who asks (journaled for the audit).")
@click.option("--reason", help="cancel, terminate: why (journaled).")
@click.option("--signal", "signal_name", metavar="NAME", help="signal: the signal's name.")
@click.option("--value", help="signal: its value (JSON; other text is a string).")
@click.option("--before-step", help="reset: cut before the first step of this name.")
@click.option("--before-position", type=click.IntRange(0), help="reset: cut before this journal position.")
@click.option("--reapply-signals/--drop-signals", default=None,
              help="reset: deliver again the signals that arrived after the cut (default: yes).")
@_json
def bulk(action: str, url: str | None, token: str | None, where: str | None, statuses: tuple[str, ...],
         workflows: tuple[str, ...], attrs: tuple[str, ...], since: str | None, dry_run: bool, yes: bool,
         limit: int, by: str | None, reason: str | None, signal_name: str | None, value: str | None,
         before_step: str | None, before_position: int | None, reapply_signals: bool | None,
         as_json: bool) -> None:
    """ACTION (cancel, terminate, resume, signal, reset) every run the filters match (--url).

    Counts them first (a dry run) and asks before acting, unless --yes."""
    query = _where(where, statuses, workflows, attrs, since)
    if not query:
        raise click.UsageError("name the runs: give --where, --status, --workflow, --attr or --since")
    body: dict[str, Any] = {"where": query, "limit": limit, "by": by, "reason": reason, "signal": signal_name,
                            "value": _value(value, "value"), "before_step": before_step,
                            "before_position": before_position, "reapply_signals": reapply_signals}
    body = {k: v for k, v in body.items() if v is not None}
    api = _api(url, token, f"bulk {action}")
    try:
        dry = api.request("POST", f"/api/bulk/{action}", {**body, "dry_run": True})
        if dry_run:
            _done(dry, f"{action} would apply to {dry['matched']} run(s) matching {query}"
                  + (f" ({limit} per request)" if dry["matched"] > limit else ""), as_json)
            return
        if dry["matched"] == 0:
            _done(dry, f"no run matching {query} to {action}", as_json)
            return
        if not yes:
            shown = ", ".join(dry["workflow_ids"][:5]) + (", ..." if dry["matched"] > 5 else "")
            if not click.confirm(f"{action} {min(dry['matched'], limit)} run(s) matching {query} ({shown})?",
                                 err=True):
                _fail(f"bulk {action} not confirmed: nothing was changed")
        answer = api.request("POST", f"/api/bulk/{action}", body)
    finally:
        api.close()
    message = f"{action}: done for {len(answer['done'])} run(s)"
    if answer["failed"]:
        message += f", refused by {len(answer['failed'])}: " + "; ".join(
            f"{wid}: {why}" for wid, why in list(answer["failed"].items())[:5])
    if answer["remaining"]:
        message += f"; {answer['remaining']} more match: run it again"
    _done(answer, message, as_json)
    if answer["failed"] and not as_json:
        sys.exit(1)


# --- journal files ------------------------------------------------------------------------


@cli.command("export")
@click.argument("args", nargs=-1, metavar="[DIR] WORKFLOW_ID FILE")
@_url
@_token
def export_(args: tuple[str, ...], url: str | None, token: str | None) -> None:
    """Write WORKFLOW_ID's durable journal to FILE (.fjnl), for fusee.testing.replay or 'fusee import'."""
    from fusee import journal_file

    t, (wid, path) = _target(args, url, token, ("workflow_id", "file"))
    began = time.perf_counter()
    try:
        with progress.task(f"exporting {wid}"):
            data = t.export(wid)
    finally:
        t.close()
    with progress.task(f"writing {path}"):
        records = journal_file.loads(data, path)
        journal_file.write(path, records)
    progress.done(f"exported {len(records):,} records ({len(data):,} bytes)", began)
    click.echo(f"{len(records)} records of {wid} written to {path}")


@cli.command("import")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--replay", "replay", metavar="MODULE:ATTR",
              help="Replay the journal against these workflows (a list of @fusee.workflow functions): "
                   "exit 1 if the code no longer does what it recorded.")
@click.option("--options", "options", metavar="MODULE:ATTR",
              help="With --replay: the engine options to replay with, a dict of Engine.open keyword "
                   "options (fusee.testing.EngineOptions: limits=, codec=...).")
@click.option("--into", "into", metavar="DIR", type=click.Path(file_okay=False),
              help="Load the journal into the engine directory DIR as a new run that replays it and "
                   "continues (Engine.import_journal) when the directory's engine runs; needs --workflows.")
@click.option("--workflows", "workflows_ref", metavar="MODULE:ATTR",
              help="With --into: the workflows to open DIR with (a list of @fusee.workflow functions).")
@click.option("--workflow-id", "workflow_id", default=None, help="With --into: the new run's workflow ID "
              "(default: the journal's).")
@click.option("--before-step", "before_step", default=None, metavar="STEP",
              help="With --into: cut the journal before the first step named STEP (it runs again).")
@_json
def import_(path: str, replay: str | None, options: str | None, into: str | None, workflows_ref: str | None,
            workflow_id: str | None, before_step: str | None, as_json: bool) -> None:
    """Read a .fjnl journal file: show its timeline, check new code against it (--replay), or load
    it into an engine directory as a run that continues (--into DIR --workflows M:A)."""
    from fusee import journal_file, views
    from fusee.cli import render

    began = time.perf_counter()
    with progress.task(f"reading {path}"):
        records = journal_file.read(path)
    progress.done(f"read {len(records):,} records of {path}", began)
    if options is not None and replay is None and into is None:
        raise click.UsageError("--options applies to --replay or --into: give the workflows too")
    if into is None and (workflows_ref is not None or workflow_id is not None or before_step is not None):
        raise click.UsageError("--workflows, --workflow-id and --before-step apply to --into DIR")
    if into is not None:
        if replay is not None:
            raise click.UsageError("give --replay or --into, not both")
        if workflows_ref is None:
            raise click.UsageError("--into needs --workflows MODULE:ATTR: the code the run continues with")
        _import_into(path, into, workflows_ref, options, workflow_id, before_step, as_json)
        return
    if replay is not None:
        import asyncio

        from fusee.http.serve import load_factory
        from fusee.testing import replay as replay_journal

        workflows = load_factory(replay)
        if not isinstance(workflows, list | tuple):
            workflows = [workflows]
        engine_options = load_factory(options) if options is not None else {}
        if not isinstance(engine_options, dict):
            raise click.UsageError(f"--options {options} must name a dict of Engine.open options, "
                                   f"not a {type(engine_options).__name__}")
        with progress.task(f"replaying {len(records):,} records"):
            asyncio.run(replay_journal(records, workflows, **engine_options))
        click.echo(f"{path}: the code replays its {len(records)} records")
        return
    timeline = views.timeline(records)
    if as_json:
        render.print_json({"records": views.journal(records), "timeline": timeline})
    else:
        render.console().print(render.timeline_table(timeline))


def _import_into(path: str, into: str, workflows_ref: str, options: str | None, workflow_id: str | None,
                 before_step: str | None, as_json: bool) -> None:
    import asyncio

    import fusee
    from fusee.http.serve import load_factory

    workflows = load_factory(workflows_ref)
    if not isinstance(workflows, list | tuple):
        workflows = [workflows]
    engine_options = load_factory(options) if options is not None else {}
    if not isinstance(engine_options, dict):
        raise click.UsageError(f"--options {options} must name a dict of Engine.open options")

    async def load() -> tuple[str, int]:
        async with fusee.Engine.open(into, workflows=list(workflows), **engine_options) as engine:
            handle = await engine.import_journal(path, workflow_id, before_step)
            return handle.workflow_id, handle.run_id

    began = time.perf_counter()
    try:
        with progress.task(f"importing {path} into {into}"):
            wid, run_id = asyncio.run(load())
    except (fusee.FuseeError, ValueError) as e:
        _fail(f"{path} not imported: {e}")
    progress.done(f"imported {path} into {into}", began)
    _done({"workflow_id": wid, "run_id": run_id, "directory": into}, f"imported {path} into {into} as "
          f"workflow {wid} (run {run_id}); it continues when the directory's engine runs", as_json)


# --- the rest ---------------------------------------------------------------------------


_endpoint = click.option("--endpoint-url", envvar="AWS_ENDPOINT_URL", metavar="URL",
                         help="An S3-compatible server for s3:// targets (or $AWS_ENDPOINT_URL).")


def _s3_options(target: str, endpoint_url: str | None) -> dict[str, Any]:
    return {"endpoint_url": endpoint_url} if target.startswith("s3://") and endpoint_url else {}


def _when(text: str) -> float:
    """A restore time: ISO 8601 (without a zone: UTC) or Unix seconds."""
    import datetime

    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        _fail(f"--at {text!r} is not a time: give ISO 8601 (2026-12-02T08:15:00Z) or Unix seconds")
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


@cli.command()
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False))
@click.argument("target")
@_endpoint
def backup(directory: str, target: str, endpoint_url: str | None) -> None:
    """Take one backup point of DIR (closed, or open in a running process: read-only, nothing
    is locked) into TARGET (a directory or s3://bucket/prefix). Incremental."""
    from fusee.backup import backup_once

    point = backup_once(directory, target, **_s3_options(target, endpoint_url))
    click.echo(f"backed up {directory} to {target}: position {point.position}, "
               f"{point.time.isoformat()}")


@cli.command()
@click.argument("target")
@click.argument("directory", metavar="DIR", required=False, type=click.Path(file_okay=False))
@click.option("--at", "at", metavar="TIME", help="The newest point at or before TIME (ISO 8601 or Unix seconds).")
@click.option("--position", type=click.IntRange(0), help="Cut the log after the batch at this position.")
@click.option("--list", "listing", is_flag=True, help="List the target's points instead (no DIR).")
@_endpoint
def restore(target: str, directory: str | None, at: str | None, position: int | None, listing: bool,
            endpoint_url: str | None) -> None:
    """Rebuild DIR (new or empty) from the backup in TARGET: its newest point, the newest at or
    before --at, or cut at --position. DIR then opens like any engine directory."""
    import fusee.backup as fb

    options = _s3_options(target, endpoint_url)
    if listing:
        for p in fb.points(target, **options):
            click.echo(f"{p.time.isoformat()}  position {p.position}")
        return
    if directory is None:
        raise click.UsageError("give the directory to restore into: fusee restore TARGET DIR")
    if at is not None and position is not None:
        raise click.UsageError("give --at or --position, not both")
    done = fb.restore(target, directory, at=_when(at) if at is not None else None, position=position,
                      **options)
    click.echo(f"restored {done.directory} from {target}: position {done.position}, point of "
               f"{done.time.isoformat()}")


@cli.command("disk-check")
@click.argument("directory", default=".", type=click.Path(file_okay=False))
@click.option("--count", type=click.IntRange(1), default=None, help="How many synced writes to time.")
@click.option("--size", type=click.IntRange(1), default=None, help="Bytes per write.")
def disk_check(directory: str, count: int | None, size: int | None) -> None:
    """Measure this disk's floor (pwrite + fdatasync latency) in DIRECTORY."""
    from fusee import diskcheck

    argv = [directory]
    if count is not None:
        argv += ["--count", str(count)]
    if size is not None:
        argv += ["--size", str(size)]
    code = diskcheck.main(argv)
    if code:
        sys.exit(code)


@cli.command()
@click.argument("factory", metavar="MODULE:FACTORY")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8233, show_default=True)
@_token
@click.option("--tokens-file", envvar="FUSEE_TOKENS_FILE", metavar="FILE",
              help="A TOML file with a [tokens] table (name = \"token\"): each person signs in with their "
                   "own token and the audit names them (or $FUSEE_TOKENS_FILE; chmod 600).")
@click.option("--secret-file", envvar="FUSEE_SECRET_FILE", metavar="FILE",
              help="A file holding the key that signs the web UI's form tokens (16 bytes or more), the same for "
                   "every worker: pages stay usable across workers and restarts (or $FUSEE_SECRET_FILE).")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="Answer requests whose Host is NAME too (repeatable; '*.example.com' for a domain, '*' for "
                   "any). Loopback names and --host are always answered; others get 400.")
@click.option("--max-body", type=click.IntRange(1), default=None, metavar="BYTES",
              help="The largest request body taken (413 beyond)  [default: 16 MiB]")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
def serve(factory: str, host: str, port: int, token: str | None, tokens_file: str | None,
          secret_file: str | None, allowed_hosts: tuple[str, ...], max_body: int | None, log_level: str) -> None:
    """Open the engine that MODULE:FACTORY returns (an Engine, or an awaitable of one) and serve
    its HTTP API (and web UI) until interrupted. Refuses a non-loopback host without --token or
    --tokens-file."""
    import asyncio
    import ipaddress

    from fusee.http.auth import check_tokens
    from fusee.http.guard import DEFAULT_MAX_BODY
    from fusee.http.serve import check_bind, load_factory, read_secret, read_tokens, served_hosts
    from fusee.http.serve import serve as run

    try:
        tokens = check_tokens(token, read_tokens(tokens_file), None) if tokens_file else None
        secret = read_secret(secret_file) if secret_file else None
    except ValueError as e:
        _fail(str(e))
    check_bind(host, token, tokens)
    names = served_hosts(host, allowed_hosts)
    try:
        wildcard = ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        wildcard = False
    if wildcard and not allowed_hosts:
        click.echo(f"fusee serve: listening on {host}, answering only requests whose Host is one of "
                   f"{', '.join(names)}: give the names clients use with --allowed-host NAME", err=True)
    target = load_factory(factory)
    asyncio.run(run(target, host=host, port=port, token=token, tokens=tokens, secret=secret, log_level=log_level,
                    allowed_hosts=allowed_hosts,
                    max_body=DEFAULT_MAX_BODY if max_body is None else max_body))


@cli.command()
@click.argument("factory", metavar="MODULE:FACTORY")
@click.option("-n", "--workers", "count", type=click.IntRange(1), default=os.cpu_count() or 1,
              show_default="the number of CPUs", help="How many worker processes.")
@click.option("--parts", type=click.IntRange(1, MAX_PARTS), default=None,
              help="The part count of a directory or namespace the workers create (one that exists keeps "
                   "its own). Default: $FUSEE_PARTS if set, else the worker count.")
def workers(factory: str, count: int, parts: int | None) -> None:
    """Run COUNT processes that each open the engine MODULE:FACTORY returns and hold it open,
    each running a share of the parts: throughput from every core. A directory the workers create
    gets parts (--parts); restarts a worker that dies; SIGTERM or Ctrl-C closes them all gracefully."""
    from fusee.cli.workers import supervise

    code = supervise(factory, count, parts)
    if code:
        sys.exit(code)


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                               "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def sim(args: tuple[str, ...]) -> None:
    """Run the deterministic simulator (the arguments of 'python -m fusee.sim'; try --help)."""
    from fusee.sim.__main__ import main as sim_main

    code = sim_main(list(args))
    if code:
        sys.exit(code)


# --- schedules and step limits ------------------------------------------------------


class _ListByDefault(click.Group):
    """A group whose bare use (``fusee schedules [DIR] [--json]``) is its ``list`` command."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("-h", "--help")):
            args = ["list", *args]
        return super().parse_args(ctx, args)


@cli.group(cls=_ListByDefault)
def schedules() -> None:
    """List schedules (a directory offline, or --url), or pause, unpause, trigger, backfill or
    delete one (--url)."""


@schedules.command("list")
@click.argument("target", required=False)
@_url
@_token
@_json
def schedules_list(target: str | None, url: str | None, token: str | None, as_json: bool) -> None:
    """List schedules. Offline (a directory) shows what the log holds: each schedule's spec and the
    runs it started; its pause flag, next time and skip counts need --url (shown as ?)."""
    from fusee.cli import render
    from fusee.cli.targets import Directory

    t, _ = _target((target,) if target else (), url, token, ())
    try:
        items = t.schedules()
    finally:
        t.close()
    if as_json:
        render.print_json({"schedules": items})
        return
    render.console().print(render.schedules_table(items))
    if isinstance(t, Directory) and items:
        click.echo("note: read offline: paused, next time and skipped counts are known to the running "
                   "engine only (ask it with --url)", err=True)


def _schedule_action(op: str, help: str) -> None:
    @schedules.command(op, help=help)
    @click.argument("schedule_id")
    @_url
    @_token
    @_json
    def act(schedule_id: str, url: str | None, token: str | None, as_json: bool) -> None:
        api = _api(url, token, f"schedules {op}")
        try:
            answer = api.request("POST", f"/api/schedules/{_quote_id(schedule_id)}/{op}", {})
        finally:
            api.close()
        _done(answer, f"schedule {schedule_id}: {op} done" + (
            f" (paused: {'yes' if answer['paused'] else 'no'})" if op in ("pause", "unpause") else ""), as_json)


_schedule_action("pause", "Stop SCHEDULE_ID starting runs (running ones go on).")
_schedule_action("unpause", "Start runs again from the next scheduled time.")
_schedule_action("trigger", "Start a run of SCHEDULE_ID now, under its overlap policy.")
_schedule_action("delete", "End SCHEDULE_ID (its runs go on); the ID may be scheduled again.")


@schedules.command("backfill")
@click.argument("schedule_id")
@click.argument("start")
@click.argument("end")
@_url
@_token
@_json
def schedules_backfill(schedule_id: str, start: str, end: str, url: str | None, token: str | None,
                       as_json: bool) -> None:
    """Run SCHEDULE_ID's times in [START, END) (ISO 8601 with a timezone, e.g. 2026-01-01T00:00:00Z);
    a time that fired already is not run again."""
    api = _api(url, token, "schedules backfill")
    try:
        answer = api.request("POST", f"/api/schedules/{_quote_id(schedule_id)}/backfill",
                             {"start": start, "end": end})
    finally:
        api.close()
    _done(answer, f"schedule {schedule_id}: backfill of {start} to {end} requested", as_json)


def _quote_id(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


@cli.group(cls=_ListByDefault)
def limits() -> None:
    """List step limits or resize one (--url only: limits live in the running engine's memory)."""


@limits.command("list")
@click.argument("target", required=False)
@_url
@_token
@_json
def limits_list(target: str | None, url: str | None, token: str | None, as_json: bool) -> None:
    """Each limit's bounds, permits in use and steps waiting (--url: the running engine holds them)."""
    from fusee.cli import render

    if url is None and target is not None and not _is_url(target):
        _fail("limits live in the memory of the running engine (the application declares them when it "
              "opens it), not in its directory: ask the application with --url http://HOST:PORT")
    if url is None and target is not None:
        url, target = target, None
    if url is None:
        _fail("give --url http://HOST:PORT of the running application (limits are not in the directory)")
    api = _api(url, token, "limits")
    try:
        items = api.limits()
    finally:
        api.close()
    if as_json:
        render.print_json({"limits": items})
    else:
        render.console().print(render.limits_table(items))


@limits.command("set")
@click.argument("name")
@click.option("--concurrency", type=click.IntRange(1), help="Executions running at once.")
@click.option("--per-second", type=click.FloatRange(0, min_open=True), help="Permits handed out per second.")
@_url
@_token
@_json
def limits_set(name: str, concurrency: int | None, per_second: float | None, url: str | None,
               token: str | None, as_json: bool) -> None:
    """Resize limit NAME now (not durable: the application's next Engine.open sets its own)."""
    if concurrency is None and per_second is None:
        _fail("give --concurrency N, --per-second X or both")
    body: dict[str, Any] = {}
    if concurrency is not None:
        body["concurrency"] = concurrency
    if per_second is not None:
        body["per_second"] = per_second
    api = _api(url, token, "limits set")
    try:
        answer = api.request("POST", f"/api/limits/{_quote_id(name)}", body)
    finally:
        api.close()
    _done(answer, f"limit {name}: concurrency {answer['concurrency']}, per second {answer['per_second']}",
          as_json)


# --- entry point -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Runs the command; returns the exit code. Errors are one line on stderr, never a traceback
    (set FUSEE_DEBUG=1 to see one)."""
    args = list(sys.argv[1:] if argv is None else argv)
    action = args[0] if args and args[0] in ACTIONS else None
    if len(args) > 1 and (args[0], args[1]) in GROUP_ACTIONS:
        action = f"{args[0]} {args[1]}"
    if (action is not None and not os.environ.get(URL_ENV)
            and not any(a == "--url" or a.startswith("--url=") for a in args)
            and any(os.path.isdir(a) for a in args[1:])):
        # 'fusee cancel ./data order-1': say why, rather than "unexpected extra argument".
        click.echo(f"fusee: {_read_only(action)}", err=True)
        return 1
    try:
        cli.main(args=args, prog_name="fusee", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("fusee: interrupted", err=True)
        return 130
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        click.echo("fusee: interrupted", err=True)
        return 130
    except BaseException as e:
        if os.environ.get("FUSEE_DEBUG"):
            raise
        click.echo(f"fusee: {_one_line(e)}", err=True)
        return 1
    return 0


def _one_line(e: BaseException) -> str:
    if isinstance(e, Failure | errors.FuseeError | ValueError | TypeError):
        text = str(e)  # our messages, and the engine's typed errors: written for the user
    elif isinstance(e, FileNotFoundError | PermissionError | IsADirectoryError | NotADirectoryError):
        text = f"{e.strerror}: {e.filename}"
    elif isinstance(e, OSError):
        text = f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
    elif isinstance(e, ModuleNotFoundError):
        text = (f"no module named {e.name!r}: run the command from the directory that holds it, or add that "
                "directory to PYTHONPATH")
    elif isinstance(e, ImportError):
        text = f"cannot import: {e}"
    else:
        text = f"{type(e).__name__}: {e} (set FUSEE_DEBUG=1 to see where)"
    return " ".join(text.split()) or type(e).__name__
