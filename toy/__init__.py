"""Toy lab: tabular softmax policies where learning tax and drift are measured exactly."""
