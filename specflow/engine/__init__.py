"""The vLLM side: server process, launcher, fork server, installed-vLLM probe, devices, load
generation, /metrics counters and the runner."""
