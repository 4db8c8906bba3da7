"""Provenance (pure hashing), the MLflow store, and audit."""
