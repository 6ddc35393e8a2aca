"""The client device: drafters, the decode loop, the gRPC edge client. Never imports torch or ``cloud``."""
