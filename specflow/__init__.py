"""specflow."""
