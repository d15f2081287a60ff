"""``sfcdc onboard``: print the ``conf/objects`` file of a new object, from its event schema.

::

    sfcdc onboard /data/CaseChangeEvent [--channel /data/ChangeEvents] [--conf conf/]

Asks the source ``conf/pipeline.yml`` connects to for the topic's current schema (GetTopic, then
GetSchema) and prints the object file, to commit under ``conf/objects/``. Nothing in the lake
or in ``conf/`` changes (the bundle's ``sfcdc_onboard`` job runs it; a Databricks workspace's
files are replaced by the next deploy, so the file belongs in the repository).
"""

from __future__ import annotations

import argparse
from typing import Any

from pipelines.commands.conf_options import add_conf_options, conf_from_args, secrets_from_args
from pipelines.onboard import fetch_schema, object_file_name, object_yaml

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    """Add the ``onboard`` subcommand."""
    parser = subparsers.add_parser(
        "onboard",
        help="print the conf/objects file of a new object, from its event schema",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("topic", help="the object's topic, e.g. /data/CaseChangeEvent")
    parser.add_argument(
        "--channel", default=None, help="a channel shared with other objects to put it on"
    )
    add_conf_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the object file of ``args.topic``."""
    conf = conf_from_args(args)
    schema = fetch_schema(conf.pipeline.connection, args.topic, secrets=secrets_from_args(args))
    print(f"conf/objects/{object_file_name(schema)}:\n")
    print(object_yaml(schema, topic=args.channel or None))
    return 0
