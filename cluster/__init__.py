"""Data parallel on one machine: engine replicas behind SGLang's Model Gateway (``smg``).

``houchu serve --data-parallel-size N`` runs N whole engines (``plan``: each with its
share of the cores or its own GPU, on its own port), ``smg`` in front of them on
``--port`` (``router``), restarts what dies (``launcher``) and serves a dashboard of the
replicas (``status``).
"""
