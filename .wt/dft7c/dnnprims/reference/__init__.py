"""NumPy reference implementations: simple, obviously correct, vectorised.

They are what NumPy inputs run, and the oracle every GPU kernel is tested
against.  Each function computes in the storage dtype's accumulation type
(float32 for float16/bfloat16) and returns the storage dtype.
"""
