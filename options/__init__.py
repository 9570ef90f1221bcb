"""``houchu serve``'s configuration tree: one struct per consumer, named like the flags.

Each struct here is what one part of the engine takes, and each of its fields is the
``houchu serve`` flag of the same name (``--page-size`` sets ``page_size``); the flag
table is ``houchu.options.flags``, the argument parser built from it
``houchu.options.parser``. The root, ``houchu.options.serve_config.ServeConfig``, holds one of
each (plus what the launcher fills in) and travels to every actor process as JSON.

======================================  =====================================  =========
struct                                  consumer                               attribute
======================================  =====================================  =========
``runner.RunnerOptions``                ``houchu.runner.model_runner.ModelRunner``      runner
``batching.BatchingOptions``            the scheduler (``SchedulerCore``)      batching
``speculation.SpeculativeOptions``      the scheduler's ``SpecScheduler``,     speculation
                                        the draft actor
``kv_tiers.KVTierOptions``              the KV-tier actor, the launcher        kv_tiers
``gateway.GatewayOptions``              the gateway (HTTP, WebSocket, limits)  gateway
``telemetry.TelemetryOptions``          the recorder, every actor's telemetry  telemetry
``supervision.SupervisionOptions``      the launcher's ``Supervisor``          supervision
``placement.PlacementOptions``          ``houchu.actors.placement``            placement
======================================  =====================================  =========

Nothing here imports torch, so the gateway and tokenizer processes can read the tree.
"""
