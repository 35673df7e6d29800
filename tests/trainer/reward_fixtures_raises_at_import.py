"""A user reward module whose import raises: the run must name the module and what it raised."""

raise RuntimeError("this module refuses to be imported")


def one(prompt, completion, answer):
    return 1.0
