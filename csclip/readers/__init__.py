"""Readers for existing unit data."""
