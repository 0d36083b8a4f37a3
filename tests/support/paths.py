"""Paths the tests share: the repository root, wherever in ``tests/`` a test file sits."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository root (``tests/support/paths.py`` is two folders below it)."""
