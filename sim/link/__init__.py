"""The link emulator (bandwidth, delay, jitter, loss, cuts in user space), its self-check, and network scenarios."""
