"""The verifier service: target engine, torch verification, sessions, gRPC servicer. Never imports ``edge``."""
