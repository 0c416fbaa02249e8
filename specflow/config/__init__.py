"""Hydra composition of conf/ and the translation of every failure into problem lines."""
