"""Test support code shared by several test folders (importable as `_helpers`)."""
