"""The vLLM side: server process, launcher, fork server, the vLLM check, devices, load
generation, /metrics counters and the runner."""
