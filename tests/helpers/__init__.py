"""Test-only helpers shared across test packages (not product code)."""
