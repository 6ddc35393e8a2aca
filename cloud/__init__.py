"""The verifier service: target engine, torch verification, sessions, limits, the gRPC servicer and server,
and the ``splitspec-cloud`` command. Never imports ``edge`` or ``sim``.
"""
