"""Subcommands of ``sfcdc``; each module exposes ``register(subparsers)``."""
