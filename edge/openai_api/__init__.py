"""The OpenAI-compatible API of ``splitspec-edge serve``, as FastAPI routers over ``EdgeService``.

``edge.openai_server.create_app`` assembles them: ``health`` (``/health``, ``/metrics``),
``models``, ``chat`` and ``completions`` (under ``/v1``, behind ``auth``); ``schemas`` holds the
request bodies, ``errors`` the OpenAI-shaped errors, ``state`` what the routes share.
"""
