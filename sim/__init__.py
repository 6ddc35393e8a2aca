"""Drives edge and cloud together: the in-process decoder, the link emulator, scenarios, reports, the CLI."""
