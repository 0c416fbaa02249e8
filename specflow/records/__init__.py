"""What a measured window produced (`measurement`: its key, per-request statistics and the
window's record) and the atomic file writes every record goes through (`fsio`).

Imports no other specflow package.
"""
