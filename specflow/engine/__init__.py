"""The vLLM side: server process, launcher, installed-vLLM probe, devices, load generation,
/metrics counters and the runner."""
