"""The steps of a sweep (prepare, measure one engine config, sync, decide), callable without Prefect."""
