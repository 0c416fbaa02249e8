"""The tiny local models of the CPU demo and the tests (built locally, never downloaded)."""
