"""The pure core: schema, errors, per-method table, records, compile, memory, analysis, promote.

Imports none of prefect, mlflow, vllm, subprocess, matplotlib, torch (an import-linter contract)."""
