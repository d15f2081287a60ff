"""``sfcdc publish TOPIC [FILE]``: publish platform events written as JSON lines.

::

    sfcdc publish /event/Order_Shipped__e events.jsonl [--conf conf/] [--created-by 005...]

A line without ``CreatedById`` gets ``--created-by``, else the logged-in user's Id (Salesforce
stores the publishing user's own Id whatever is sent); one without ``CreatedDate``, now.
    producer | sfcdc publish /event/Order_Shipped__e -      # from stdin

Each non-blank line is one event, a JSON object of the topic's fields. Every line is checked
against the topic's current schema first (:mod:`ingest.client.event_json`); a line that does
not fit is reported with its number and the field at fault, and then nothing is published
unless ``--skip-invalid`` says to publish the others. The events go over one PublishStream in
batches, each with a correlation key (its event id), and events the server refuses are sent
again up to ``--retries`` times. Every event's outcome is printed on its own line (its replay
id, or the error); the exit status is 0 when every line was published, 1 when some were not,
2 when invalid lines stopped the command.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TextIO

from ingest.client import SchemaCache
from ingest.client.event_json import FieldProblem, record_from_json
from ingest.client.publisher import Publisher, PublishOutcome
from ingest.errors import ConfigError
from pipelines.commands.conf_options import add_conf_options, conf_from_args, secrets_from_args
from pipelines.connect import connect
from pipelines.spec.models import parse_topic

__all__ = ["read_events", "register", "run"]


def register(subparsers: Any) -> None:
    """Add the ``publish`` subcommand."""
    parser = subparsers.add_parser(
        "publish",
        help="publish platform events from JSON lines (a file or stdin)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("topic", help="platform event topic, e.g. /event/Order_Shipped__e")
    parser.add_argument(
        "file",
        nargs="?",
        default="-",
        help="JSON lines file, one event per line ('-' or nothing: stdin)",
    )
    parser.add_argument(
        "--created-by",
        metavar="USER_ID",
        help="CreatedById for events that leave it out (default: the logged-in user's Id; "
        "Salesforce requires the field and stores its own value)",
    )
    parser.add_argument(
        "--skip-invalid",
        action="store_true",
        help="publish the valid lines even when others are invalid (those are reported)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=2,
        metavar="N",
        help="re-sends of an event the server refused (2)",
    )
    parser.add_argument(
        "--ordered",
        action="store_true",
        help="keep the events in file order on the bus (one round trip per batch)",
    )
    add_conf_options(parser)
    parser.set_defaults(handler=run)


@contextmanager
def _opened(name: str) -> Iterator[IO[str]]:
    if name == "-":
        yield sys.stdin
        return
    path = Path(name)
    if not path.is_file():
        raise ConfigError(f"sfcdc publish: no such file {name!r}")
    with path.open(encoding="utf-8") as handle:
        yield handle


def read_events(lines: Iterable[str]) -> Iterator[tuple[int, object | FieldProblem]]:
    """``(line number, parsed JSON value)`` for each non-blank line, or ``(line number,
    problem)`` when it is not JSON."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except ValueError as exc:
            yield number, FieldProblem(None, f"not JSON: {exc}")


def run(args: argparse.Namespace) -> int:
    """Publish the events the parsed arguments name."""
    info = parse_topic(args.topic)
    if info.kind != "platform_event":
        raise ConfigError(
            f"sfcdc publish: {args.topic} is a change event topic; only platform event topics "
            "(/event/<Name>__e) accept published events"
        )
    if args.retries < 0:
        raise ConfigError(f"sfcdc publish: --retries must be >= 0 (got {args.retries})")
    conf = conf_from_args(args)
    with _opened(args.file) as handle:
        lines = list(read_events(handle))
    if not lines:
        print(f"sfcdc publish: no events in {args.file}", file=sys.stderr)
        return 2
    with connect(conf.pipeline.connection, secrets=secrets_from_args(args)) as source:
        schemas = SchemaCache(source.channel, tokens=source.tokens)
        schema = schemas.current_schema(args.topic)
        now_ms = int(time.time() * 1000)
        # Salesforce replaces CreatedById with the publishing user's own Id anyway.
        created_by = args.created_by or source.tokens.current().user_id
        valid: list[tuple[int, dict[str, Any]]] = []
        invalid = 0
        for number, value in lines:
            if isinstance(value, FieldProblem):
                problems = [value]
            else:
                record, problems = record_from_json(
                    schema, value, now_ms=now_ms, created_by=created_by
                )
            if problems:
                invalid += 1
                for problem in problems:
                    print(f"line {number}: invalid: {problem}", file=sys.stderr)
            else:
                valid.append((number, record))
        if invalid and not args.skip_invalid:
            print(
                f"sfcdc publish: nothing published: {invalid} of {len(lines)} events are invalid "
                "(fix them, or publish the others with --skip-invalid)",
                file=sys.stderr,
            )
            return 2
        outcomes: list[PublishOutcome] = []
        if valid:
            publisher = Publisher(
                source.channel,
                schemas,
                max_retries=args.retries,
                tokens=source.tokens,
            )
            outcomes = publisher.publish_stream(
                args.topic, [record for _, record in valid], ordered=args.ordered
            )
    failed = _report(valid, outcomes, sys.stdout)
    published = len(valid) - failed
    print(
        f"sfcdc publish: {published} of {len(lines)} events published to {args.topic} "
        f"(schema {schema.schema_id}); {failed} failed, {invalid} invalid"
    )
    return 0 if failed == 0 and invalid == 0 else 1


def _report(
    valid: list[tuple[int, dict[str, Any]]], outcomes: list[PublishOutcome], out: TextIO
) -> int:
    failed = 0
    for (number, _), outcome in zip(valid, outcomes, strict=True):
        if outcome.ok and outcome.replay_id is not None:
            print(
                f"line {number}: published, replay id {outcome.replay_id.base64()} "
                f"(event {outcome.event_id})",
                file=out,
            )
        else:
            failed += 1
            tries = f"after {outcome.attempts} attempts" if outcome.attempts else "not sent"
            print(f"line {number}: failed ({tries}): {outcome.error}", file=out)
    return failed
