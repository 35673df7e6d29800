"""Claims ledger: sympy/numpy verdicts on every claim of arXiv 2604.13088."""
