"""Helpers for testing and measuring the backend: reference models and synthetic data
(:mod:`torch_neuronx.testing.models`)."""
