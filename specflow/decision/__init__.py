"""The decision: windows -> per-point statistics (`aggregate`) -> gates (`gates`: output
agreement and latency SLOs) -> verdicts per candidate and band, the pick and the deployment per
traffic class (`choose`), over concurrency bands and their N schedules (`bands`); the records it
returns (`model`), a raced band's state (`race`) and the per-request analysis (`requests`).

Imports `specflow.stats`, `specflow.records` and `specflow.spec`; nothing with side effects.
"""
