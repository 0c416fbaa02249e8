"""The search: which engine starts to run next. Rounds planned and replayed from the records
(`rounds`), the N schedules measured deployed (`schedules`), what a sweep spends (`budget`),
acceptance-based prediction across a drafter's series (`predict`), and simulated sweeps through
the real planner for the benches and tests (`simulate`).

Imports `specflow.decision` and below; nothing with side effects.
"""
