"""The Pallas (Triton dialect) language backend: static check in the parent, runner in the worker."""
