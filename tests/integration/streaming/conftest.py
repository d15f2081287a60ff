"""Streaming API fixtures: an emulator with sub-second long polls on a fake clock, and one
with TLS on the real clock for the pipeline tests."""

from tests.integration.streaming.lake import tls_emulator
from tests.streaming_helpers import bayeux, clock, emu

__all__ = ["bayeux", "clock", "emu", "tls_emulator"]
