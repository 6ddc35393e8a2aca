"""The client device: drafters, the decode loop, the gRPC verifier connection, typed reports, and the
``splitspec-edge`` command. Never imports torch, ``cloud`` or ``sim``: a device installs only the ``edge`` extra.
"""
