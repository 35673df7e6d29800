"""A user reward module that calls sys.exit(0) when it is imported: the run must name the module, not print 'SystemExit: 0'."""

import sys

sys.exit(0)


def one(prompt, completion, answer):
    return 1.0
