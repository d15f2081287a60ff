"""Streaming API fixtures: an emulator with sub-second long polls on a fake clock, and one
with TLS on the real clock for the pipeline tests. Both check, when the test ends, that it
left no CometD session open (see :func:`tests.cometd_helpers.assert_sessions_closed`)."""

from tests.cometd_helpers import bayeux, clock, emu
from tests.integration.cometd.lake import tls_emulator

__all__ = ["bayeux", "clock", "emu", "tls_emulator"]
