"""Streaming API fixtures: an emulator with sub-second long polls on a fake clock."""

from tests.streaming_helpers import bayeux, clock, emu

__all__ = ["bayeux", "clock", "emu"]
