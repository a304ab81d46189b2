"""Compact torch forwards of the target family and their shared layers."""
