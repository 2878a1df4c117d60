"""NumPy / pure-Python twins of the Cython modules: the executable specification.

Each module here mirrors one fast module (cq ↔ _cq, ops ↔ _ops, model ↔ model's
Cython path, bpe ↔ _bpe, grammar ↔ _grammar) and is what tests diff against.
"""
