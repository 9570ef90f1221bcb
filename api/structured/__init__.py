"""Structured output at the gateway: a request's output grammar from its fields, checked before it is accepted (JSON Schema rewrites, Lark rules, the grammar guard)."""
