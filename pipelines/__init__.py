"""Prefect flows that sequence specflow's steps (the logic lives in `specflow.steps`)."""
