"""The spec and its compilation.

`schema` (the pydantic models of `conf/`), `errors` (every problem at once, with its dotted
field path), `methods` (what each drafting method needs, in one table), `compile` (spec ->
engine configs with their `--speculative-config` and `vllm serve` argv) and `memory` (the
headroom model: weights, KV bytes per token, capacity with and without the drafter).

Imports no other specflow package; no orchestration, tracking, engine, processes or plotting.
"""
