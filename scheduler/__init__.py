"""The scheduler's domain logic (no sockets): admission, batching, preemption, the steps in flight, the ledger."""
